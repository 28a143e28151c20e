"""``main.py``'s command line: every flag (as torchvision's ``train.py`` and pytorch/examples
name them), its types, the checks argparse cannot make and ``-c`` presets. A bad type or choice
is argparse's one line (exit status 2), presets' too; :func:`check_args` raises a one-line
:class:`~engine.ConfigError` (exit status 1)."""
from __future__ import annotations

import argparse
import sys

import loaders
from decode.acceptance import MAX_PIXELS
from engine import ConfigError
from engine.recipe.optim import OPTIMIZERS, SCHEDULERS
from engine.presets import preset_tokens
from engine.recipe.resolution import FFCV_RES_STEP, resolution_schedule
from loaders.transforms.auto_augment import INTERPOLATIONS, POLICIES
from models import check_arch, resolve_weights

SCHEDULER_ALIASES = {"steplr": "step", "cosineannealinglr": "cosine"}  # torchvision's names


def positive_int(value) -> int:
    """An argparse type: an int >= 1 (batch sizes, pixel sizes, batch caps)."""
    return _int_at_least(value, 1, "a positive number")


def non_negative_int(value) -> int:
    """An argparse type: an int >= 0 (epochs, step counts; 0 turns a feature off)."""
    return _int_at_least(value, 0, "0 or a positive number")


def _int_at_least(value, least: int, what: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = least - 1
    if number < least:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}")
    return number


def seconds(value) -> float:
    """An argparse type: a finite number of seconds >= 0 (waits, delays)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if not 0 <= number < float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds (0 or more), got {value!r}")
    return number


def workers_type(value) -> int | str:
    """``-j`` value: a non-negative int or ``auto``."""
    if value == "auto" or (isinstance(value, int) and value >= 0):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise argparse.ArgumentTypeError(f"expected a number of workers or 'auto', got {value!r}")


def scheduler_name(value: str) -> str:
    """``--lr-scheduler`` value: ours, or torchvision's ``steplr``/``cosineannealinglr``."""
    value = value.lower()
    return SCHEDULER_ALIASES.get(value, value)


def get_args_parser() -> argparse.ArgumentParser:
    """The command line, grouped as data and loaders / model / optimisation / training recipe /
    augmentation / resolution / distributed / output (torchvision's name for its builder)."""
    p = argparse.ArgumentParser(description="PyTorch ImageNet training with fast data loading",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = p.add_argument_group("data and loaders")
    d.add_argument("data", metavar="DIR", nargs="?", help="dataset root holding train/ and val/")
    d.add_argument("--data-path", metavar="DIR", help="the same as DIR (torchvision's name)")
    d.add_argument("--train", metavar="PATH", help="training split root (instead of DIR/train)")
    d.add_argument("--val", metavar="PATH", help="validation split root (instead of DIR/val)")
    d.add_argument("--loader", default="folder", choices=sorted(loaders.BACKENDS),
                   help="data backend")
    d.add_argument("--lmdb", action="store_true", help="splits are LMDBs from folder2lmdb.py")
    d.add_argument("--dummy", action="store_true", help="synthetic data (no dataset needed)")
    d.add_argument("--dali", action="store_true",
                   help="NVIDIA DALI loader (GPU JPEG decode; CPU-only without CUDA)")
    d.add_argument("--dali-cpu", action="store_true", help="with --dali: decode on the CPU")
    d.add_argument("--dali-hw-decoder-load", type=float, metavar="F",
                   help="with --dali: share of JPEGs for the A100/H100 hardware decoder "
                   "(default: DALI's recommendation for the GPU found)")
    d.add_argument("--decode-device", default="cpu", choices=["cpu", "cuda", "cpu-nvimgcodec"],
                   help="cpu: the loader workers decode; cuda: they only read and draw crops, "
                   "the training process decodes each batch on the GPU (nvImageCodec); "
                   "cpu-nvimgcodec: that pipeline on nvImageCodec's CPU backend")
    d.add_argument("--hw-decoder-load", type=float, metavar="F",
                   help="with --decode-device cuda: share of each batch for the GPU's hardware "
                   "JPEG decoder (default 0.65, DALI's)")
    d.add_argument("--allow-cpu-decode", action="store_true",
                   help="with --decode-device cuda: start even where no GPU decoder decodes "
                   "(libnvjpeg missing), every window then decoded on the CPU")
    d.add_argument("-j", "--workers", type=workers_type, default="auto", metavar="N",
                   help="data loading worker processes per training process, or 'auto' "
                   "(the CPU cores this process may use, shared by the node's processes)")
    d.add_argument("--train-crop-size", type=positive_int, default=224, help="RandomResizedCrop size (px)")
    d.add_argument("--val-resize-size", type=positive_int, default=256, help="val shorter-side resize (px)")
    d.add_argument("--val-crop-size", type=positive_int, default=224, help="val CenterCrop size (px)")
    d.add_argument("--train-batches", type=positive_int, metavar="N", help="cap on training batches per epoch")
    d.add_argument("--val-batches", type=positive_int, metavar="N", help="cap on validation batches")
    d.add_argument("--max-bad-share", type=float, default=0.01, metavar="F",
                   help="undecodable samples are reported once, never drawn again and "
                   "replaced; stop when more than this share of a split's samples fail")
    d.add_argument("--max-image-pixels", type=non_negative_int, metavar="N",
                   default=MAX_PIXELS, help="skip, undecoded, an image "
                   "whose header claims more pixels, as the converters do (0: no limit)")
    d.add_argument("--shard-retries", type=non_negative_int, default=2, metavar="N",
                   help="streamed shards (HTTP, pipe:): a failed open or read is tried again "
                   "N times, reopened where it stopped, before the run stops (3 tries over "
                   "30 s)")
    d.add_argument("--shard-retry-delay", type=seconds, default=10.0, metavar="S",
                   help="seconds before a stream's first retry, doubled for each next one")
    d.add_argument("--lmdb-order", default="random", choices=["random", "block"],
                   help="with --lmdb: training read order; 'block' shuffles blocks of "
                   "consecutive records (mostly sequential I/O, for LMDBs larger than RAM)")
    d.add_argument("--lmdb-block-size", type=positive_int, default=256, metavar="N",
                   help="with --lmdb-order block: records per block (256 ~ 28 MB of ImageNet)")
    d.add_argument("--lmdb-buffer-blocks", type=positive_int, default=8, metavar="K",
                   help="with --lmdb-order block: blocks read at once, shuffled together")
    d.add_argument("--lmdb-readahead", default="auto", choices=["auto", "on", "off"],
                   help="with --lmdb: OS readahead; auto = on when the LMDB fits in half "
                   "the available memory (faster random reads), off otherwise (block order "
                   "wants on)")
    m = p.add_argument_group("model")
    m.add_argument("-a", "--arch", "--model", default="resnet18",
                   help="torchvision classification model")
    m.add_argument("--pretrained", action="store_true",
                   help="start from torchvision's ImageNet weights (must already be on disk)")
    m.add_argument("--weights", metavar="NAME",
                   help="start from these torchvision weights (e.g. IMAGENET1K_V2; on disk); "
                   "with -e/--test-only, validate with their preprocessing")
    m.add_argument("--sync-bn", action="store_true",
                   help="SyncBatchNorm across the processes of a distributed GPU run")
    m.add_argument("--use-deterministic-algorithms", action="store_true",
                   help="torch's deterministic kernels only, cuDNN autotuning off")
    m.add_argument("--amp", action="store_true", help="automatic mixed precision")
    m.add_argument("--amp-dtype", default="float16", choices=["float16", "bfloat16"],
                   help="with --amp on CUDA: autocast dtype (bfloat16 needs no GradScaler; "
                   "CPU autocast is always bfloat16)")
    m.add_argument("--compile", action="store_true",
                   help="torch.compile the model (slow first steps, faster after)")
    m.add_argument("--channels-last", action="store_true", help="channels-last memory format")
    m.add_argument("--blurpool", action="store_true",
                   help="FFCV's BlurPool: blur before strided convs of >= 16 channels")
    o = p.add_argument_group("optimisation")
    o.add_argument("--epochs", type=non_negative_int, default=90, help="total epochs to run")
    o.add_argument("--start-epoch", type=non_negative_int, default=0, help="first epoch (useful on restarts)")
    o.add_argument("-b", "--batch-size", type=positive_int, default=256,
                   help="images per step on this process")
    o.add_argument("--lr", "--learning-rate", type=float, default=0.1, dest="lr",
                   help="initial (peak) learning rate; x0.1 every 30 epochs by default")
    o.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    o.add_argument("--wd", "--weight-decay", type=float, default=1e-4, dest="weight_decay",
                   help="weight decay")
    o.add_argument("--seed", type=int, help="seed for shuffling, augmentation and init "
                   "(default: drawn at random and logged)")
    r = p.add_argument_group("training recipe")
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
    a = p.add_argument_group("augmentation (torchvision's recipes)")
    a.add_argument("--auto-augment", choices=POLICIES, metavar="POLICY",
                   help="augment each training crop with a policy: ta_wide (TrivialAugment "
                   "Wide), ra (RandAugment), augmix, or AutoAugment's imagenet, cifar10, svhn")
    a.add_argument("--ra-magnitude", type=int, default=9, metavar="M",
                   help="--auto-augment ra: the magnitude bin (0-30)")
    a.add_argument("--augmix-severity", type=int, default=3, metavar="S",
                   help="--auto-augment augmix: severity (1-10)")
    a.add_argument("--random-erase", type=float, default=0.0, metavar="P",
                   help="erase a random box of each training image with probability P "
                   "(torchvision's RandomErasing), on the device batch")
    a.add_argument("--ra-sampler", action="store_true",
                   help="repeated augmentation: torchvision's RASampler order (distributed runs "
                   "only, as torchvision)")
    a.add_argument("--ra-reps", type=int, default=3, metavar="N",
                   help="--ra-sampler: copies of each image per epoch order")
    a.add_argument("--interpolation", default="bilinear", choices=INTERPOLATIONS,
                   help="resampling of every resize and of the policies' geometric ops")
    res = p.add_argument_group("resolution (progressive resizing, test time)")
    res.add_argument("--min-res", type=int, metavar="PX",
                   help="progressive resizing: training crop side up to --start-ramp "
                   "(default: --train-crop-size, which it replaces)")
    res.add_argument("--max-res", type=int, metavar="PX",
                   help="progressive resizing: training crop side from --end-ramp on "
                   "(default: --min-res)")
    res.add_argument("--start-ramp", type=float, default=0, metavar="E",
                   help="last epoch (0-based) at --min-res")
    res.add_argument("--end-ramp", type=float, metavar="E",
                   help="first epoch at --max-res; in between the side rises linearly")
    res.add_argument("--res-step", type=int, default=FFCV_RES_STEP, metavar="PX",
                   help="sizes between --min-res and --max-res are multiples of this")
    res.add_argument("--val-flip-tta", action="store_true",
                   help="validation logits averaged with the mirrored image's "
                   "(FFCV's lr_tta)")
    g = p.add_argument_group("distributed")
    g.add_argument("--world-size", type=int, default=-1,
                   help="nodes with --multiprocessing-distributed, else processes")
    g.add_argument("--rank", type=int, default=-1,
                   help="node rank with --multiprocessing-distributed, else global rank")
    g.add_argument("--dist-url", help="rendezvous URL, e.g. tcp://10.1.1.20:23456 (default: "
                   "env:// under torchrun, a free localhost port on one node)")
    g.add_argument("--dist-backend", choices=["nccl", "gloo"],
                   help="torch.distributed backend (default: nccl with CUDA, gloo without)")
    g.add_argument("--dist-timeout", type=float, default=600.0,
                   help="seconds a collective may wait for a missing peer before failing")
    g.add_argument("--multiprocessing-distributed", action="store_true",
                   help="spawn --nproc-per-node processes on this node, DistributedDataParallel")
    g.add_argument("--nproc-per-node", type=positive_int,
                   help="processes per node (default: the GPU count, 1 without GPUs)")
    g.add_argument("--gpu", type=int, help="GPU index to use")
    g.add_argument("--no-accel", action="store_true", help="do not use an accelerator (CPU)")
    w = p.add_argument_group("output")
    w.add_argument("-c", "--config", metavar="FILE", help="YAML preset (see configs/)")
    w.add_argument("--output-dir", default=".", help="checkpoints, metrics.jsonl, TensorBoard logs")
    w.add_argument("-p", "--print-freq", type=non_negative_int, default=10, help="log every N steps")
    w.add_argument("--resume", default="", metavar="PATH",
                   help="checkpoint to resume from, or 'auto': the newest complete one in "
                   "--output-dir, a fresh start if none (one job script for every restart)")
    w.add_argument("--requeue", action="store_true",
                   help="in a SLURM job: after the checkpoint that SIGUSR1/SIGTERM causes (every "
                   "rank finishes its step, rank 0 saves that position, exit status 75), "
                   "`scontrol requeue` the job (docs/slurm.md)")
    w.add_argument("--save-every", type=non_negative_int, default=0, metavar="N",
                   help="also checkpoint every N training steps, with the loader position "
                   "(--resume continues with the next batch); 0: at epoch ends only")
    w.add_argument("-e", "--evaluate", "--test-only", action="store_true",
                   help="evaluate on val and exit")
    w.add_argument("--benchmark-data", action="store_true",
                   help="time the training loader alone (no model) for --train-batches batches "
                   "after --benchmark-warmup; print a JSON line")
    w.add_argument("--benchmark-warmup", type=non_negative_int, default=5, metavar="N",
                   help="untimed batches before --benchmark-data starts the clock, and steps "
                   "of each epoch left out of its steady_images_per_sec")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """Parse ``argv`` (default ``sys.argv[1:]``) with defaults < ``-c`` preset < command line
    (the preset's tokens go first, so argparse checks them). Raises :class:`ConfigError` for a
    bad preset; argparse exits with status 2 for a bad flag."""
    argv = sys.argv[1:] if argv is None else list(argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("-c", "--config")
    known, _ = pre.parse_known_args(argv)
    parser = get_args_parser()
    tokens = []
    if known.config:
        tokens, positionals = preset_tokens(known.config, get_args_parser)
        parser.set_defaults(**positionals)
    return parser.parse_args(tokens + argv)


def check_args(args: argparse.Namespace) -> None:
    """Refuse flag values that cannot work (unknown ``-a``/``--weights``, values out of range,
    bad crop sizes or ramps) before any data or device is touched. Raises :class:`ConfigError`
    (or :class:`~models.ModelError`) for the first problem."""
    check_arch(args.arch)
    if args.weights:
        resolve_weights(args.arch, args.weights)
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
        (not 0 <= args.ra_magnitude <= 30, f"--ra-magnitude {args.ra_magnitude}: expected 0-30 "
         "(a bin of RandAugment's 31)"),
        (not 1 <= args.augmix_severity <= 10,
         f"--augmix-severity {args.augmix_severity}: expected 1-10"),
        (not 0 <= args.random_erase <= 1, f"--random-erase {args.random_erase}: expected "
         "0 <= P <= 1"),
        (args.ra_reps < 1, f"--ra-reps {args.ra_reps}: expected N >= 1"),
    ]
    for bad, message in problems:
        if bad:
            raise ConfigError(message)
    resolution_schedule(args)
