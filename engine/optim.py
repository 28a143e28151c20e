"""The optimizer, in one place: pytorch/examples' SGD or torchvision's ``--opt`` choices
(:func:`make_optimizer`), its parameter
groups (weight decay per parameter kind, :func:`param_groups`), its per-step LR schedule
(:class:`LRSchedule` in a ``LambdaLR``, placed at a step on resume by :func:`position_scheduler`)
and the momentum buffers fused SGD needs from the start (:func:`fill_momentum_buffers`).

The groups follow torchvision's ``references/classification/utils.py`` (``set_weight_decay``);
the schedules torchvision's ``train.py`` (StepLR, CosineAnnealingLR, LinearLR/ConstantLR
warm-up) and FFCV's triangle (libffcv/ffcv-imagenet ``train_imagenet.py``, ``get_cyclic_lr``),
computed per step in closed form (:mod:`engine.recipes` resolves the flags that choose them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

# The schedule kinds LRSchedule.lr_at computes (the --lr-scheduler values, aliases resolved)
SCHEDULERS = ("step", "cosine", "linear")
# torchvision utils.set_weight_decay: the layers whose parameters --norm-weight-decay covers
NORM_CLASSES = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm,
                nn.modules.instancenorm._InstanceNorm, nn.LocalResponseNorm)
# torchvision train.py: the parameter names --transformer-embedding-decay covers (ViT's
# class_token, Swin's relative_position_bias_table; "position_embedding" names no torchvision
# parameter: ViT's is encoder.pos_embedding, which keeps --wd there too)
EMBEDDING_KEYS = ("class_token", "position_embedding", "relative_position_bias_table")
# --opt values (torchvision train.py's, lower-cased as it reads them)
OPTIMIZERS = ("sgd", "sgd_nesterov", "rmsprop", "adamw")


def param_groups(model: nn.Module, weight_decay: float, norm_weight_decay: float | None = None,
                 bias_weight_decay: float | None = None,
                 embedding_decay: float | None = None) -> list:
    """Parameter groups as torchvision's ``utils.set_weight_decay``: with none of
    ``norm_weight_decay``, ``bias_weight_decay``, ``embedding_decay`` all parameters in one
    group (pytorch/examples, and what one-group checkpoints hold); otherwise ``weight_decay`` for
    the rest, ``norm_weight_decay`` for the parameters of :data:`NORM_CLASSES` layers (BatchNorm
    weight and bias), ``bias_weight_decay`` for parameters named ``bias`` and
    ``embedding_decay`` (``--transformer-embedding-decay``) for those named one of
    :data:`EMBEDDING_KEYS`, each in its own group (custom keys win over the norm group, as in
    torchvision). Empty groups are left out; frozen parameters too."""
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
    """Weight decay of parameter kinds apart from ``--wd`` (:func:`param_groups`): ``norm``
    (``--norm-weight-decay``), ``bias`` (``--bias-weight-decay``), ``embedding``
    (``--transformer-embedding-decay``); None: ``--wd``."""

    norm: float | None = None
    bias: float | None = None
    embedding: float | None = None


def make_optimizer(model: nn.Module, lr: float, momentum: float, weight_decay: float,
                   device: torch.device, opt: str = "sgd",
                   decays: DecayGroups = DecayGroups()) -> torch.optim.Optimizer:
    """The ``--opt`` optimizer over :func:`param_groups`: ``sgd``, pytorch/examples' SGD
    (``--lr``, ``--momentum``, ``--wd``; one group unless ``decays`` split them); and as
    torchvision's ``train.py`` builds them, ``sgd_nesterov`` (SGD with Nesterov momentum),
    ``rmsprop`` (RMSprop with ``--momentum``, ``eps=0.0316``, ``alpha=0.9``, TF's
    EfficientNet/MobileNetV3 values) and ``adamw`` (AdamW, Loshchilov & Hutter 2019, torch's
    default betas and eps).

    On CUDA SGD and AdamW use their fused implementations: one kernel for all parameters, and
    they take GradScaler's inverse scale and inf flag on the GPU, so a float16 ``--amp`` step
    never waits for the GPU (``found_inf.item()``); on an H100 (ResNet-50, float16, -b 256)
    fused SGD ran 4910 against the foreach implementation's 4380-4460 images/s, side by side.
    SGD's momentum buffers start at zero (:func:`fill_momentum_buffers`). Raises ``ValueError``
    for an unknown ``opt``."""
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
    """Give fused SGD a zero momentum buffer for each parameter that has none (a new
    optimizer, or a checkpoint saved before its first step).

    Fused SGD makes its buffers with ``torch.empty_like`` on its first step and fills them in
    the kernel, which returns at once when GradScaler found inf gradients: a float16 run's
    usual first step. The uninitialised buffers then entered the next step, and ResNet-50's
    loss was nan in every float16 run of ``make gpu-check`` on an H100 (torch 2.11; also on
    the CPU with torch 2.14). A zero buffer gives the first step's own result exactly
    (``momentum x 0 + (1 - dampening) x grad`` is the gradient for dampening 0). A group with
    another dampening (only from a foreign checkpoint: ours and pytorch/examples' have 0) is
    left as torch makes it: a zero buffer would scale its first step, and leaving the fused
    kernel is no way out, as GradScaler then hands an unscaled step its scale and torch asserts."""
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
    """The learning rate of every optimizer step, in closed form (:meth:`lr_at`).

    ``lr``: the peak LR; ``steps_per_epoch``: optimizer steps per epoch (``len(train_loader)``);
    ``epochs``: the run's length. Warm-up (torchvision's ``LinearLR``/``ConstantLR`` before its
    ``SequentialLR`` milestone): the first ``round(warmup_epochs x steps_per_epoch)`` steps run
    at ``warmup_decay x lr`` (``constant``) or rise linearly from it to ``lr`` (``linear``). Then
    ``kind``: ``step`` multiplies by ``gamma`` every ``step_size`` epochs after the warm-up
    (StepLR: with no warm-up, pytorch/examples' x0.1 every 30 epochs); ``cosine`` falls from
    ``lr`` to ``lr_min`` along half a cosine by the last step (CosineAnnealingLR, here per step);
    ``linear`` falls linearly from ``lr`` to ``lr_min`` (FFCV's triangle after its peak)."""

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
    """``LambdaLR`` over ``schedule``, to be stepped after every optimizer step. Its state is
    the step count (``last_epoch``) and base LRs; checkpoints restore it with
    :func:`position_scheduler` at ``epoch x steps_per_epoch + batch``."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule.factor)


def position_scheduler(scheduler, optimizer, step: int) -> None:
    """Put ``scheduler`` (and the LRs of ``optimizer``) at ``step``: ``base_lr x lambda(step)``
    for a ``LambdaLR`` (this run's per-step schedule, :func:`make_scheduler`), or
    pytorch/examples' ``base_lr x gamma ** (step // step_size)`` for a ``StepLR`` (``step`` in
    epochs). The schedule is a closed form of the step, so this is the whole of its state."""
    lambdas = getattr(scheduler, "lr_lambdas", None)
    scheduler.last_epoch = step
    for i, (group, base) in enumerate(zip(optimizer.param_groups, scheduler.base_lrs)):
        group["initial_lr"] = base
        factor = (lambdas[i](step) if lambdas
                  else scheduler.gamma ** (step // scheduler.step_size))
        group["lr"] = base * factor
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
