"""The optimizer: pytorch/examples' SGD or torchvision's ``--opt`` choices, its weight-decay
groups (torchvision's ``references/classification/utils.py`` ``set_weight_decay``) and its
per-step LR schedule in closed form: torchvision's ``train.py`` (StepLR, CosineAnnealingLR,
LinearLR/ConstantLR warm-up) and FFCV's triangle (ffcv-imagenet ``get_cyclic_lr``)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

SCHEDULERS = ("step", "cosine", "linear")  # --lr-scheduler values, aliases resolved
# the layers --norm-weight-decay covers (torchvision utils.set_weight_decay)
NORM_CLASSES = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm,
                nn.modules.instancenorm._InstanceNorm, nn.LocalResponseNorm)
# --transformer-embedding-decay's names, as torchvision's (ViT's pos_embedding keeps --wd)
EMBEDDING_KEYS = ("class_token", "position_embedding", "relative_position_bias_table")
OPTIMIZERS = ("sgd", "sgd_nesterov", "rmsprop", "adamw")  # torchvision train.py's, lower-cased


def param_groups(model: nn.Module, weight_decay: float, norm_weight_decay: float | None = None,
                 bias_weight_decay: float | None = None,
                 embedding_decay: float | None = None) -> list:
    """Parameter groups as torchvision's ``utils.set_weight_decay``: one group (as
    pytorch/examples' checkpoints hold) when the optional decays are None; else groups for
    :data:`NORM_CLASSES` layers, ``bias`` and :data:`EMBEDDING_KEYS` names (these win over norm)
    and the rest. Empty groups and frozen parameters are left out."""
    if norm_weight_decay is None and bias_weight_decay is None and embedding_decay is None:
        return list(model.parameters())
    custom = {} if bias_weight_decay is None else {"bias": bias_weight_decay}
    if embedding_decay is not None:
        custom.update({key: embedding_decay for key in EMBEDDING_KEYS})
    groups = {"other": [], "norm": [], **{key: [] for key in custom}}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad:
                continue
            if name in custom:
                groups[name].append(param)
            elif norm_weight_decay is not None and isinstance(module, NORM_CLASSES):
                groups["norm"].append(param)
            else:
                groups["other"].append(param)
    decay = {"other": weight_decay, "norm": norm_weight_decay, **custom}
    return [{"params": params, "weight_decay": decay[key]}
            for key, params in groups.items() if params]


@dataclass(frozen=True)
class DecayGroups:
    """The weight decays of norm layers, biases and embeddings (None: ``--wd``)."""

    norm: float | None = None
    bias: float | None = None
    embedding: float | None = None


def make_optimizer(model: nn.Module, lr: float, momentum: float, weight_decay: float,
                   device: torch.device, opt: str = "sgd",
                   decays: DecayGroups = DecayGroups()) -> torch.optim.Optimizer:
    """The ``--opt`` optimizer over :func:`param_groups`, as torchvision's ``train.py`` builds
    them (``rmsprop``: TF's EfficientNet/MobileNetV3 ``eps`` and ``alpha``; ``adamw``: Loshchilov
    & Hutter 2019). Raises ``ValueError`` for an unknown ``opt``. On CUDA, SGD and AdamW are
    fused: a float16 step never waits for GradScaler's inf flag (H100, ResNet-50: 4910 vs
    4380-4460 images/s)."""
    params = param_groups(model, weight_decay, decays.norm, decays.bias, decays.embedding)
    fused = device.type == "cuda" or None
    if opt in ("sgd", "sgd_nesterov"):
        optimizer = torch.optim.SGD(params, lr, momentum=momentum, weight_decay=weight_decay,
                                    nesterov=opt == "sgd_nesterov", fused=fused)
        fill_momentum_buffers(optimizer)
    elif opt == "rmsprop":
        optimizer = torch.optim.RMSprop(params, lr, momentum=momentum,
                                        weight_decay=weight_decay, eps=0.0316, alpha=0.9)
    elif opt == "adamw":
        optimizer = torch.optim.AdamW(params, lr, weight_decay=weight_decay, fused=fused)
    else:
        raise ValueError(f"--opt {opt!r}: expected one of {', '.join(OPTIMIZERS)}")
    return optimizer


def fill_momentum_buffers(optimizer: torch.optim.SGD) -> None:
    """Give fused SGD a zero momentum buffer for each parameter without one: fused SGD makes
    them with ``torch.empty_like`` and fills them in a kernel that returns at once when
    GradScaler finds inf gradients (a float16 run's usual first step), leaving a nan loss
    (torch 2.11-2.14). Zero is exact for dampening 0; a group with another dampening (a foreign
    checkpoint's) is left as it is: the unfused kernel is no way out (torch asserts on the
    scale GradScaler hands it)."""
    if not isinstance(optimizer, torch.optim.SGD):
        return
    for group in optimizer.param_groups:
        if not group.get("fused") or not group["momentum"] or group["dampening"]:
            continue
        for p in group["params"]:
            state = optimizer.state[p]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


@dataclass(frozen=True)
class LRSchedule:
    """The LR of every optimizer step in closed form, ``lr`` the peak: a warm-up of
    ``warmup_epochs`` at ``warmup_decay x lr`` or rising linearly to ``lr`` (torchvision's
    ``ConstantLR``/``LinearLR``), then ``step`` (StepLR: x ``gamma`` every ``step_size`` epochs),
    or ``cosine`` (CosineAnnealingLR, per step) or ``linear`` (FFCV's triangle after its peak)
    down to ``lr_min`` at the last step."""

    lr: float
    steps_per_epoch: int
    epochs: int
    kind: str = "step"
    step_size: int = 30
    gamma: float = 0.1
    warmup_epochs: float = 0.0
    warmup_method: str = "constant"
    warmup_decay: float = 0.01
    lr_min: float = 0.0

    @property
    def warmup_steps(self) -> int:
        return round(self.warmup_epochs * self.steps_per_epoch)

    def lr_at(self, step: int) -> float:
        """The LR (a float) of optimizer step ``step`` (0-based, counted over all epochs)."""
        warm = self.warmup_steps
        if step < warm:
            if self.warmup_method == "constant":
                return self.lr * self.warmup_decay
            return self.lr * (self.warmup_decay + (1.0 - self.warmup_decay) * step / warm)
        since = step - warm
        if self.kind == "step":
            return self.lr * self.gamma ** (since // (self.step_size * self.steps_per_epoch))
        span = max(1, self.epochs * self.steps_per_epoch - warm)
        done = min(1.0, since / span)
        if self.kind == "cosine":
            return self.lr_min + (self.lr - self.lr_min) * (1.0 + math.cos(math.pi * done)) / 2
        return self.lr + (self.lr_min - self.lr) * done

    def factor(self, step: int) -> float:
        """``lr_at(step) / lr``: the multiplier ``LambdaLR`` applies to its base LRs."""
        return self.lr_at(step) / self.lr if self.lr else 0.0


def make_scheduler(optimizer: torch.optim.Optimizer,
                   schedule: LRSchedule) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` over ``schedule``, stepped per optimizer step (:func:`position_scheduler`)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule.factor)


def position_scheduler(scheduler, optimizer, step: int) -> None:
    """Put ``scheduler`` and ``optimizer``'s LRs at ``step``: ``base_lr x lambda(step)`` for a
    ``LambdaLR``, ``base_lr x gamma ** (step // step_size)`` for pytorch/examples' ``StepLR``
    (``step`` in epochs)."""
    lambdas = getattr(scheduler, "lr_lambdas", None)
    scheduler.last_epoch = step
    for i, (group, base) in enumerate(zip(optimizer.param_groups, scheduler.base_lrs)):
        group["initial_lr"] = base
        factor = (lambdas[i](step) if lambdas
                  else scheduler.gamma ** (step // scheduler.step_size))
        group["lr"] = base * factor
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
