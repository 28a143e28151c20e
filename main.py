#!/usr/bin/env python
"""Train or evaluate a torchvision classifier on ImageNet from JPEG folders, LMDB or synthetic data.

Flags and checkpoint keys follow pytorch/examples ``imagenet/main.py``; ``main(argv)`` runs
in-process (tests call it), as torchvision's ``references/classification/train.py`` separates
``get_args_parser()`` from ``main(args)``. Settings resolve as defaults < ``-c`` YAML preset <
command line.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from contextlib import nullcontext

import torch
from torch import nn

import loaders
from loaders import DataError, DistInfo
from models import ModelError, build_model


class ConfigError(Exception):
    """Bad settings (preset, flags, output directory, checkpoint): one-line message."""


def get_args_parser() -> argparse.ArgumentParser:
    """The command line, grouped as data and loaders / model / optimisation / distributed / output."""
    p = argparse.ArgumentParser(description="PyTorch ImageNet training with fast data loading",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = p.add_argument_group("data and loaders")
    d.add_argument("data", metavar="DIR", nargs="?", help="dataset root holding train/ and val/")
    d.add_argument("--train", metavar="PATH", help="training split root (instead of DIR/train)")
    d.add_argument("--val", metavar="PATH", help="validation split root (instead of DIR/val)")
    d.add_argument("--loader", default="folder", choices=sorted(loaders.BACKENDS),
                   help="data backend")
    d.add_argument("--lmdb", action="store_true", help="splits are LMDBs from folder2lmdb.py")
    d.add_argument("--dummy", action="store_true", help="synthetic data (no dataset needed)")
    d.add_argument("--dali", action="store_true",
                   help="NVIDIA DALI loader (GPU JPEG decode; CPU-only without CUDA)")
    d.add_argument("--dali-cpu", action="store_true", help="with --dali: decode on the CPU")
    d.add_argument("--dali-hw-decoder-load", type=float, default=0.65,
                   help="with --dali: share of JPEGs for the A100/H100 hardware decoder")
    d.add_argument("-j", "--workers", type=workers_type, default="auto", metavar="N",
                   help="data loading worker processes per training process, or 'auto' "
                   "(min(8, CPU cores))")
    d.add_argument("--train-crop-size", type=int, default=224, help="RandomResizedCrop size (px)")
    d.add_argument("--val-resize-size", type=int, default=256, help="val shorter-side resize (px)")
    d.add_argument("--val-crop-size", type=int, default=224, help="val CenterCrop size (px)")
    d.add_argument("--train-batches", type=int, metavar="N", help="cap on training batches per epoch")
    d.add_argument("--val-batches", type=int, metavar="N", help="cap on validation batches")
    m = p.add_argument_group("model")
    m.add_argument("-a", "--arch", default="resnet18", help="torchvision classification model")
    m.add_argument("--pretrained", action="store_true",
                   help="start from torchvision's ImageNet weights (must already be on disk)")
    m.add_argument("--amp", action="store_true", help="automatic mixed precision")
    m.add_argument("--channels-last", action="store_true", help="channels-last memory format")
    o = p.add_argument_group("optimisation")
    o.add_argument("--epochs", type=int, default=90, help="total epochs to run")
    o.add_argument("--start-epoch", type=int, default=0, help="first epoch (useful on restarts)")
    o.add_argument("-b", "--batch-size", type=int, default=256,
                   help="images per step on this process")
    o.add_argument("--lr", "--learning-rate", type=float, default=0.1, dest="lr",
                   help="initial learning rate; x0.1 every 30 epochs")
    o.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    o.add_argument("--wd", "--weight-decay", type=float, default=1e-4, dest="weight_decay",
                   help="weight decay")
    o.add_argument("--seed", type=int, help="seed for shuffling, augmentation and init "
                   "(default: drawn at random and logged)")
    g = p.add_argument_group("distributed")
    g.add_argument("--world-size", type=int, default=-1, help="number of nodes")
    g.add_argument("--rank", type=int, default=-1, help="node rank")
    g.add_argument("--dist-url", default="tcp://224.66.41.62:23456", help="rendezvous URL")
    g.add_argument("--dist-backend", default="nccl", help="torch.distributed backend")
    g.add_argument("--multiprocessing-distributed", action="store_true",
                   help="one process per GPU with DistributedDataParallel")
    g.add_argument("--gpu", type=int, help="GPU index to use")
    g.add_argument("--no-accel", action="store_true", help="do not use an accelerator (CPU)")
    w = p.add_argument_group("output")
    w.add_argument("-c", "--config", metavar="FILE", help="YAML preset (see configs/)")
    w.add_argument("--output-dir", default=".", help="checkpoints, metrics.jsonl, TensorBoard logs")
    w.add_argument("-p", "--print-freq", type=int, default=10, help="log every N steps")
    w.add_argument("--resume", default="", metavar="PATH", help="checkpoint to resume from")
    w.add_argument("-e", "--evaluate", action="store_true", help="evaluate on val and exit")
    return p


def workers_type(value) -> int | str:
    """``-j`` value: a non-negative int or ``auto``."""
    if value == "auto" or (isinstance(value, int) and value >= 0):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise argparse.ArgumentTypeError(f"expected a number of workers or 'auto', got {value!r}")


def resolve_workers(workers: int | str) -> int:
    """``auto`` -> ``min(8, CPU cores)``: beyond 8 workers one process rarely gains."""
    return min(8, os.cpu_count() or 1) if workers == "auto" else workers


def parse_args(argv=None) -> argparse.Namespace:
    """Parse ``argv`` with defaults < ``-c`` preset < command line.

    Raises :class:`ConfigError` for a missing or malformed preset or an unknown key in it.
    """
    parser = get_args_parser()
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("-c", "--config")
    known, _ = pre.parse_known_args(argv)
    if known.config:
        parser.set_defaults(**load_preset(known.config, parser))
    return parser.parse_args(argv)


def load_preset(path: str, parser: argparse.ArgumentParser) -> dict:
    """Read a YAML preset: a mapping of flag names (``batch_size`` or ``batch-size``) to values."""
    import yaml

    try:
        with open(path) as f:
            preset = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"--config {path}: {exc}".splitlines()[0]) from None
    if not isinstance(preset, dict):
        raise ConfigError(f"--config {path}: expected a mapping of flag names to values")
    preset = {str(k).replace("-", "_"): v for k, v in preset.items()}
    known = {a.dest for a in parser._actions} - {"help", "config"}
    unknown = sorted(set(preset) - known)
    if unknown:
        raise ConfigError(f"--config {path}: unknown key(s) {', '.join(unknown)}")
    return preset


def backend_name(args) -> str:
    """The data backend: ``synthetic`` with --dummy, ``dali`` with --dali or --loader dali (reads --lmdb
    itself), ``lmdb`` with --lmdb, else --loader."""
    if args.dummy:
        return "synthetic"
    if args.dali or args.loader == "dali":
        return "dali"
    if args.lmdb:
        if args.loader not in ("folder", "lmdb"):
            raise ConfigError(f"--lmdb conflicts with --loader {args.loader}")
        return "lmdb"
    return args.loader


def resolve_device(args) -> torch.device:
    """CUDA (``--gpu`` index, else the current device) unless ``--no-accel`` or none exists."""
    if args.no_accel or not torch.cuda.is_available():
        if args.gpu is not None:
            raise ConfigError(f"--gpu {args.gpu}: no CUDA device available")
        return torch.device("cpu")
    if args.gpu is not None and args.gpu >= torch.cuda.device_count():
        raise ConfigError(f"--gpu {args.gpu}: only {torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", args.gpu if args.gpu is not None else torch.cuda.current_device())


def image_library_line() -> str:
    from loaders._transforms import image_library

    return f"image library: {image_library()}"


def main(argv=None) -> dict:
    """Run training (or ``-e`` evaluation) as the command line ``argv`` says.

    Returns the last epoch's metrics (or the evaluation's). Raises :class:`ConfigError`,
    :class:`~loaders.DataError` or :class:`~models.ModelError` for bad input.
    """
    args = parse_args(argv)
    if args.multiprocessing_distributed or args.world_size > 1:
        raise ConfigError("distributed training is not available in this version yet")
    dist = DistInfo(device=resolve_device(args))
    log = print if dist.is_main else (lambda *a, **k: None)
    checkpoint = load_checkpoint(args.resume) if args.resume else None
    if args.seed is None:
        args.seed = checkpoint["config"]["seed"] if checkpoint else random.randrange(2**31)
    seed_everything(args.seed + dist.rank)
    args.workers = resolve_workers(args.workers)
    log(f"device: {dist.device}; {image_library_line()}; seed {args.seed}")

    train_loader, val_loader = loaders.build_loaders(backend_name(args), args, dist)
    num_classes = len(train_loader.classes)
    model = build_model(args.arch, num_classes, args.pretrained).to(dist.device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if dist.device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    criterion = nn.CrossEntropyLoss().to(dist.device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)
    scaler = torch.amp.GradScaler("cuda", enabled=args.amp and dist.device.type == "cuda")
    best_acc1 = 0.0
    if checkpoint:
        best_acc1 = restore(checkpoint, model, optimizer, scheduler, scaler, args)
        log(f"resumed from {args.resume} at epoch {args.start_epoch}")
    log(f"{args.arch}: {num_classes} classes; {backend_name(args)} loader: "
        f"{len(train_loader)} train / {len(val_loader)} val batches of {args.batch_size}")

    if args.evaluate:
        stats = evaluate(model, val_loader, criterion, args, dist)
        log(f"val top-1 {stats['acc1']:.3f} top-5 {stats['acc5']:.3f} "
            f"loss {stats['loss']:.4f} ({stats['images']} images)")
        return stats

    writer = MetricsWriter(args.output_dir) if dist.is_main else None
    record = {}
    try:
        for epoch in range(args.start_epoch, args.epochs):
            record = run_epoch(epoch, model, train_loader, val_loader, criterion, optimizer,
                               scaler, args, dist, log, writer)
            scheduler.step()
            best_acc1 = max(best_acc1, record["val_acc1"])
            if dist.is_main:
                save_checkpoint(checkpoint_state(epoch + 1, model, optimizer, scheduler, scaler,
                                                 best_acc1, args),
                                record["val_acc1"] >= best_acc1, args.output_dir)
    finally:
        if writer:
            writer.close()
    return record


def run_epoch(epoch, model, train_loader, val_loader, criterion, optimizer, scaler, args,
              dist, log, writer) -> dict:
    """Train one epoch, validate, log and record; returns the ``metrics.jsonl`` record."""
    start = time.perf_counter()
    train_loader.set_epoch(epoch)
    lr = optimizer.param_groups[0]["lr"]
    train = train_one_epoch(model, train_loader, criterion, optimizer, scaler, epoch, args,
                            dist, log, writer)
    val = evaluate(model, val_loader, criterion, args, dist)
    record = {
        "epoch": epoch, "train_loss": train["loss"], "train_acc1": train["acc1"],
        "val_loss": val["loss"], "val_acc1": val["acc1"], "val_acc5": val["acc5"], "lr": lr,
        "train_images_per_sec": train["images_per_sec"],
        "data_time_fraction": train["data_time_fraction"],
        "epoch_seconds": time.perf_counter() - start,
    }
    log(f"epoch {epoch}: train loss {record['train_loss']:.4f} top-1 {record['train_acc1']:.2f} | "
        f"val loss {record['val_loss']:.4f} top-1 {record['val_acc1']:.2f} "
        f"top-5 {record['val_acc5']:.2f} | {record['train_images_per_sec']:.1f} images/s, "
        f"data {100 * record['data_time_fraction']:.0f}% | {record['epoch_seconds']:.1f} s")
    if writer:
        writer.write(record)
    return record


def autocast(args, device: torch.device):
    """fp16 autocast on CUDA, bf16 on CPU, when ``--amp``."""
    if not args.amp:
        return nullcontext()
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    return torch.autocast(device.type, dtype=dtype)


def train_one_epoch(model, loader, criterion, optimizer, scaler, epoch, args, dist, log,
                    writer) -> dict:
    """One pass over ``loader``. Returns mean ``loss``, ``acc1`` (%), ``images``,
    ``images_per_sec`` and ``data_time_fraction`` (share of wall time spent waiting for data)."""
    model.train()
    loss_sum = torch.zeros((), device=dist.device)
    correct = torch.zeros((), device=dist.device, dtype=torch.int64)
    images_seen, data_time, start = 0, 0.0, time.perf_counter()
    end = start
    for step, (images, labels) in enumerate(loader):
        data_time += time.perf_counter() - end
        with autocast(args, dist.device):
            output = model(images)
            loss = criterion(output, labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        loss_sum += loss.detach() * labels.size(0)
        correct += (output.argmax(1) == labels).sum()
        images_seen += labels.size(0)
        if args.print_freq and (step % args.print_freq == 0 or step + 1 == len(loader)):
            elapsed = time.perf_counter() - start
            log(f"Epoch: [{epoch}][{step + 1:>{len(str(len(loader)))}}/{len(loader)}] "
                f"loss {loss.item():.4f} ({loss_sum.item() / images_seen:.4f}) "
                f"{images_seen / elapsed:.1f} images/s data {100 * data_time / elapsed:.0f}%")
            if writer:
                writer.scalar("step/train_loss", loss.item(), epoch * len(loader) + step)
        end = time.perf_counter()
    if images_seen == 0:
        raise DataError("the training loader yielded no batch")
    seconds = time.perf_counter() - start
    return {"loss": loss_sum.item() / images_seen, "acc1": 100.0 * correct.item() / images_seen,
            "images": images_seen, "images_per_sec": images_seen / seconds,
            "data_time_fraction": data_time / seconds}


@torch.no_grad()
def evaluate(model, loader, criterion, args, dist) -> dict:
    """Mean ``loss``, top-1 ``acc1`` and top-5 ``acc5`` (%) over ``images`` validation images."""
    model.eval()
    loss_sum = torch.zeros((), device=dist.device)
    correct = torch.zeros(2, device=dist.device, dtype=torch.int64)
    images_seen = 0
    k = min(5, len(loader.classes))
    for images, labels in loader:
        with autocast(args, dist.device):
            output = model(images)
            loss = criterion(output, labels)
        loss_sum += loss.float() * labels.size(0)
        topk = output.topk(k, dim=1).indices
        hits = topk == labels[:, None]
        correct += torch.stack([hits[:, 0].sum(), hits.any(dim=1).sum()])
        images_seen += labels.size(0)
    n = max(images_seen, 1)
    return {"loss": loss_sum.item() / n, "acc1": 100.0 * correct[0].item() / n,
            "acc5": 100.0 * correct[1].item() / n, "images": images_seen}


class MetricsWriter:
    """Appends one JSON object per epoch to ``OUTPUT/metrics.jsonl`` and mirrors every number
    to TensorBoard under ``OUTPUT/tensorboard``. Raises :class:`ConfigError` if ``OUTPUT``
    cannot be written."""

    def __init__(self, output_dir: str):
        try:
            os.makedirs(output_dir, exist_ok=True)
            self.file = open(os.path.join(output_dir, "metrics.jsonl"), "a")
        except OSError as exc:
            raise ConfigError(f"--output-dir {output_dir}: cannot write ({exc.strerror})") from None
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(os.path.join(output_dir, "tensorboard"))

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        for key, value in record.items():
            if key != "epoch":
                self.tb.add_scalar(f"epoch/{key}", value, record["epoch"])
        self.tb.flush()

    def scalar(self, tag: str, value: float, step: int) -> None:
        self.tb.add_scalar(tag, value, step)

    def close(self) -> None:
        self.file.close()
        self.tb.close()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model inside DataParallel / DistributedDataParallel (no ``module.`` prefix)."""
    return getattr(model, "module", model)


def checkpoint_state(epoch, model, optimizer, scheduler, scaler, best_acc1, args) -> dict:
    """The pytorch/examples checkpoint keys plus the AMP scaler, config and RNG states."""
    return {
        "epoch": epoch, "arch": args.arch, "state_dict": unwrap(model).state_dict(),
        "best_acc1": best_acc1, "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
        "config": dict(vars(args)),
        "rng": {"python": random.getstate(), "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
    }


def save_checkpoint(state: dict, is_best: bool, output_dir: str) -> None:
    """Write ``checkpoint.pth.tar`` (and ``model_best.pth.tar`` if ``is_best``) atomically: a
    temporary file in the same directory, then ``os.replace``, so a kill never leaves a torn file."""
    os.makedirs(output_dir, exist_ok=True)
    names = ["checkpoint.pth.tar"] + (["model_best.pth.tar"] if is_best else [])
    for name in names:
        path = os.path.join(output_dir, name)
        tmp = f"{path}.tmp.{os.getpid()}"
        torch.save(state, tmp)
        os.replace(tmp, path)


def load_checkpoint(path: str) -> dict:
    """Read a checkpoint onto the CPU. Raises :class:`ConfigError` if it is missing or unreadable."""
    if not os.path.isfile(path):
        raise ConfigError(f"--resume {path}: no such checkpoint file")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a damaged or foreign file
        raise ConfigError(f"--resume {path}: not a readable checkpoint ({type(exc).__name__})") from None


def restore(checkpoint: dict, model, optimizer, scheduler, scaler, args) -> float:
    """Load every state from ``checkpoint``; set ``args.start_epoch``; return ``best_acc1``."""
    if checkpoint["arch"] != args.arch:
        raise ConfigError(f"--resume: checkpoint is a {checkpoint['arch']}, not -a {args.arch}")
    unwrap(model).load_state_dict(checkpoint["state_dict"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    scaler.load_state_dict(checkpoint["scaler"])
    args.start_epoch = checkpoint["epoch"]
    rng = checkpoint["rng"]
    random.setstate(rng["python"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return float(checkpoint["best_acc1"])


def cli(argv=None) -> int:
    """Console entry: bad input ends with one ``main.py: error: ...`` line and exit status 1."""
    try:
        main(argv)
    except (ConfigError, DataError, ModelError) as exc:
        print(f"main.py: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("main.py: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(cli())
