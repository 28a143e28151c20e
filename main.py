#!/usr/bin/env python
"""Train or evaluate a torchvision classifier on ImageNet from JPEG folders, LMDB or synthetic data.

Flags and checkpoint keys follow pytorch/examples ``imagenet/main.py``; ``main(argv)`` runs
in-process (tests call it), as torchvision's ``references/classification/train.py`` separates
``get_args_parser()`` from ``main(args)``. Settings resolve as defaults < ``-c`` YAML preset <
command line. This file is the command line and the run's story; the work is in ``engine/``
(processes, settings, train state and optimizer, loops, checkpoints, reporting) and
``loaders/``. The parsed ``args`` are never written: each training process resolves them once
into a frozen :class:`RunSettings`, and nothing from :func:`run` down reads ``args``.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

if __name__ == "__main__":  # first, before torch loads: SLURM's stop signals meanwhile are kept
    from engine.preempt import hold_stop_signals
    hold_stop_signals()

import torch

import decode
import loaders
from engine import ConfigError
from engine.argtypes import non_negative_int, positive_int, workers_type
from engine.augmentation import add_augment_args, check_augment_flags, with_random_erasing
from engine.reader_args import add_reader_args
from engine.checkpoint import checkpoint_state, load_checkpoint, resume_path, save_checkpoint
from engine.position import place_resume
from engine.distributed import (ProcessFailed, StopAgreement, check_cuda, check_gpu_flag,
                                dist_backend, gather_rng_states, launch_processes,
                                setup_distributed, use_cuda, use_default_start_method)
from engine.bounds import machine_for
from engine.loop import EpochPlan, evaluate, loader_stage_report, run_epoch
from engine.preempt import Stopped, finish_stop, ignore_stop_signals, stop_signals
from engine.presets import preset_tokens
from engine.recipes import add_recipe_args, check_recipe_flags
from engine.resolution import add_resolution_args, resolution_schedule
from engine.reporting import MetricsWriter, Progress, warn_if_data_bound
from engine.settings import RunSettings, data_root, resolve_backend, resolve_settings
from engine.slurm import check_requeue_flag
from engine.state import TrainState, build_state, use_deterministic_algorithms
from loaders import AcceleratorError, DataError
from models import ModelError, check_arch, resolve_weights

ONE_LINE_ERRORS = (ConfigError, DataError, ModelError, AcceleratorError)


def get_args_parser() -> argparse.ArgumentParser:
    """The command line, grouped as data and loaders / model / optimisation / training recipe /
    distributed / output."""
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
                   default=decode.acceptance.MAX_PIXELS, help="skip, undecoded, an image "
                   "whose header claims more pixels, as the converters do (0: no limit)")
    add_reader_args(d)
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
    add_recipe_args(p.add_argument_group("training recipe"))
    add_augment_args(p.add_argument_group("augmentation (torchvision's recipes)"))
    add_resolution_args(p.add_argument_group("resolution (progressive resizing, test time)"))
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
    """Parse ``argv`` with defaults < ``-c`` preset < command line.

    The preset becomes command-line tokens placed before ``argv`` (see :func:`preset_tokens`),
    so its values pass argparse's own type and choice checks and later tokens win. Raises
    :class:`ConfigError` (naming the preset) for a missing, malformed or invalid preset.
    """
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


def main(argv=None) -> dict:
    """Run training (or ``-e`` evaluation, or ``--benchmark-data``) as ``argv`` says.

    With ``--multiprocessing-distributed`` this process spawns one training process per GPU
    (or ``--nproc-per-node`` CPU processes) and returns ``{}``; otherwise it trains itself (one
    process, or one rank under torchrun) and returns the last epoch's metrics (or the
    evaluation's). Raises :data:`ONE_LINE_ERRORS` for bad input, :class:`ProcessFailed` if a
    spawned process fails.
    """
    args = parse_args(argv)
    check_arch(args.arch)  # a typo is the first error, before any data or device is touched
    if args.weights:
        resolve_weights(args.arch, args.weights)
    check_recipe_flags(args)
    check_augment_flags(args)
    resolution_schedule(args)  # bad sizes or ramps end here, in one line
    check_cuda(args.no_accel)
    check_requeue_flag(args.requeue)
    if not args.multiprocessing_distributed:
        return run_process(args)
    if resolve_backend(args)[0] != "synthetic":  # reported once here, not by every process
        loaders.split_paths(data_root(args), args.train, args.val)
    dist_backend(args.dist_backend, use_cuda(args.no_accel))
    nproc = args.nproc_per_node or (torch.cuda.device_count() if use_cuda(args.no_accel) else 1)
    check_gpu_flag(args.gpu, nproc)
    if args.batch_size < nproc:
        raise ConfigError(f"-b {args.batch_size} is less than one image per process ({nproc})")
    launch_processes(train_process, args, nproc)
    return {}


def train_process(local_rank: int, args, nproc: int, dist_url: str) -> None:
    """Entry point of a spawned training process: bad input exits with one line; a stop
    signal after the run is over is ignored (:func:`~engine.preempt.ignore_stop_signals`)."""
    use_default_start_method()  # loader workers fork, as in one process
    try:
        run_process(args, local_rank, nproc, dist_url)
    except ONE_LINE_ERRORS as exc:
        print(f"main.py: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    except Stopped as stopped:
        sys.exit(stopped.exit_status)
    finally:
        ignore_stop_signals()


def run_process(args, local_rank: int | None = None, nproc: int = 1,
                dist_url: str | None = None) -> dict:
    """One training process: stop signals caught from the start when it trains, process group,
    settings, the run (after a stop's checkpoint: the requeue, engine/preempt.py), cleanup."""
    decode.retain_freed_memory()  # before loader workers fork: they inherit it
    with stop_signals(training=not (args.evaluate or args.benchmark_data)):
        job = setup_distributed(args, local_rank, nproc, dist_url)
        log = print if job.dist.is_main else _silent
        try:
            log(f"launcher: {job.launcher}")
            resume = resume_path(args.resume, args.output_dir, log)
            checkpoint = load_checkpoint(resume) if resume else None
            return run(resolve_settings(args, job, checkpoint, resume), checkpoint)
        except Stopped as stopped:  # the metrics writer is closed: the job may end any moment
            finish_stop(stopped, job.dist.is_main, args.requeue, args.output_dir, log)
            raise
        finally:
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()


def _silent(*_args, **_kwargs) -> None:
    pass


def run(s: RunSettings, checkpoint: dict | None) -> dict:
    """Seed, build the loaders and the model, then evaluate, benchmark or train as ``s.mode``
    says. Nothing from here down reads the command line: ``s`` holds what it resolved to."""
    dist = s.dist
    log = print if dist.is_main else _silent
    random.seed(s.seed + dist.rank)
    torch.manual_seed(s.seed + dist.rank)
    if s.threads:
        torch.set_num_threads(s.threads)
    if s.model.deterministic:
        use_deterministic_algorithms()
    group = f" ({torch.distributed.get_backend()} process group)" if dist.distributed else ""
    log(f"device: {dist.device}; world size {dist.world_size}{group}; decode: "
        f"{loaders.decoders_line(s.loader, dist.device)}; seed {s.seed}; {torch.get_num_threads()} "
        "torch thread(s) in the main process")
    if s.mode == "benchmark":
        return benchmark_data(s, log)
    train_loader, val_loader = loaders.build_loaders(s.loader, dist)
    train_loader = with_random_erasing(train_loader, s.random_erase, s.seed, dist.rank)
    try:
        if s.mode == "train":  # a mid-epoch position at this run's world size and -b
            checkpoint = place_resume(checkpoint, train_loader, s, log)
        return evaluate_or_train(s, (train_loader, val_loader), checkpoint, log)
    finally:  # on every way out: the workers a loader keeps end with the run, not at exit
        loaders.close_all(train_loader, val_loader)


def evaluate_or_train(s: RunSettings, data: tuple, checkpoint: dict | None, log) -> dict:
    """Build the model and train state (:func:`~engine.state.build_state`), then ``-e``
    evaluate or train on ``data`` (the ``(train, val)`` loaders)."""
    train_loader, val_loader = data
    state, start_epoch, best_acc1 = build_state(s, train_loader, checkpoint, log)
    log(f"{s.model.arch}: {len(train_loader.classes)} classes; {s.loader.backend} loader: "
        f"{len(train_loader)} train / {len(val_loader)} val batches of {s.loader.batch_size} "
        "per process")
    log_sampling(s, train_loader, log)
    if s.mode == "evaluate":
        progress = Progress(len(val_loader), "Test: ", "val", s.output.print_freq,
                            s.dist.is_main)
        stats = evaluate(state.model, val_loader, state.criterion, state.autocast, progress,
                         s.dist, s.flip_tta)
        log(f"val top-1 {stats['acc1']:.3f} top-5 {stats['acc5']:.3f} "
            f"loss {stats['loss']:.4f} ({stats['images']} images)")
        return stats
    return train(s, state, data, (start_epoch, best_acc1), checkpoint)


def log_sampling(s: RunSettings, train_loader, log) -> None:
    """Say once what a training epoch reads when it is not the flags' plain reading: one
    smaller batch (a split under one batch per process, as pytorch/examples' DataLoader keeps
    the partial batch), or ``--ra-sampler`` left out in one process (as torchvision)."""
    batch = getattr(train_loader, "batch_size", s.loader.batch_size)
    if batch < s.loader.batch_size and s.mode == "train":
        log(f"training set has {batch} images per process, fewer than one batch of "
            f"{s.loader.batch_size}: each epoch trains on them as one batch of {batch}")
    if s.loader.ra_sampler and not s.dist.distributed and s.mode == "train":
        log("--ra-sampler: not in one process (torchvision's train.py uses its RASampler only "
            "when distributed): a plain shuffle")


def train(s: RunSettings, state: TrainState, data: tuple, start: tuple[int, float],
          checkpoint: dict | None) -> dict:
    """Epochs ``start[0]..--epochs-1`` (the first from a mid-epoch checkpoint's position), a
    checkpoint after each (and every ``--save-every`` steps); returns the last epoch's metrics.
    On SIGUSR1/SIGTERM the ranks agree on a step, checkpoint it and raise :class:`Stopped`
    (engine/preempt.py)."""
    dist, out, epochs = s.dist, s.output, s.recipe.epochs  # out.config: what the user typed
    (start_epoch, best_acc1), log = start, (print if dist.is_main else _silent)
    writer = MetricsWriter(out.output_dir) if dist.is_main else None
    stop = StopAgreement(dist.world_size)
    plan = EpochPlan(out.print_freq, out.warmup, out.save_every, log, writer, s.resolution,
                     s.flip_tta, stop, machine=machine_for(s.loader, s.dist.device.type))

    def save(epoch: int, batch: int = 0, sums=None, is_best: bool = False) -> None:
        rng_states = gather_rng_states(dist)  # on every rank: a collective
        if dist.is_main:
            save_checkpoint(checkpoint_state(state, epoch, best_acc1, out.config, s.seed,
                                             rng_states, batch, sums and sums.to_dict(),
                                             batch and data[0].position(epoch, batch)),
                            is_best, out.output_dir)

    epoch_metrics = {}
    try:
        for epoch in range(start_epoch, epochs):
            resumed = epoch == start_epoch and checkpoint and "rest" in checkpoint
            epoch_metrics = run_epoch(epoch, state, *data, dist, plan, save,
                                      checkpoint if resumed else None)
            warn_if_data_bound(epoch_metrics, s.loader.workers, log)
            best_acc1 = max(best_acc1, epoch_metrics["val_acc1"])
            save(epoch + 1, is_best=epoch_metrics["val_acc1"] >= best_acc1)
            if epoch + 1 < epochs and stop.settle():
                raise Stopped(stop.agreed, epoch + 1, 0)
        stop.close()
    finally:
        if writer:
            writer.close()
    return epoch_metrics


def benchmark_data(s: RunSettings, log) -> dict:
    """``--benchmark-data``: iterate the training loader alone (decode, augmentation, collation,
    copy to the device and normalisation; no model) for ``--train-batches`` batches (default:
    one epoch) after ``--benchmark-warmup`` (with ``--random-erase``'s erasing on the device
    batch, as training sees it), and return/print its throughput as one JSON line:
    ``loader``, ``decode_device``, ``images``, ``seconds``, ``images_per_sec`` (summed over
    ranks), ``workers`` and ``batch_size`` (per process), ``cpu_ms_per_image`` (rank 0's
    process and its workers over the timed batches), ``cpu_count``, ``world_size``,
    ``device``, and rank 0's stage figures (``stages_*``, :func:`engine.bounds.report`, with
    its table and advice printed before the JSON line)."""
    from engine.distributed import reduce_sum

    train_loader, val_loader = loaders.build_loaders(s.loader, s.dist)
    train_loader = with_random_erasing(train_loader, s.random_erase, s.seed, s.dist.rank)
    try:
        stats = loaders.measure_throughput(
            train_loader, s.output.benchmark_batches or len(train_loader), s.output.warmup)
        stages = loader_stage_report(train_loader, machine_for(s.loader, s.dist.device.type),
                                     stats)
    finally:
        loaders.close_all(train_loader, val_loader)
    images, seconds, speed = reduce_sum(
        [stats["images"], stats["seconds"], stats["images_per_sec"]], s.dist)
    result = {"loader": s.loader.backend, "decode_device": s.loader.decode_device,
              "images": int(images),
              "seconds": seconds / s.dist.world_size, "images_per_sec": speed,
              "workers": s.loader.workers, "batch_size": s.loader.batch_size,
              "cpu_ms_per_image": (None if stats["cpu_seconds"] is None else
                                   1000 * stats["cpu_seconds"] / max(1, stats["images"])),
              "cpu_count": len(os.sched_getaffinity(0)), "world_size": s.dist.world_size,
              "device": str(s.dist.device), **stages["metrics"]}
    log("\n".join(stages["lines"] + [f"  try {line}" for line in stages["advice"]]))
    log(json.dumps(result))
    return result


def cli(argv=None) -> int:
    """Console entry: bad input ends with one ``main.py: error: ...`` line and exit status 1."""
    try:
        main(argv)
    except (*ONE_LINE_ERRORS, ProcessFailed) as exc:
        print(f"main.py: error: {exc}", file=sys.stderr)
        return 1
    except Stopped as stopped:  # checkpointed on SIGUSR1/SIGTERM (rank 0 said so)
        return stopped.exit_status
    except KeyboardInterrupt:
        print("main.py: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    status = cli()
    ignore_stop_signals()  # the run is over: a late SIGUSR1/SIGTERM must not turn it into a kill
    sys.exit(status)
