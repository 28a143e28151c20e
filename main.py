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
import warnings
from contextlib import nullcontext

import torch
from torch import nn

import loaders
from loaders import AcceleratorError, DataError, DistInfo
from loaders._common import split_paths
from models import ModelError, build_model, check_arch


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
    d.add_argument("--dali-hw-decoder-load", type=float, metavar="F",
                   help="with --dali: share of JPEGs for the A100/H100 hardware decoder "
                   "(default: DALI's recommendation for the GPU found)")
    d.add_argument("-j", "--workers", type=workers_type, default="auto", metavar="N",
                   help="data loading worker processes per training process, or 'auto' "
                   "(min(8, CPU cores))")
    d.add_argument("--train-crop-size", type=int, default=224, help="RandomResizedCrop size (px)")
    d.add_argument("--val-resize-size", type=int, default=256, help="val shorter-side resize (px)")
    d.add_argument("--val-crop-size", type=int, default=224, help="val CenterCrop size (px)")
    d.add_argument("--train-batches", type=int, metavar="N", help="cap on training batches per epoch")
    d.add_argument("--val-batches", type=int, metavar="N", help="cap on validation batches")
    d.add_argument("--max-bad-share", type=float, default=0.01, metavar="F",
                   help="undecodable samples are replaced and reported; stop when more than "
                   "this share of an epoch's images fail")
    d.add_argument("--lmdb-order", default="random", choices=["random", "block"],
                   help="with --lmdb: training read order; 'block' shuffles blocks of "
                   "consecutive records (mostly sequential I/O, for LMDBs larger than RAM)")
    d.add_argument("--lmdb-block-size", type=int, default=256, metavar="N",
                   help="with --lmdb-order block: records per block (256 ~ 28 MB of ImageNet)")
    d.add_argument("--lmdb-buffer-blocks", type=int, default=8, metavar="K",
                   help="with --lmdb-order block: blocks read at once, shuffled together")
    d.add_argument("--lmdb-readahead", default="auto", choices=["auto", "on", "off"],
                   help="with --lmdb: OS readahead; auto = on when the LMDB fits in half the "
                   "available memory (faster random reads), off otherwise (block order wants on)")
    m = p.add_argument_group("model")
    m.add_argument("-a", "--arch", default="resnet18", help="torchvision classification model")
    m.add_argument("--pretrained", action="store_true",
                   help="start from torchvision's ImageNet weights (must already be on disk)")
    m.add_argument("--amp", action="store_true", help="automatic mixed precision")
    m.add_argument("--amp-dtype", default="float16", choices=["float16", "bfloat16"],
                   help="with --amp on CUDA: autocast dtype (bfloat16 needs no GradScaler; "
                   "CPU autocast is always bfloat16)")
    m.add_argument("--compile", action="store_true",
                   help="torch.compile the model (slow first steps, faster after)")
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
    g.add_argument("--nproc-per-node", type=int,
                   help="processes per node (default: the GPU count, 1 without GPUs)")
    g.add_argument("--gpu", type=int, help="GPU index to use")
    g.add_argument("--no-accel", action="store_true", help="do not use an accelerator (CPU)")
    w = p.add_argument_group("output")
    w.add_argument("-c", "--config", metavar="FILE", help="YAML preset (see configs/)")
    w.add_argument("--output-dir", default=".", help="checkpoints, metrics.jsonl, TensorBoard logs")
    w.add_argument("-p", "--print-freq", type=int, default=10, help="log every N steps")
    w.add_argument("--resume", default="", metavar="PATH", help="checkpoint to resume from")
    w.add_argument("--save-every", type=int, default=0, metavar="N",
                   help="also checkpoint every N training steps, with the loader position "
                   "(--resume continues with the next batch); 0: at epoch ends only")
    w.add_argument("-e", "--evaluate", action="store_true", help="evaluate on val and exit")
    w.add_argument("--benchmark-data", action="store_true",
                   help="time the training loader alone (no model) for --train-batches batches "
                   "after --benchmark-warmup; print a JSON line")
    w.add_argument("--benchmark-warmup", type=int, default=5, metavar="N",
                   help="untimed batches before --benchmark-data starts the clock, and steps "
                   "of each epoch left out of its steady_images_per_sec")
    return p


def workers_type(value) -> int | str:
    """``-j`` value: a non-negative int or ``auto``."""
    if value == "auto" or (isinstance(value, int) and value >= 0):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise argparse.ArgumentTypeError(f"expected a number of workers or 'auto', got {value!r}")


def resolve_workers(workers: int | str, processes_per_node: int = 1) -> int:
    """``auto`` -> ``min(8, CPU cores / processes on this node)``, at least 1: the node's
    cores (those this process may run on) are shared by its training processes, and beyond 8
    one process rarely gains."""
    if workers != "auto":
        return workers
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(8, (cores or 1) // max(1, processes_per_node)))


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
    if not use_cuda(args):
        if args.gpu is not None:
            raise ConfigError(f"--gpu {args.gpu}: no CUDA device available")
        return torch.device("cpu")
    if args.gpu is not None and args.gpu >= torch.cuda.device_count():
        raise ConfigError(f"--gpu {args.gpu}: only {torch.cuda.device_count()} CUDA device(s)")
    device = torch.device("cuda", args.gpu if args.gpu is not None else torch.cuda.current_device())
    # Make it the current device: otherwise torch.cuda.synchronize(), new streams and events
    # (the throughput timer, the side-stream copy) would act on GPU 0.
    torch.cuda.set_device(device)
    return device


def check_cuda(args) -> None:
    """Stop with one line when this machine's NVIDIA driver cannot run torch's CUDA build (too
    old, or broken): torch would otherwise train on the CPU with only a warning. Must run
    before anything else asks torch about CUDA (torch warns once per process). ``--no-accel``
    trains on the CPU on purpose. Raises :class:`ConfigError`."""
    if args.no_accel or torch.version.cuda is None:
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    problems = [str(w.message) for w in caught if "CUDA initialization" in str(w.message)]
    if not available and problems:
        raise ConfigError(
            f"{problems[0].splitlines()[0]} (torch {torch.__version__} is built for CUDA "
            f"{torch.version.cuda}): update the NVIDIA driver or install a torch build for an "
            "older CUDA; --no-accel trains on the CPU")


class WorkerFailed(Exception):
    """A spawned training process failed; it has printed its own message."""


def launch_workers(args) -> None:
    """``--multiprocessing-distributed``: spawn ``--nproc-per-node`` workers on this node.

    As pytorch/examples: ``--world-size`` counts nodes and ``--rank`` is this node's rank, so
    the job has ``nodes * nproc`` processes; ``-b`` and ``-j`` are divided among this node's
    processes. If one worker fails, ``torch.multiprocessing`` ends the others and this raises
    :class:`WorkerFailed`.
    """
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    if backend_name(args) != "synthetic":
        split_paths(args)  # reported once here rather than by every process
    check_arch(args.arch)
    dist_backend(args, use_cuda(args))  # refused once here rather than by every process
    nproc = args.nproc_per_node or (torch.cuda.device_count() if use_cuda(args) else 1)
    check_gpu_flag(args.gpu, nproc)
    nodes = max(args.world_size, 1)
    if nodes > 1 and not args.dist_url:
        raise ConfigError("--dist-url tcp://HOST:PORT is needed for more than one node")
    if args.dist_url is None:
        args.dist_url = f"tcp://127.0.0.1:{free_port()}"
    if args.batch_size < nproc:
        raise ConfigError(f"-b {args.batch_size} is less than one image per process ({nproc})")
    args.batch_size //= nproc
    if args.workers != "auto":
        args.workers = (args.workers + nproc - 1) // nproc
    try:
        mp.spawn(spawned_worker, args=(args, nproc), nprocs=nproc, join=True)
    except ProcessException as exc:
        raise WorkerFailed(f"process {exc.error_index} failed; the job was stopped") from None


def spawned_worker(local_rank: int, args, nproc: int) -> None:
    """Entry point of a spawned process: bad input exits with one line, not a traceback."""
    try:
        worker(args, local_rank, nproc)
    except (ConfigError, DataError, ModelError, AcceleratorError) as exc:
        print(f"main.py: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)


def use_cuda(args) -> bool:
    return torch.cuda.is_available() and not args.no_accel


def free_port() -> int:
    """A TCP port free on localhost now (for a single node's rendezvous)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def setup_distributed(args, local_rank: int | None = None, nproc: int = 1) -> DistInfo:
    """Join the process group if this is a distributed run; return this process's place.

    A spawned worker (``local_rank`` given) has global rank ``node_rank * nproc + local_rank``;
    under torchrun (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set, ``--dist-url env://``) the
    environment says; a hand-launched process gives ``--world-size`` and ``--rank``. The
    backend is NCCL with CUDA and gloo without. As in pytorch/examples, a process started by
    ``--multiprocessing-distributed`` or torchrun joins a process group and trains with DDP even
    at world size 1 (one GPU exercises NCCL). Also resolves ``-j auto`` for this process.
    """
    env = os.environ
    joins_group = True
    if local_rank is not None:
        rank, world = max(args.rank, 0) * nproc + local_rank, max(args.world_size, 1) * nproc
    elif "RANK" in env and "WORLD_SIZE" in env and args.dist_url in (None, "env://"):
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local_rank, args.dist_url = int(env.get("LOCAL_RANK", 0)), "env://"
        nproc = int(env.get("LOCAL_WORLD_SIZE", 1))
    else:
        rank, world, local_rank = max(args.rank, 0), max(args.world_size, 1), 0
        joins_group = world > 1
    args.workers = resolve_workers(args.workers, nproc)
    check_gpu_flag(args.gpu, nproc)
    if not joins_group:
        return DistInfo(device=resolve_device(args))
    if args.gpu is None and use_cuda(args):
        args.gpu = local_rank
    device = resolve_device(args)
    backend = dist_backend(args, device.type == "cuda")
    if not args.dist_url:
        raise ConfigError(f"--world-size {world} needs --dist-url (or launch with torchrun)")
    import datetime

    torch.distributed.init_process_group(
        backend, init_method=args.dist_url, world_size=world, rank=rank,
        timeout=datetime.timedelta(seconds=args.dist_timeout))
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=device,
                    distributed=True)


def check_gpu_flag(gpu: int | None, nproc: int) -> None:
    """``--gpu N`` names one GPU; with several training processes per node each must use the GPU
    of its local rank (pytorch/examples would put them all on GPU N: NCCL "Duplicate GPU
    detected"). Raises :class:`ConfigError` for that combination."""
    if gpu is not None and nproc > 1:
        raise ConfigError(f"--gpu {gpu} with {nproc} processes per node would put every rank "
                          "on one GPU: each process uses the GPU of its local rank; drop --gpu "
                          "(CUDA_VISIBLE_DEVICES selects the node's GPUs)")


def dist_backend(args, cuda: bool) -> str:
    """``--dist-backend``, else NCCL with CUDA and gloo without; NCCL without CUDA is a
    :class:`ConfigError`."""
    backend = args.dist_backend or ("nccl" if cuda else "gloo")
    if backend == "nccl" and not cuda:
        raise ConfigError("--dist-backend nccl needs CUDA; use gloo on CPU")
    return backend


def wrap_parallel(model: nn.Module, args, dist: DistInfo, log) -> nn.Module:
    """DistributedDataParallel in a distributed run; pytorch/examples' DataParallel fallback
    when one process sees several GPUs and no ``--gpu`` was given; else the model itself."""
    if dist.distributed:
        ids = [dist.device.index] if dist.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)
    if dist.device.type == "cuda" and args.gpu is None and torch.cuda.device_count() > 1:
        log(f"DataParallel over {torch.cuda.device_count()} GPUs "
            "(--multiprocessing-distributed is faster)")
        return nn.DataParallel(model)
    return model


def reduce_sum(values: list[float], dist: DistInfo) -> list[float]:
    """Element-wise sum of ``values`` over all ranks (float64; identity in one process)."""
    if dist.world_size == 1:
        return values
    device = dist.device if dist.device.type == "cuda" else torch.device("cpu")
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    torch.distributed.all_reduce(tensor)
    return tensor.tolist()


def broadcast_int(value: int, dist: DistInfo) -> int:
    """Global rank 0's ``value`` on every rank."""
    if dist.world_size == 1:
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def sync_buffers(model: nn.Module, dist: DistInfo) -> None:
    """Give every rank global rank 0's buffers (BatchNorm running statistics) before
    validation, so each shard is scored by exactly the model that rank 0 checkpoints."""
    if dist.world_size > 1:
        for buffer in unwrap(model).buffers():
            torch.distributed.broadcast(buffer, src=0)


def image_library_line() -> str:
    from loaders._transforms import image_library

    return f"JPEG decode: libjpeg-turbo (torchvision), other formats: {image_library()}"


def main(argv=None) -> dict:
    """Run training (or ``-e`` evaluation) as the command line ``argv`` says.

    With ``--multiprocessing-distributed`` this process spawns one worker per GPU (or
    ``--nproc-per-node`` CPU workers) and returns ``{}``; otherwise it trains itself (one
    process, or one rank under torchrun) and returns the last epoch's metrics (or the
    evaluation's). Raises :class:`ConfigError`, :class:`~loaders.DataError` or
    :class:`~models.ModelError` for bad input, ``WorkerFailed`` if a spawned worker fails.
    """
    args = parse_args(argv)
    check_cuda(args)
    if args.multiprocessing_distributed:
        launch_workers(args)
        return {}
    return worker(args)


def worker(args, local_rank: int | None = None, nproc: int = 1) -> dict:
    """One training process: distributed setup, loaders, model, train/evaluate, cleanup."""
    loaders.retain_freed_memory()  # before workers fork: they inherit it (loaders/_malloc.py)
    dist = setup_distributed(args, local_rank, nproc)
    try:
        return train_or_evaluate(args, dist)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def train_or_evaluate(args, dist: DistInfo) -> dict:
    log = print if dist.is_main else (lambda *a, **k: None)
    checkpoint = load_checkpoint(args.resume) if args.resume else None
    if args.seed is None:
        args.seed = checkpoint["config"]["seed"] if checkpoint else random.randrange(2**31)
        args.seed = broadcast_int(args.seed, dist)  # every rank must shuffle alike
    seed_everything(args.seed + dist.rank)
    group = f" ({torch.distributed.get_backend()} process group)" if dist.distributed else ""
    log(f"device: {dist.device}; world size {dist.world_size}{group}; {image_library_line()}; "
        f"seed {args.seed}")
    if args.benchmark_data:
        return benchmark_data(args, dist, log)

    train_loader, val_loader = loaders.build_loaders(backend_name(args), args, dist)
    num_classes = len(train_loader.classes)
    model = build_model(args.arch, num_classes, args.pretrained).to(dist.device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if dist.device.type == "cuda":
        enable_fast_cuda_math()
    criterion = nn.CrossEntropyLoss().to(dist.device)
    optimizer = make_optimizer(model, args, dist.device)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)
    scaler = torch.amp.GradScaler("cuda", enabled=needs_grad_scaler(args, dist.device))
    best_acc1 = 0.0
    if checkpoint:
        best_acc1 = restore(checkpoint, model, optimizer, scheduler, scaler, args, dist)
        log(f"resumed from {args.resume} at epoch {args.start_epoch}"
            + (f", batch {checkpoint['batch']}" if checkpoint.get("batch") else ""))
    model = wrap_parallel(model, args, dist, log)
    if args.compile:
        model = torch.compile(model)
    log(f"{args.arch}: {num_classes} classes; {backend_name(args)} loader: "
        f"{len(train_loader)} train / {len(val_loader)} val batches of {args.batch_size} "
        "per process")

    if args.evaluate:
        stats = evaluate(model, val_loader, criterion, args, dist)
        log(f"val top-1 {stats['acc1']:.3f} top-5 {stats['acc5']:.3f} "
            f"loss {stats['loss']:.4f} ({stats['images']} images)")
        return stats

    writer = MetricsWriter(args.output_dir) if dist.is_main else None
    record = {}
    def save_partial(epoch: int, batch: int, partial: dict) -> None:
        rng_states = gather_rng_states(dist)  # on every rank: a collective
        if dist.is_main:
            save_checkpoint(checkpoint_state(epoch, model, optimizer, scheduler, scaler,
                                             best_acc1, args, rng_states, batch, partial),
                            False, args.output_dir)

    try:
        for epoch in range(args.start_epoch, args.epochs):
            resumed = epoch == args.start_epoch and checkpoint and checkpoint.get("batch", 0)
            record = run_epoch(epoch, model, train_loader, val_loader, criterion, optimizer,
                               scaler, args, dist, log, writer, save_partial,
                               checkpoint if resumed else None)
            scheduler.step()
            best_acc1 = max(best_acc1, record["val_acc1"])
            rng_states = gather_rng_states(dist)
            if dist.is_main:
                save_checkpoint(checkpoint_state(epoch + 1, model, optimizer, scheduler, scaler,
                                                 best_acc1, args, rng_states),
                                record["val_acc1"] >= best_acc1, args.output_dir)
    finally:
        if writer:
            writer.close()
    return record


def enable_fast_cuda_math() -> None:
    """cuDNN autotuning for the fixed input size, and TF32 tensor cores for float32 matrix
    multiplies as for convolutions (torch leaves matmuls in full FP32 by default; the
    classifier's Linear and everything outside autocast profit)."""
    torch.backends.cudnn.benchmark = True
    torch.set_float32_matmul_precision("high")


def make_optimizer(model: nn.Module, args, device: torch.device) -> torch.optim.Optimizer:
    """pytorch/examples' SGD (``--lr``, ``--momentum``, ``--wd``). On CUDA its fused
    implementation: one kernel for all parameters, and it takes GradScaler's inverse scale and
    inf flag on the GPU, so an ``--amp`` step never waits for the GPU (``found_inf.item()``)."""
    return torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum,
                           weight_decay=args.weight_decay, fused=device.type == "cuda" or None)


def needs_grad_scaler(args, device: torch.device) -> bool:
    """Loss scaling is for float16 autocast on CUDA; bfloat16 has float32's exponent range."""
    return args.amp and args.amp_dtype == "float16" and device.type == "cuda"


def benchmark_data(args, dist: DistInfo, log) -> dict:
    """``--benchmark-data``: iterate the training loader alone (decode, augmentation, collation,
    copy to the device and normalisation; no model) and return/print its throughput as one JSON
    line: ``loader``, ``images``, ``seconds``, ``images_per_sec`` (summed over ranks),
    ``workers`` and ``batch_size`` (per process), ``cpu_count``, ``world_size``, ``device``."""
    from loaders._throughput import measure

    timed = args.train_batches
    args.train_batches = None  # the timed batches run on past a capped epoch's end
    train_loader, _ = loaders.build_loaders(backend_name(args), args, dist)
    stats = measure(train_loader, timed or len(train_loader), args.benchmark_warmup)
    images, seconds, speed = reduce_sum(
        [stats["images"], stats["seconds"], stats["images_per_sec"]], dist)
    result = {"loader": backend_name(args), "images": int(images),
              "seconds": seconds / dist.world_size, "images_per_sec": speed,
              "workers": args.workers, "batch_size": args.batch_size,
              "cpu_count": len(os.sched_getaffinity(0)), "world_size": dist.world_size,
              "device": str(dist.device)}
    log(json.dumps(result))
    return result


def warn_if_data_bound(record: dict, args, log, threshold: float = 0.25) -> None:
    """Say so when the step waited on data for more than ``threshold`` of its time."""
    share = record["data_time_fraction"]
    if share > threshold:
        log(f"warning: {share:.0%} of training time went to waiting for data: the loader is the "
            f"bottleneck. Try more workers (-j, now {args.workers} per process), --lmdb or "
            "--dali, a local copy of the dataset, or measure with --benchmark-data")


def run_epoch(epoch, model, train_loader, val_loader, criterion, optimizer, scaler, args,
              dist, log, writer, save_partial, resumed_from: dict | None = None) -> dict:
    """Train one epoch (from a mid-epoch checkpoint's position if ``resumed_from``), validate,
    log and record; returns the ``metrics.jsonl`` record, whose numbers are global: losses and
    accuracies over all ranks, images/s summed over ranks."""
    start_batch = resumed_from["batch"] if resumed_from else 0
    partial = resumed_from["partial"] if resumed_from else None
    start = time.perf_counter() - (partial["seconds"] if partial else 0.0)
    train_loader.set_epoch(epoch, start_batch)
    lr = optimizer.param_groups[0]["lr"]
    train = train_one_epoch(model, train_loader, criterion, optimizer, scaler, epoch, args,
                            dist, log, writer, save_partial, start_batch, partial)
    val = evaluate(model, val_loader, criterion, args, dist)
    record = {
        "epoch": epoch, "train_loss": train["loss"], "train_acc1": train["acc1"],
        "val_loss": val["loss"], "val_acc1": val["acc1"], "val_acc5": val["acc5"], "lr": lr,
        "train_images_per_sec": train["images_per_sec"], "train_images": train["images"],
        "steady_images_per_sec": train["steady_images_per_sec"],
        "val_images": val["images"],
        "data_time_fraction": train["data_time_fraction"],
        "epoch_seconds": time.perf_counter() - start,
    }
    log(f"epoch {epoch}: train loss {record['train_loss']:.4f} top-1 {record['train_acc1']:.2f} | "
        f"val loss {record['val_loss']:.4f} top-1 {record['val_acc1']:.2f} "
        f"top-5 {record['val_acc5']:.2f} | {record['train_images_per_sec']:.1f} images/s, "
        f"data {100 * record['data_time_fraction']:.0f}% | {record['epoch_seconds']:.1f} s")
    if writer:
        writer.write(record)
    warn_if_data_bound(record, args, log)
    return record


def autocast(args, device: torch.device):
    """With ``--amp``: autocast to ``--amp-dtype`` on CUDA, to bfloat16 on the CPU."""
    if not args.amp:
        return nullcontext()
    dtype = getattr(torch, args.amp_dtype) if device.type == "cuda" else torch.bfloat16
    return torch.autocast(device.type, dtype=dtype)


_FORMATS = {"loss": "loss {:.4f}", "acc1": "Acc@1 {:.2f}", "acc5": "Acc@5 {:.2f}",
            "lr": "lr {:.4g}", "images_per_sec": "{:.1f} images/s", "data_time_fraction": "data {:.0%}"}


class Progress:
    """Per-step progress of one pass over a loader, shown by global rank 0 only.

    On a terminal: a tqdm bar with images/s. Otherwise (logs, CI): pytorch/examples
    ``ProgressMeter``-style lines every ``print_freq`` steps and at the last step. Every
    ``print_freq`` steps the same figures go to TensorBoard under ``step/<prefix>_*``.
    """

    def __init__(self, total: int, prefix: str, tag: str, print_freq: int, enabled: bool,
                 writer=None, first_step: int = 0):
        self.total, self.prefix, self.tag, self.print_freq = total, prefix, tag, print_freq
        self.enabled, self.writer, self.first_step = enabled, writer, first_step
        self.bar = None
        if enabled and sys.stdout.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=prefix, unit="batch", leave=False, dynamic_ncols=True)
        self.start = time.perf_counter()

    def due(self, step: int) -> bool:
        """Whether :meth:`show` wants figures at ``step`` (they cost a device sync)."""
        if self.bar is not None:
            self.bar.update(1)
        return self.enabled and self.print_freq > 0 and (
            step % self.print_freq == 0 or step + 1 == self.total)

    def show(self, step: int, images: int, data_time: float, **figures: float) -> None:
        elapsed = time.perf_counter() - self.start
        figures = {**figures, "images_per_sec": images / elapsed,
                   "data_time_fraction": data_time / elapsed}
        text = "  ".join(_FORMATS[key].format(value) for key, value in figures.items())
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)
        else:
            print(f"{self.prefix}[{step + 1:>{len(str(self.total))}}/{self.total}]  {text}",
                  flush=True)
        if self.writer:
            for key, value in figures.items():
                self.writer.scalar(f"step/{self.tag}_{key}", value, self.first_step + step)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def train_one_epoch(model, loader, criterion, optimizer, scaler, epoch, args, dist, log,
                    writer, save_partial=None, start_batch: int = 0,
                    partial: dict | None = None) -> dict:
    """One pass over ``loader``, which starts at batch ``start_batch`` of the epoch; ``partial``
    holds the sums over all ranks for the batches before it. Every ``--save-every`` steps
    ``save_partial(epoch, next_batch, sums)`` checkpoints the position. Returns mean ``loss``,
    ``acc1`` (%), ``images`` (all ranks), ``images_per_sec`` (summed over ranks),
    ``steady_images_per_sec`` (the same after this pass's first ``--benchmark-warmup`` steps,
    which hold cuDNN autotuning and ``torch.compile``; None if the pass had no more steps) and
    ``data_time_fraction`` (share of wall time spent waiting for the next batch, mean over ranks)."""
    model.train()
    zero = {"loss_sum": 0.0, "correct": 0, "images": 0, "data_time": 0.0}
    # A checkpoint's sums are global (all ranks): global rank 0 carries them, the others restart.
    partial = {**zero, "seconds": 0.0, **((partial or {}) if dist.is_main else
                                          {"seconds": (partial or {}).get("seconds", 0.0)})}
    loss_sum = torch.full((), partial["loss_sum"], device=dist.device)
    correct = torch.full((), partial["correct"], device=dist.device, dtype=torch.int64)
    total = start_batch + len(loader)
    progress = Progress(total, f"Epoch: [{epoch}]", "train", args.print_freq, dist.is_main,
                        writer, epoch * total)
    images_seen, data_time = partial["images"], partial["data_time"]
    start = time.perf_counter() - partial["seconds"]
    end = time.perf_counter()
    steady_from = None  # (seconds, images) once --benchmark-warmup steps of this pass are done
    for step, (images, labels) in enumerate(loader, start=start_batch):
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
        if progress.due(step):
            progress.show(step, images_seen, data_time, loss=loss_sum.item() / images_seen,
                          acc1=100.0 * correct.item() / images_seen,
                          lr=optimizer.param_groups[0]["lr"])
        if save_partial and args.save_every and (step + 1) % args.save_every == 0 \
                and step + 1 < total:  # the same steps on every rank: the reduction is safe
            sums = reduce_sum([loss_sum.item(), correct.item(), images_seen, data_time], dist)
            save_partial(epoch, step + 1, {
                "loss_sum": sums[0], "correct": int(sums[1]), "images": int(sums[2]),
                "data_time": sums[3], "seconds": time.perf_counter() - start})
        if step + 1 - start_batch == args.benchmark_warmup:
            steady_from = (device_clock(dist.device), images_seen)
        end = time.perf_counter()
    progress.close()
    if images_seen == 0:
        raise DataError("the training loader yielded no batch")
    now = device_clock(dist.device)
    seconds = now - start
    steady = (images_seen - steady_from[1]) / (now - steady_from[0]) \
        if steady_from and images_seen > steady_from[1] else 0.0
    loss_total, correct_total, images, speed, data_share, steady_speed = reduce_sum(
        [loss_sum.item(), correct.item(), images_seen, images_seen / seconds, data_time / seconds,
         steady], dist)
    return {"loss": loss_total / images, "acc1": 100.0 * correct_total / images,
            "images": int(images), "images_per_sec": speed,
            "steady_images_per_sec": steady_speed or None,
            "data_time_fraction": data_share / dist.world_size}


def device_clock(device: torch.device) -> float:
    """``time.perf_counter()`` (seconds) once the work queued on ``device`` has finished."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@torch.no_grad()
def evaluate(model, loader, criterion, args, dist) -> dict:
    """Mean ``loss``, top-1 ``acc1`` and top-5 ``acc5`` (%) over ``images`` validation images,
    summed over all ranks' shards (each image counted once)."""
    sync_buffers(model, dist)
    model = unwrap(model)  # no DDP collectives: ranks may hold different batch counts
    model.eval()
    loss_sum = torch.zeros((), device=dist.device)
    correct = torch.zeros(2, device=dist.device, dtype=torch.int64)
    progress = Progress(len(loader), "Test: ", "val", args.print_freq, dist.is_main)
    images_seen, data_time, end = 0, 0.0, time.perf_counter()
    k = min(5, len(loader.classes))
    for step, (images, labels) in enumerate(loader):
        data_time += time.perf_counter() - end
        with autocast(args, dist.device):
            output = model(images)
            loss = criterion(output, labels)
        loss_sum += loss.float() * labels.size(0)
        hits = output.topk(k, dim=1).indices == labels[:, None]
        correct += torch.stack([hits[:, 0].sum(), hits.any(dim=1).sum()])
        images_seen += labels.size(0)
        if progress.due(step):
            progress.show(step, images_seen, data_time, loss=loss_sum.item() / images_seen,
                          acc1=100.0 * correct[0].item() / images_seen,
                          acc5=100.0 * correct[1].item() / images_seen)
        end = time.perf_counter()
    progress.close()
    loss_total, top1, top5, images = reduce_sum(
        [loss_sum.item(), correct[0].item(), correct[1].item(), images_seen], dist)
    n = max(images, 1)
    return {"loss": loss_total / n, "acc1": 100.0 * top1 / n, "acc5": 100.0 * top5 / n,
            "images": int(images)}


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
            if key != "epoch" and value is not None:
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
    """The bare model inside ``torch.compile``'s wrapper and DataParallel /
    DistributedDataParallel (state_dict keys without ``_orig_mod.`` or ``module.``)."""
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model)


def rng_state(device: torch.device) -> dict:
    """This process's RNG states: Python's, torch's CPU generator, and its own CUDA device's
    (None on the CPU)."""
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def gather_rng_states(dist: DistInfo) -> list[dict]:
    """Every rank's :func:`rng_state`, indexed by global rank. A collective: all ranks call it."""
    state = rng_state(dist.device)
    if dist.world_size == 1:
        return [state]
    states = [None] * dist.world_size
    torch.distributed.all_gather_object(states, state)
    return states


def restore_rng(saved, dist: DistInfo) -> None:
    """Restore this rank's RNG states from a checkpoint's ``rng``: a list by global rank, or (older
    checkpoints) rank 0's states alone, whose ``cuda`` lists every visible device's.

    A rank the checkpoint has no state for (more ranks now) keeps its fresh ``seed + rank``
    streams; a CUDA state is restored only onto this rank's own device, and only if saved
    for it (a checkpoint from 8 GPUs evaluates on 1)."""
    states = saved if isinstance(saved, list) else [saved]
    if dist.rank >= len(states):
        return
    state = states[dist.rank]
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if dist.device.type != "cuda" or cuda is None:
        return
    if isinstance(cuda, list):  # older checkpoints: every visible device's state, by index
        if dist.device.index >= len(cuda):
            return
        cuda = cuda[dist.device.index]
    torch.cuda.set_rng_state(cuda, dist.device)


def checkpoint_state(epoch, model, optimizer, scheduler, scaler, best_acc1, args,
                     rng_states: list[dict], batch: int = 0, partial: dict | None = None) -> dict:
    """The pytorch/examples checkpoint keys plus the AMP scaler, config and RNG states
    (``rng_states`` from :func:`gather_rng_states`).

    ``epoch`` is the epoch to run next and ``batch`` the batch of it to start with (0 at epoch
    ends; > 0 for a ``--save-every`` checkpoint, with ``partial``: the epoch's sums so far over
    all ranks)."""
    return {
        "epoch": epoch, "batch": batch, "partial": partial,
        "arch": args.arch, "state_dict": unwrap(model).state_dict(),
        "best_acc1": best_acc1, "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
        "config": dict(vars(args)), "rng": rng_states,
    }


def save_checkpoint(state: dict, is_best: bool, output_dir: str) -> None:
    """Write ``checkpoint.pth.tar`` (and ``model_best.pth.tar`` if ``is_best``) atomically: a
    temporary file in the same directory, then ``os.replace``, so a kill never leaves a torn file."""
    names = ["checkpoint.pth.tar"] + (["model_best.pth.tar"] if is_best else [])
    for name in names:
        path = os.path.join(output_dir, name)
        tmp = f"{path}.tmp.{os.getpid()}"
        try:
            os.makedirs(output_dir, exist_ok=True)
            torch.save(state, tmp)
            os.replace(tmp, path)
        except (OSError, RuntimeError) as exc:  # torch.save reports a full disk as RuntimeError
            if os.path.exists(tmp):
                os.remove(tmp)
            reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
            raise ConfigError(f"cannot write checkpoint {path}: {reason}; the previous one "
                              "is intact") from None


def load_checkpoint(path: str) -> dict:
    """Read a checkpoint onto the CPU. Raises :class:`ConfigError` if it is missing or unreadable."""
    if not os.path.isfile(path):
        raise ConfigError(f"--resume {path}: no such checkpoint file")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a damaged or foreign file
        raise ConfigError(f"--resume {path}: not a readable checkpoint ({type(exc).__name__})") from None


def restore(checkpoint: dict, model, optimizer, scheduler, scaler, args,
            dist: DistInfo) -> float:
    """Load every state from ``checkpoint``; set ``args.start_epoch``; return ``best_acc1``.

    The loss scale is restored only where both runs scale (a checkpoint saved without
    float16 ``--amp`` holds an empty scaler state; this run then starts a fresh scale)."""
    if checkpoint["arch"] != args.arch:
        raise ConfigError(f"--resume: checkpoint is a {checkpoint['arch']}, not -a {args.arch}")
    unwrap(model).load_state_dict(checkpoint["state_dict"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    if scaler.is_enabled() and checkpoint.get("scaler"):
        scaler.load_state_dict(checkpoint["scaler"])
    args.start_epoch = checkpoint["epoch"]
    restore_rng(checkpoint["rng"], dist)
    return float(checkpoint["best_acc1"])


def cli(argv=None) -> int:
    """Console entry: bad input ends with one ``main.py: error: ...`` line and exit status 1."""
    try:
        main(argv)
    except (ConfigError, DataError, ModelError, AcceleratorError) as exc:
        print(f"main.py: error: {exc}", file=sys.stderr)
        return 1
    except WorkerFailed as exc:
        print(f"main.py: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("main.py: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(cli())
