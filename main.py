#!/usr/bin/env python
"""Train or evaluate a torchvision classifier on ImageNet from JPEG folders, LMDB, WebDataset
shards or synthetic data.

The run reads top to bottom, as pytorch/examples ``imagenet/main.py`` and torchvision's
``train.py``: :func:`cli` -> :func:`main` -> :func:`main_worker` -> :func:`run` ->
``engine.loop.train_one_epoch`` -> ``train_step``. Flags live in :mod:`engine.cli`; checkpoint
keys follow pytorch/examples; ``args`` becomes a frozen :class:`RunSettings` once per process,
and nothing from :func:`run` down reads it."""
from __future__ import annotations

import json
import random
import sys

if __name__ == "__main__":  # first, before torch loads: SLURM's stop signals meanwhile are kept
    from engine.distributed.preempt import hold_stop_signals
    hold_stop_signals()

import torch

import decode
import loaders
from engine import ConfigError
from engine.report.bounds import machine_for
from engine.checkpoint import (checkpoint_state, load_checkpoint, restore, resume_path,
                               save_checkpoint)
from engine.cli import check_args, get_args_parser, parse_args
from engine.distributed.processes import (ProcessFailed, StopAgreement, check_cuda, check_gpu_flag,
                                dist_backend, gather_rng_states, launch_processes, reduce_sum,
                                setup_distributed, use_cuda, use_default_start_method)
from engine.loop import EpochPlan, epoch_metrics, stage_report, train_one_epoch, validate
from engine.recipe.optim import make_optimizer
from engine.position import place_resume
from engine.distributed.preempt import Stopped, finish_stop, ignore_stop_signals, stop_signals
from engine.recipe.reference import resolve_recipe
from engine.report.progress import MetricsWriter, report_epoch
from engine.settings import (RunSettings, data_root, node_cores, resolve_backend,
                             resolve_settings, run_mode)
from engine.distributed.slurm import check_requeue_flag
from engine.state import make_ema, make_model, set_numerics, train_state, wrap_model
from loaders import AcceleratorError, DataError
from models import ModelError

__all__ = ["cli", "main", "main_worker", "run", "get_args_parser", "parse_args"]
ONE_LINE_ERRORS = (ConfigError, DataError, ModelError, AcceleratorError)


def cli(argv=None) -> int:
    """Console entry: bad input ends with one ``main.py: error: ...`` line and exit status 1;
    a stop signal's checkpoint with the status rank 0 chose (75); Ctrl-C with 130."""
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


def main(argv=None) -> dict:
    """Run training (or ``-e`` evaluation, or ``--benchmark-data``) as ``argv`` says: with
    ``--multiprocessing-distributed`` start one training process per GPU (or
    ``--nproc-per-node`` CPU processes) and return ``{}``, else train here (alone, or one rank
    under torchrun or srun) and return :func:`run`'s metrics. Raises :data:`ONE_LINE_ERRORS`
    for bad input, :class:`ProcessFailed` if a started process fails."""
    args = parse_args(argv)
    check_args(args)  # a typo or a bad value is the first error, before any data or device
    check_cuda(args.no_accel)
    check_requeue_flag(args.requeue)
    if not args.multiprocessing_distributed:
        return main_worker(args)
    if resolve_backend(args)[0] != "synthetic":  # reported once here, not by every process
        loaders.split_paths(data_root(args), args.train, args.val)
    dist_backend(args.dist_backend, use_cuda(args.no_accel))
    nproc = args.nproc_per_node or (torch.cuda.device_count() if use_cuda(args.no_accel) else 1)
    check_gpu_flag(args.gpu, nproc)
    if args.batch_size < nproc:
        raise ConfigError(f"-b {args.batch_size} is less than one image per process ({nproc})")
    launch_processes(spawned_worker, args, nproc)
    return {}


def spawned_worker(local_rank: int, args, nproc: int, dist_url: str) -> None:
    """A ``--multiprocessing-distributed`` process: :func:`main_worker`; bad input ends in one
    line and exit status 1; a stop signal after the run is ignored."""
    use_default_start_method()  # loader workers fork, as in one process
    try:
        main_worker(args, local_rank, nproc, dist_url)
    except ONE_LINE_ERRORS as exc:
        print(f"main.py: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    except Stopped as stopped:
        sys.exit(stopped.exit_status)
    finally:
        ignore_stop_signals()


def main_worker(args, local_rank: int | None = None, nproc: int = 1,
                dist_url: str | None = None) -> dict:
    """One training process (pytorch/examples' ``main_worker``): process group (``local_rank``,
    ``nproc``, ``dist_url`` from :func:`main`'s launch, if any), ``--resume``, settings,
    :func:`run` with stop signals caught when training, and after a stop's checkpoint the SLURM
    requeue. Returns :func:`run`'s metrics."""
    decode.retain_freed_memory()  # before loader workers fork: they inherit it
    with stop_signals(training=run_mode(args) == "train"):
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
    """One process's run of ``s`` from ``checkpoint`` (None: fresh): seed, data, model,
    optimizer, resume, then ``--benchmark-data``, ``-e`` (one validation) or the epochs (train,
    validate, report, checkpoint). Returns the benchmark's, the validation's or the last epoch's
    figures (``metrics.jsonl``'s object)."""
    dist, log = s.dist, print if s.dist.is_main else _silent
    random.seed(s.seed + dist.rank)
    torch.manual_seed(s.seed + dist.rank)
    set_numerics(s.threads, s.model.deterministic)
    log(_device_line(s))
    if s.mode == "benchmark":
        return benchmark_data(s, log)
    train_loader, val_loader = loaders.build_loaders(s.loader, dist)
    writer = None
    try:
        if s.mode == "train":  # a mid-epoch position, placed at this run's world size and -b
            checkpoint = place_resume(checkpoint, train_loader, s, log)
        recipe = resolve_recipe(s.recipe, s.loader.batch_size * dist.world_size,
                                len(train_loader), log)
        model = make_model(s, len(train_loader.classes), log)
        optimizer = make_optimizer(model, recipe.lr, s.recipe.momentum, s.recipe.weight_decay,
                                   dist.device, s.recipe.opt, recipe.decays)
        state = train_state(model, optimizer, s, recipe, len(train_loader.classes))
        start_epoch, best_acc1 = restore(checkpoint, state, s, len(train_loader), log)
        state.ema = make_ema(model, s, recipe, checkpoint, log)
        state.model = wrap_model(model, s, log)
        _say_data(s, train_loader, val_loader, log)
        if s.mode == "evaluate":
            stats, _ = validate(state, val_loader, EpochPlan(dist, s.output.print_freq),
                                s.flip_tta)
            log(f"val top-1 {stats['acc1']:.3f} top-5 {stats['acc5']:.3f} "
                f"loss {stats['loss']:.4f} ({stats['images']} images)")
            return stats
        writer = MetricsWriter(s.output.output_dir) if dist.is_main else None
        stop = StopAgreement(dist.world_size)

        def save(epoch: int, batch: int = 0, sums=None, is_best: bool = False) -> None:
            rng_states = gather_rng_states(dist)  # on every rank: a collective
            if dist.is_main:
                position = batch and train_loader.position(epoch, batch)
                save_checkpoint(checkpoint_state(state, s, epoch, best_acc1, rng_states, batch,
                                                 sums and sums.to_dict(), position),
                                is_best, s.output.output_dir)

        plan = EpochPlan(dist, s.output.print_freq, s.output.warmup, s.output.save_every, save,
                         writer, stop, machine_for(s.loader, dist.device.type))
        metrics = {}
        for epoch in range(start_epoch, s.recipe.epochs):
            if s.resolution.progressive:  # the crop side is a function of the epoch alone
                train_loader.set_resolution(s.resolution.at(epoch))
            resumed = checkpoint if epoch == start_epoch and "rest" in (checkpoint or {}) else None
            train = train_one_epoch(state, train_loader, epoch, plan, resumed)
            metrics = epoch_metrics(epoch, train, *validate(state, val_loader, plan, s.flip_tta),
                                    train_loader, dist.device)
            report_epoch(metrics, train["stages"], writer, s.loader.workers, log)
            best_acc1 = max(best_acc1, metrics["val_acc1"])
            save(epoch + 1, is_best=metrics["val_acc1"] >= best_acc1)
            if epoch + 1 < s.recipe.epochs and stop.settle():
                raise Stopped(stop.agreed, epoch + 1, 0)
        stop.close()
        return metrics
    finally:  # on every way out: the workers a loader keeps end with the run, not at exit
        if writer:
            writer.close()
        loaders.close_all(train_loader, val_loader)


def _device_line(s: RunSettings) -> str:
    """The run's first line after the launcher's: device, world size, decoders, seed, threads."""
    dist = s.dist
    group = f" ({torch.distributed.get_backend()} process group)" if dist.distributed else ""
    return (f"device: {dist.device}; world size {dist.world_size}{group}; decode: "
            f"{loaders.decoders_line(s.loader, dist.device)}; seed {s.seed}; "
            f"{torch.get_num_threads()} torch thread(s) in the main process")


def _say_data(s: RunSettings, train_loader, val_loader, log) -> None:
    """Log classes and batches, and an epoch that is not the flags' plain reading: one smaller
    batch (as pytorch/examples), or ``--ra-sampler`` off in one process (as torchvision)."""
    log(f"{s.model.arch}: {len(train_loader.classes)} classes; {s.loader.backend} loader: "
        f"{len(train_loader)} train / {len(val_loader)} val batches of {s.loader.batch_size} "
        "per process")
    batch = getattr(train_loader, "batch_size", s.loader.batch_size)
    if batch < s.loader.batch_size and s.mode == "train":
        log(f"training set has {batch} images per process, fewer than one batch of "
            f"{s.loader.batch_size}: each epoch trains on them as one batch of {batch}")
    if s.loader.ra_sampler and not s.dist.distributed and s.mode == "train":
        log("--ra-sampler: not in one process (torchvision's train.py uses its RASampler only "
            "when distributed): a plain shuffle")


def benchmark_data(s: RunSettings, log) -> dict:
    """``--benchmark-data``: time the training loader alone (to the normalised device batch,
    ``--random-erase`` included) for ``--train-batches`` batches (default: an epoch) after
    ``--benchmark-warmup``. Returns and logs as one JSON line ``loader``, ``decode_device``,
    ``images``, ``seconds``, ``images_per_sec`` (summed over ranks), ``workers``, ``batch_size``
    (per process), ``cpu_ms_per_image`` (rank 0's tree), ``cpu_count``, ``world_size``,
    ``device`` and rank 0's ``stages_*`` (:func:`engine.report.bounds.report`; its lines logged first)."""
    train_loader, val_loader = loaders.build_loaders(s.loader, s.dist)
    try:
        stats = loaders.measure_throughput(
            train_loader, s.output.benchmark_batches or len(train_loader), s.output.warmup)
        stages = stage_report(train_loader, None, machine_for(s.loader, s.dist.device.type),
                              stats.get("cpu_seconds"), stats["seconds"])
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
              "cpu_count": node_cores(), "world_size": s.dist.world_size,
              "device": str(s.dist.device), **stages["metrics"]}
    log("\n".join(stages["lines"] + [f"  try {line}" for line in stages["advice"]]))
    log(json.dumps(result))
    return result


if __name__ == "__main__":
    status = cli()
    ignore_stop_signals()  # the run is over: a late SIGUSR1/SIGTERM must not turn it into a kill
    sys.exit(status)
