"""The train state: what a training step touches and a checkpoint saves (:class:`TrainState`),
the numerics it runs in (autocast, loss scaling, CUDA math modes), and how a run builds it from
its settings, restored from a checkpoint (:func:`build_state`; torchvision's
``references/classification/train.py`` does the same in its ``main``).
"""
from __future__ import annotations

import functools
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from engine import ConfigError
from engine.checkpoint import restore, restore_ema, with_ema_weights
from engine.distributed import wrap_parallel
from engine.optim import make_optimizer, make_scheduler
from engine.recipes import ModelEMA, make_mix, resolve_recipe
from engine.settings import RunSettings
from models import build_model


def autocast(amp: bool, amp_dtype: str, device: torch.device):
    """With ``--amp``: autocast to ``amp_dtype`` (``float16``/``bfloat16``) on CUDA, to
    bfloat16 on the CPU; without it a no-op context."""
    if not amp:
        return nullcontext()
    dtype = getattr(torch, amp_dtype) if device.type == "cuda" else torch.bfloat16
    return torch.autocast(device.type, dtype=dtype)


def needs_grad_scaler(amp: bool, amp_dtype: str, device: torch.device) -> bool:
    """Loss scaling is for float16 autocast on CUDA; bfloat16 has float32's exponent range."""
    return amp and amp_dtype == "float16" and device.type == "cuda"


def enable_fast_cuda_math(deterministic: bool = False) -> None:
    """cuDNN autotuning for the fixed input size (not with ``--use-deterministic-algorithms``,
    as torchvision's train.py), and TF32 tensor cores for float32 matrix multiplies as for
    convolutions (torch leaves matmuls in full FP32 by default; the classifier's Linear and
    everything outside autocast profit)."""
    torch.backends.cudnn.benchmark = not deterministic
    torch.set_float32_matmul_precision("high")


def use_deterministic_algorithms() -> None:
    """``--use-deterministic-algorithms``: torch's deterministic kernels only (an op without
    one raises), cuDNN autotuning off; cuBLAS's deterministic workspace
    (``CUBLAS_WORKSPACE_CONFIG=:4096:8``, which torch requires on CUDA) unless the user set
    one. Call before the first CUDA matrix multiply."""
    import os

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


@dataclass
class TrainState:
    """What a training step touches and a checkpoint saves. ``autocast``: a factory of the
    step's autocast context (see :func:`autocast`); ``scheduler`` is stepped after every
    optimizer step; ``mix``: MixUp/CutMix of the device batch or None
    (:func:`engine.recipes.make_mix`); ``ema``: the model's :class:`~engine.recipes.ModelEMA`
    or None; ``clip_grad_norm``: ``--clip-grad-norm`` (None: no clipping)."""

    model: nn.Module
    criterion: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    autocast: Callable
    mix: Callable | None = None
    ema: nn.Module | None = None
    clip_grad_norm: float | None = None


def build_state(s: RunSettings, train_loader, checkpoint: dict | None,
                log: Callable) -> tuple[TrainState, int, float]:
    """The :class:`TrainState` of settings ``s``, with ``(start_epoch, best_acc1)``: the model
    (restored from ``checkpoint``, wrapped for DDP, compiled), loss, SGD, the per-step LR
    schedule, scaler, MixUp/CutMix and EMA as the recipe flags say. Steps per epoch and the
    class count come from ``train_loader`` (``len()``, ``.classes``); ``log`` gets the lines
    worth one (scaled LR, what was resumed). Raises :class:`~engine.ConfigError` for a
    checkpoint that does not fit, :class:`~models.ModelError` for pretrained weights not on
    disk."""
    device, num_classes = s.dist.device, len(train_loader.classes)
    m, flags, evaluating = s.model, s.recipe, s.mode == "evaluate"
    recipe = resolve_recipe(flags, s.loader.batch_size * s.dist.world_size, len(train_loader))
    if flags.lr_scale_batch:
        log(f"lr {recipe.lr:.6g}: --lr {flags.lr:g} x global batch / {flags.lr_scale_batch}")
    model = build_model(m.arch, num_classes, m.pretrained, m.blurpool, m.weights).to(device)
    if m.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model = sync_batch_norm(model, m.sync_bn, s.dist, log)
    if device.type == "cuda":
        enable_fast_cuda_math(m.deterministic)
    optimizer = make_optimizer(model, recipe.lr, flags.momentum, flags.weight_decay, device,
                               recipe.norm_weight_decay, recipe.bias_weight_decay, flags.opt,
                               flags.transformer_embedding_decay)
    state = TrainState(
        model, nn.CrossEntropyLoss(label_smoothing=recipe.label_smoothing).to(device), optimizer,
        make_scheduler(optimizer, recipe.schedule),
        torch.amp.GradScaler("cuda", enabled=needs_grad_scaler(m.amp, m.amp_dtype, device)),
        functools.partial(autocast, m.amp, m.amp_dtype, device),
        make_mix(recipe.mixup_alpha, recipe.cutmix_alpha, num_classes),
        clip_grad_norm=flags.clip_grad_norm)
    start_epoch, best_acc1 = flags.start_epoch, 0.0
    if checkpoint and evaluating and flags.model_ema:
        checkpoint = with_ema_weights(checkpoint, s.resume, log)
    if checkpoint:
        start_epoch, best_acc1 = restore(  # ours, pytorch/examples' or a bare state_dict
            checkpoint, model, state.optimizer, state.scheduler, state.scaler, m.arch, s.dist,
            evaluate=evaluating, start_epoch=flags.start_epoch, path=s.resume, log=log,
            steps_per_epoch=len(train_loader))
    if recipe.ema_decay is not None and not evaluating:
        state.ema = ModelEMA(model, recipe.ema_decay, recipe.ema_steps,
                             recipe.schedule.warmup_epochs)
        restore_ema(checkpoint, state.ema, m.arch, s.resume, log)
    state.model = wrap_parallel(model, s.dist, m.gpu, log)
    if m.compile:
        state.model = torch.compile(state.model)
    return state, start_epoch, best_acc1


def sync_batch_norm(model: nn.Module, sync_bn: bool, dist, log: Callable) -> nn.Module:
    """``--sync-bn``: BatchNorm layers as ``nn.SyncBatchNorm`` (statistics over the whole global
    batch) in a distributed run, as torchvision's train.py (in one process it does nothing;
    said once). The parameters stay the same tensors, and checkpoints the same keys. Raises
    :class:`~engine.ConfigError` on the CPU, where torch's SyncBatchNorm does not run."""
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
