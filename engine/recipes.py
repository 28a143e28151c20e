"""Training recipes behind torchvision's flags (issue 17): the per-step LR schedule, weight
decay per parameter kind, label smoothing, MixUp/CutMix on the device and the model EMA.

Flag names, defaults and the EMA's decay adjustment follow torchvision's
``references/classification/train.py`` (and its ``utils.py``/``transforms.py``); the ``linear``
schedule with ``--lr-peak-epoch`` is FFCV's triangular ("cyclic") one from libffcv/ffcv-imagenet
``train_imagenet.py`` (``get_cyclic_lr``). :func:`check_recipe_flags` refuses bad values in one
line; :func:`resolve_recipe` turns the flags into a frozen :class:`Recipe` once per process.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

from engine import ConfigError

SCHEDULERS = ("step", "cosine", "linear")
# torchvision's own spellings of the same schedules (its --lr-scheduler values)
SCHEDULER_ALIASES = {"steplr": "step", "cosineannealinglr": "cosine"}
# ffcv-imagenet get_cyclic_lr: the LR starts at 1e-4 x lr and rises linearly to lr at the peak
FFCV_START_FACTOR = 1e-4
# torchvision utils.set_weight_decay: the layers whose parameters --norm-weight-decay covers
NORM_CLASSES = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm,
                nn.modules.instancenorm._InstanceNorm, nn.LocalResponseNorm)


def scheduler_name(value: str) -> str:
    """``--lr-scheduler`` value: ours, or torchvision's ``steplr``/``cosineannealinglr``."""
    value = value.lower()
    return SCHEDULER_ALIASES.get(value, value)


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
    :func:`engine.checkpoint.position_scheduler` at ``epoch x steps_per_epoch + batch``."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule.factor)


def param_groups(model: nn.Module, weight_decay: float, norm_weight_decay: float | None = None,
                 bias_weight_decay: float | None = None) -> list:
    """SGD parameter groups as torchvision's ``utils.set_weight_decay``: with neither
    ``norm_weight_decay`` nor ``bias_weight_decay`` all parameters in one group (pytorch/examples,
    and what older checkpoints hold); otherwise ``weight_decay`` for the rest, ``norm_weight_decay``
    for the parameters of :data:`NORM_CLASSES` layers (BatchNorm weight and bias) and
    ``bias_weight_decay`` for parameters named ``bias`` (it wins over the norm group, as in
    torchvision). Empty groups are left out; frozen parameters too."""
    if norm_weight_decay is None and bias_weight_decay is None:
        return list(model.parameters())
    groups = {"other": [], "norm": [], "bias": []}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad:
                continue
            if bias_weight_decay is not None and name == "bias":
                groups["bias"].append(param)
            elif norm_weight_decay is not None and isinstance(module, NORM_CLASSES):
                groups["norm"].append(param)
            else:
                groups["other"].append(param)
    decay = {"other": weight_decay, "norm": norm_weight_decay, "bias": bias_weight_decay}
    return [{"params": params, "weight_decay": decay[key]}
            for key, params in groups.items() if params]


def make_mix(mixup_alpha: float, cutmix_alpha: float, num_classes: int):
    """torchvision's ``get_mixup_cutmix``: ``v2.RandomChoice`` of ``v2.MixUp``/``v2.CutMix``
    (those with alpha > 0), or None. Called as ``mix(images, labels)`` on a device batch
    (float ``(N, 3, H, W)``, int64 ``(N,)``), it returns the mixed images (same dtype and memory
    format) and float32 soft labels ``(N, num_classes)`` whose rows sum to 1. Its draws come
    from torch's CPU generator, which checkpoints save per rank."""
    from torchvision.transforms import v2

    choices = []
    if mixup_alpha > 0:
        choices.append(v2.MixUp(alpha=mixup_alpha, num_classes=num_classes))
    if cutmix_alpha > 0:
        choices.append(v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes))
    return v2.RandomChoice(choices) if choices else None


def ema_decay(decay: float, ema_steps: int, global_batch: int, epochs: int) -> float:
    """torchvision train.py's decay adjustment (from pycls): ``adjust = world_size x batch_size
    x model_ema_steps / epochs``, ``alpha = min(1, (1 - decay) x adjust)``; returns ``1 - alpha``,
    so the EMA's horizon in images is independent of batch, GPUs and update interval."""
    alpha = min(1.0, (1.0 - decay) * global_batch * ema_steps / epochs)
    return 1.0 - alpha


class ModelEMA(AveragedModel):
    """torchvision's ``ExponentialMovingAverage`` (``utils.py``): an ``AveragedModel`` of the
    parameters and buffers, ``ema = decay x ema + (1 - decay) x model`` (as one ``lerp`` per
    tensor), the first update (``n_averaged == 0``) a copy. Its state_dict is torchvision's
    (``module.<name>`` keys and ``n_averaged``), saved under the checkpoint key ``model_ema``.

    :meth:`after_step` updates every ``every`` steps of an epoch (torchvision: ``i %
    model_ema_steps == 0``) and, during the first ``copy_epochs`` (the LR warm-up), resets
    ``n_averaged`` so the EMA keeps copying the model. ``n_averaged`` stays on the CPU so
    reading it never waits for the GPU; integer buffers (BatchNorm's batch counts) are copied."""

    def __init__(self, model: nn.Module, decay: float, every: int = 1, copy_epochs: float = 0):
        super().__init__(model, use_buffers=True)
        self.decay, self.every, self.copy_epochs = decay, every, copy_epochs

    @torch.no_grad()
    def update_parameters(self, model: nn.Module) -> None:
        """Average ``model``'s (bare: no DDP/compile wrapper) parameters and buffers in."""
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
        """The EMA's part of training step ``step`` (of the epoch) in epoch ``epoch``."""
        if step % self.every:
            return
        self.update_parameters(model)
        if epoch < self.copy_epochs:
            self.n_averaged.fill_(0)


def add_recipe_args(r) -> None:
    """Flags of the per-step LR schedule, weight decay groups, label smoothing, MixUp/CutMix and
    the model EMA (engine/recipes.py), as torchvision's train.py spells them."""
    r.add_argument("--lr-scheduler", type=scheduler_name, default="step", choices=SCHEDULERS,
                   help="LR schedule, set every step: step (x--lr-gamma every --lr-step-size "
                   "epochs), cosine or linear (to --lr-min); also torchvision's names")
    r.add_argument("--lr-step-size", type=int, default=30, metavar="N",
                   help="step: epochs between decays")
    r.add_argument("--lr-gamma", type=float, default=0.1, metavar="F", help="step: LR factor")
    r.add_argument("--lr-min", type=float, default=0.0, metavar="LR", help="cosine/linear: last LR")
    r.add_argument("--lr-warmup-epochs", type=float, default=0, metavar="N",
                   help="epochs of warm-up before the schedule (may be fractional)")
    r.add_argument("--lr-warmup-method", default="constant", choices=["constant", "linear"],
                   help="warm-up at --lr-warmup-decay x lr, or rising linearly from it to lr")
    r.add_argument("--lr-warmup-decay", type=float, default=0.01, metavar="F",
                   help="warm-up: start LR factor")
    r.add_argument("--lr-peak-epoch", type=float, metavar="E",
                   help="FFCV's triangle: LR rises linearly from 1e-4 x lr to lr at epoch E "
                   "(instead of --lr-warmup-*), then --lr-scheduler (FFCV: linear)")
    r.add_argument("--lr-scale-batch", type=int, metavar="N",
                   help="--lr is per N images: the LR used is lr x global batch / N")
    r.add_argument("--label-smoothing", type=float, default=0.0, metavar="F",
                   help="CrossEntropyLoss label smoothing")
    r.add_argument("--norm-weight-decay", type=float, metavar="F",
                   help="weight decay of norm layers' weights and biases; None: --wd")
    r.add_argument("--bias-weight-decay", type=float, metavar="F",
                   help="weight decay of all biases; None: --wd")
    r.add_argument("--mixup-alpha", type=float, default=0.0, metavar="F",
                   help="MixUp on the device batch with Beta(F, F) (0: off)")
    r.add_argument("--cutmix-alpha", type=float, default=0.0, metavar="F",
                   help="CutMix on the device batch (0: off); with both, one per batch")
    r.add_argument("--model-ema", action="store_true",
                   help="keep an exponential moving average of the weights, validate it each "
                   "epoch (val_ema_*), save it as model_ema; -e evaluates it")
    r.add_argument("--model-ema-steps", type=int, default=32, metavar="N",
                   help="steps between EMA updates")
    r.add_argument("--model-ema-decay", type=float, default=0.99998, metavar="F",
                   help="EMA decay, adjusted for global batch, steps and epochs as torchvision")


def check_recipe_flags(args: argparse.Namespace) -> None:
    """Refuse recipe flag values that cannot work, in one line. Raises :class:`ConfigError`."""
    problems = [
        (not 0 <= args.label_smoothing < 1, f"--label-smoothing {args.label_smoothing}: "
         "expected 0 <= F < 1"),
        (args.mixup_alpha < 0 or args.cutmix_alpha < 0,
         "--mixup-alpha/--cutmix-alpha must be >= 0"),
        (args.lr_warmup_epochs < 0, "--lr-warmup-epochs must be >= 0"),
        (args.lr_peak_epoch is not None and args.lr_warmup_epochs > 0,
         "--lr-peak-epoch is FFCV's warm-up: give it or --lr-warmup-epochs, not both"),
        (args.lr_peak_epoch is not None and not 0 < args.lr_peak_epoch <= args.epochs,
         f"--lr-peak-epoch {args.lr_peak_epoch}: expected 0 < E <= --epochs"),
        (args.lr_step_size < 1, "--lr-step-size must be >= 1"),
        (args.lr_scale_batch is not None and args.lr_scale_batch < 1,
         "--lr-scale-batch must be >= 1"),
        (args.model_ema_steps < 1, "--model-ema-steps must be >= 1"),
        (not 0 <= args.model_ema_decay < 1, "--model-ema-decay: expected 0 <= F < 1"),
    ]
    for bad, message in problems:
        if bad:
            raise ConfigError(message)


@dataclass(frozen=True)
class Recipe:
    """The recipe flags resolved for one process (:func:`resolve_recipe`): ``lr`` (``--lr``,
    times global batch / ``--lr-scale-batch`` if given), the per-step ``schedule``, and the
    EMA's adjusted ``ema_decay`` (None without ``--model-ema``)."""

    lr: float
    schedule: LRSchedule
    label_smoothing: float = 0.0
    norm_weight_decay: float | None = None
    bias_weight_decay: float | None = None
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    ema_decay: float | None = None
    ema_steps: int = 32


def resolve_recipe(args: argparse.Namespace, global_batch: int, steps_per_epoch: int) -> Recipe:
    """The :class:`Recipe` of ``args`` for ``global_batch`` images per optimizer step over all
    ranks and ``steps_per_epoch`` steps (``len(train_loader)``, exact). ``--lr-peak-epoch P``
    is FFCV's rise: ``--lr-warmup-epochs P --lr-warmup-method linear --lr-warmup-decay 1e-4``."""
    lr = args.lr * global_batch / args.lr_scale_batch if args.lr_scale_batch else args.lr
    warmup = (args.lr_warmup_epochs, args.lr_warmup_method, args.lr_warmup_decay)
    if args.lr_peak_epoch is not None:
        warmup = (args.lr_peak_epoch, "linear", FFCV_START_FACTOR)
    schedule = LRSchedule(lr, max(1, steps_per_epoch), max(1, args.epochs), args.lr_scheduler,
                          args.lr_step_size, args.lr_gamma, *warmup, args.lr_min)
    decay = (ema_decay(args.model_ema_decay, args.model_ema_steps, global_batch,
                       max(1, args.epochs)) if args.model_ema else None)
    return Recipe(lr, schedule, args.label_smoothing, args.norm_weight_decay,
                  args.bias_weight_decay, args.mixup_alpha, args.cutmix_alpha, decay,
                  args.model_ema_steps)
