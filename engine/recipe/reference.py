"""Training recipes of torchvision's ``references/classification/train.py``: MixUp/CutMix on
the device batch, the model EMA, and the recipe flags resolved once per process."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Callable

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

from engine.recipe.optim import DecayGroups, LRSchedule

FFCV_START_FACTOR = 1e-4  # ffcv-imagenet get_cyclic_lr rises from 1e-4 x lr to lr


def make_mix(mixup_alpha: float, cutmix_alpha: float, num_classes: int):
    """torchvision's ``get_mixup_cutmix``: ``v2.RandomChoice`` of ``v2.MixUp``/``v2.CutMix``
    (those with alpha > 0), or None. ``mix(images, labels)`` on a device batch (float ``(N, 3, H,
    W)``, int64 ``(N,)``) returns the mixed images (same dtype and memory format) and float32
    soft labels ``(N, num_classes)``; its draws come from torch's CPU generator."""
    from torchvision.transforms import v2

    choices = []
    if mixup_alpha > 0:
        choices.append(v2.MixUp(alpha=mixup_alpha, num_classes=num_classes))
    if cutmix_alpha > 0:
        choices.append(v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes))
    return v2.RandomChoice(choices) if choices else None


def ema_decay(decay: float, ema_steps: int, global_batch: int, epochs: int) -> float:
    """torchvision train.py's decay adjustment (from pycls), which keeps the EMA's horizon in
    images apart from batch, GPUs and update interval."""
    alpha = min(1.0, (1.0 - decay) * global_batch * ema_steps / epochs)
    return 1.0 - alpha


class ModelEMA(AveragedModel):
    """torchvision's ``ExponentialMovingAverage`` (``utils.py``, same state_dict):
    ``ema = decay x ema + (1 - decay) x model`` over parameters and buffers every ``every``
    steps, a copy at first and during the first ``copy_epochs`` (the LR warm-up); integer
    buffers are copied. ``n_averaged`` stays on the CPU: reading it never waits for the GPU."""

    def __init__(self, model: nn.Module, decay: float, every: int = 1, copy_epochs: float = 0):
        super().__init__(model, use_buffers=True)
        self.decay, self.every, self.copy_epochs = decay, every, copy_epochs

    @torch.no_grad()
    def update_parameters(self, model: nn.Module) -> None:
        """Average the bare ``model``'s parameters and buffers in."""
        ema = [*self.module.parameters(), *self.module.buffers()]
        new = [t.detach() for t in (*model.parameters(), *model.buffers())]
        first = int(self.n_averaged) == 0
        floats = [i for i, t in enumerate(ema) if t.is_floating_point() and not first]
        if floats:
            torch._foreach_lerp_([ema[i] for i in floats], [new[i] for i in floats],
                                 1.0 - self.decay)
        for mine, theirs in zip(ema, new, strict=True):
            if first or not mine.is_floating_point():
                mine.copy_(theirs)
        self.n_averaged += 1

    def after_step(self, model: nn.Module, epoch: int, step: int) -> None:
        """The EMA's part of training step ``step`` of ``epoch``."""
        if step % self.every:
            return
        self.update_parameters(model)
        if epoch < self.copy_epochs:
            self.n_averaged.fill_(0)


@dataclass(frozen=True)
class RecipeSettings:
    """The optimisation and training-recipe flags as given, by argparse name."""

    epochs: int
    start_epoch: int
    lr: float
    momentum: float
    weight_decay: float
    lr_scheduler: str
    lr_step_size: int
    lr_gamma: float
    lr_min: float
    lr_warmup_epochs: float
    lr_warmup_method: str
    lr_warmup_decay: float
    lr_peak_epoch: float | None
    lr_scale_batch: int | None
    label_smoothing: float
    norm_weight_decay: float | None
    bias_weight_decay: float | None
    mixup_alpha: float
    cutmix_alpha: float
    model_ema: bool
    model_ema_steps: int
    model_ema_decay: float
    opt: str = "sgd"
    clip_grad_norm: float | None = None
    transformer_embedding_decay: float | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "RecipeSettings":
        """The fields' values from the parsed command line."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class Recipe:
    """The recipe flags resolved for one process: ``lr`` (scaled by ``--lr-scale-batch``), the
    per-step ``schedule``, the weight ``decays`` and the EMA's ``ema_decay`` (None: no EMA)."""

    lr: float
    schedule: LRSchedule
    decays: DecayGroups = DecayGroups()
    ema_decay: float | None = None


def resolve_recipe(flags: RecipeSettings, global_batch: int, steps_per_epoch: int,
                   log: Callable | None = None) -> Recipe:
    """The :class:`Recipe` of ``flags`` for ``global_batch`` images per step; ``--lr-peak-epoch P``
    is ``--lr-warmup-epochs P --lr-warmup-method linear --lr-warmup-decay 1e-4``."""
    lr = flags.lr * global_batch / flags.lr_scale_batch if flags.lr_scale_batch else flags.lr
    if flags.lr_scale_batch and log:
        log(f"lr {lr:.6g}: --lr {flags.lr:g} x global batch / {flags.lr_scale_batch}")
    warmup = (flags.lr_warmup_epochs, flags.lr_warmup_method, flags.lr_warmup_decay)
    if flags.lr_peak_epoch is not None:
        warmup = (flags.lr_peak_epoch, "linear", FFCV_START_FACTOR)
    schedule = LRSchedule(lr, max(1, steps_per_epoch), max(1, flags.epochs), flags.lr_scheduler,
                          flags.lr_step_size, flags.lr_gamma, *warmup, flags.lr_min)
    decay = (ema_decay(flags.model_ema_decay, flags.model_ema_steps, global_batch,
                       max(1, flags.epochs)) if flags.model_ema else None)
    decays = DecayGroups(flags.norm_weight_decay, flags.bias_weight_decay,
                         flags.transformer_embedding_decay)
    return Recipe(lr, schedule, decays, decay)
