"""The train state (what a training step touches and a checkpoint saves), its numerics
(autocast, loss scaling, CUDA math modes, threads) and the pieces ``main.run`` builds it from."""
from __future__ import annotations

import functools
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from engine import ConfigError
from engine.checkpoint import restore_ema
from engine.distributed.processes import wrap_parallel
from engine.recipe.optim import make_scheduler
from engine.recipe.reference import ModelEMA, Recipe, make_mix
from engine.settings import RunSettings
from models import build_model


def autocast(amp: bool, amp_dtype: str, device: torch.device):
    """With ``amp``, autocast to ``amp_dtype`` on CUDA, bfloat16 on the CPU; else a no-op."""
    if not amp:
        return nullcontext()
    dtype = getattr(torch, amp_dtype) if device.type == "cuda" else torch.bfloat16
    return torch.autocast(device.type, dtype=dtype)


def needs_grad_scaler(amp: bool, amp_dtype: str, device: torch.device) -> bool:
    """Loss scaling is for float16 autocast on CUDA; bfloat16 has float32's exponent range."""
    return amp and amp_dtype == "float16" and device.type == "cuda"


def enable_fast_cuda_math(deterministic: bool = False) -> None:
    """cuDNN autotuning unless ``deterministic`` (as torchvision's train.py), and TF32 for
    float32 matmuls as for convolutions (torch's default keeps them FP32)."""
    torch.backends.cudnn.benchmark = not deterministic
    torch.set_float32_matmul_precision("high")


def use_deterministic_algorithms() -> None:
    """Torch's deterministic kernels only, cuDNN autotuning off, ``CUBLAS_WORKSPACE_CONFIG``
    (torch requires it on CUDA) unless set. Call before the first CUDA matrix multiply."""
    import os

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def set_numerics(threads: int | None, deterministic: bool) -> None:
    """Set torch's intra-op ``threads`` (None: keep) and ``deterministic`` kernels."""
    if threads:
        torch.set_num_threads(threads)
    if deterministic:
        use_deterministic_algorithms()


@dataclass
class TrainState:
    """What a training step touches and a checkpoint saves; ``ema`` is set after the restore."""

    model: nn.Module
    criterion: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    autocast: Callable
    mix: Callable | None = None
    clip_grad_norm: float | None = None
    ema: nn.Module | None = field(default=None, init=False)


def make_model(s: RunSettings, num_classes: int, log: Callable) -> nn.Module:
    """``-a``'s model for ``num_classes`` classes on this device, as the model flags say. Raises
    :class:`~models.ModelError` or :class:`~engine.ConfigError` (``--sync-bn`` on the CPU)."""
    m, device = s.model, s.dist.device
    model = build_model(m.arch, num_classes, m.pretrained, m.blurpool, m.weights).to(device)
    if m.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model = sync_batch_norm(model, m.sync_bn, s.dist, log)
    if device.type == "cuda":
        enable_fast_cuda_math(m.deterministic)
    return model


def train_state(model: nn.Module, optimizer: torch.optim.Optimizer, s: RunSettings,
                recipe: Recipe, num_classes: int) -> TrainState:
    """The :class:`TrainState` around ``model`` and ``optimizer``."""
    m, flags, device = s.model, s.recipe, s.dist.device
    return TrainState(
        model, nn.CrossEntropyLoss(label_smoothing=flags.label_smoothing).to(device), optimizer,
        make_scheduler(optimizer, recipe.schedule),
        torch.amp.GradScaler("cuda", enabled=needs_grad_scaler(m.amp, m.amp_dtype, device)),
        functools.partial(autocast, m.amp, m.amp_dtype, device),
        make_mix(flags.mixup_alpha, flags.cutmix_alpha, num_classes), flags.clip_grad_norm)


def make_ema(model: nn.Module, s: RunSettings, recipe: Recipe, checkpoint: dict | None,
             log: Callable) -> ModelEMA | None:
    """With ``--model-ema`` in training, the EMA of ``model`` (restored, not wrapped), its
    checkpoint loaded; else None."""
    if recipe.ema_decay is None or s.mode != "train":
        return None
    ema = ModelEMA(model, recipe.ema_decay, s.recipe.model_ema_steps,
                   recipe.schedule.warmup_epochs)
    restore_ema(checkpoint, ema, s.model.arch, s.resume, log)
    return ema


def wrap_model(model: nn.Module, s: RunSettings, log: Callable) -> nn.Module:
    """``model`` in (Distributed)DataParallel, then ``torch.compile``d with ``--compile``."""
    model = wrap_parallel(model, s.dist, s.model.gpu, log)
    return torch.compile(model) if s.model.compile else model


def sync_batch_norm(model: nn.Module, sync_bn: bool, dist, log: Callable) -> nn.Module:
    """``--sync-bn``: BatchNorm as ``nn.SyncBatchNorm`` in a distributed run, as torchvision's
    train.py. Raises :class:`~engine.ConfigError` on the CPU, where it does not run."""
    if not sync_bn:
        return model
    if not dist.distributed:
        log("--sync-bn: one process, plain BatchNorm (torchvision's train.py syncs only when "
            "distributed)")
        return model
    if dist.device.type == "cpu":
        raise ConfigError("--sync-bn: torch's SyncBatchNorm runs on GPUs only; leave it out "
                          "on the CPU")
    return nn.SyncBatchNorm.convert_sync_batchnorm(model)
