"""Training recipes behind torchvision's flags (issues 17, 39): the flags of the per-step LR
schedule, weight decay per parameter kind, label smoothing, MixUp/CutMix on the device, the
model EMA, ``--opt`` and ``--clip-grad-norm``; MixUp/CutMix and the EMA themselves (the schedule and the groups are the optimizer's:
:mod:`engine.optim`).

Flag names, defaults and the EMA's decay adjustment follow torchvision's
``references/classification/train.py`` (and its ``utils.py``/``transforms.py``); the ``linear``
schedule with ``--lr-peak-epoch`` is FFCV's triangular ("cyclic") one from libffcv/ffcv-imagenet
``train_imagenet.py`` (``get_cyclic_lr``). :func:`check_recipe_flags` refuses bad values in one
line; :class:`RecipeSettings` holds the flags as given, and :func:`resolve_recipe` turns them
into a frozen :class:`Recipe` once per process.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

from engine import ConfigError
from engine.optim import OPTIMIZERS, SCHEDULERS, LRSchedule

# torchvision's own spellings of the same schedules (its --lr-scheduler values)
SCHEDULER_ALIASES = {"steplr": "step", "cosineannealinglr": "cosine"}
# ffcv-imagenet get_cyclic_lr: the LR starts at 1e-4 x lr and rises linearly to lr at the peak
FFCV_START_FACTOR = 1e-4


def scheduler_name(value: str) -> str:
    """``--lr-scheduler`` value: ours, or torchvision's ``steplr``/``cosineannealinglr``."""
    value = value.lower()
    return SCHEDULER_ALIASES.get(value, value)


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
    """Flags of the per-step LR schedule, weight decay groups, label smoothing, MixUp/CutMix,
    the model EMA, the optimizer (``--opt``) and gradient clipping (engine/recipes.py), as
    torchvision's train.py spells them."""
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
    r.add_argument("--opt", type=str.lower, default="sgd", choices=OPTIMIZERS,
                   help="optimizer (torchvision's choices): SGD, SGD with Nesterov momentum, "
                   "RMSprop (eps 0.0316, alpha 0.9), AdamW")
    r.add_argument("--clip-grad-norm", type=float, metavar="F",
                   help="clip the gradients' global L2 norm to F before each step (unscaled "
                   "first under --amp)")
    r.add_argument("--transformer-embedding-decay", type=float, metavar="F",
                   help="weight decay of class_token, position_embedding and "
                   "relative_position_bias_table parameters; None: --wd")


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
        (args.clip_grad_norm is not None and not args.clip_grad_norm > 0,
         f"--clip-grad-norm {args.clip_grad_norm}: expected F > 0"),
    ]
    for bad, message in problems:
        if bad:
            raise ConfigError(message)


@dataclass(frozen=True)
class RecipeSettings:
    """The optimisation and training-recipe flags as given, read once from the command line
    (:meth:`from_args`; each field is its flag's argparse name): ``epochs``, ``start_epoch``,
    SGD's ``lr``, ``momentum`` and ``weight_decay`` (``--wd``), and the flags of
    :func:`add_recipe_args`. :func:`resolve_recipe` turns them into a :class:`Recipe` once the
    global batch and the steps per epoch are known."""

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
        """The fields' values from the parsed command line (which is only read)."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


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


def resolve_recipe(flags: RecipeSettings, global_batch: int, steps_per_epoch: int) -> Recipe:
    """The :class:`Recipe` of ``flags`` for ``global_batch`` images per optimizer step over all
    ranks and ``steps_per_epoch`` steps (``len(train_loader)``, exact). ``--lr-peak-epoch P``
    is FFCV's rise: ``--lr-warmup-epochs P --lr-warmup-method linear --lr-warmup-decay 1e-4``."""
    lr = flags.lr * global_batch / flags.lr_scale_batch if flags.lr_scale_batch else flags.lr
    warmup = (flags.lr_warmup_epochs, flags.lr_warmup_method, flags.lr_warmup_decay)
    if flags.lr_peak_epoch is not None:
        warmup = (flags.lr_peak_epoch, "linear", FFCV_START_FACTOR)
    schedule = LRSchedule(lr, max(1, steps_per_epoch), max(1, flags.epochs), flags.lr_scheduler,
                          flags.lr_step_size, flags.lr_gamma, *warmup, flags.lr_min)
    decay = (ema_decay(flags.model_ema_decay, flags.model_ema_steps, global_batch,
                       max(1, flags.epochs)) if flags.model_ema else None)
    return Recipe(lr, schedule, flags.label_smoothing, flags.norm_weight_decay,
                  flags.bias_weight_decay, flags.mixup_alpha, flags.cutmix_alpha, decay,
                  flags.model_ema_steps)
