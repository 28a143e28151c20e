"""What one training process derives from the command line, once: :class:`RunSettings`. The
argparse namespace is only read here (and in ``main.py`` above ``run``), never written."""
from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

import loaders
from engine import ConfigError
from engine.distributed.processes import Job, broadcast_int
from engine.recipe.reference import RecipeSettings
from engine.recipe.resolution import ResolutionSchedule, resolution_schedule
from loaders import LoaderSettings
from models import weights_eval_sizes


def node_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def resolve_workers(workers: int | str, processes_per_node: int = 1) -> int:
    """``-j``: a number as it is; ``auto`` -> :func:`node_cores` over the node's processes, at
    least 1 (none left for the training process: docs/loaders.md, *Workers*)."""
    if workers != "auto":
        return workers
    return max(1, node_cores() // max(1, processes_per_node))


def main_threads(device_type: str, runs_model: bool, processes_per_node: int = 1,
                 environ=os.environ) -> int | None:
    """Torch intra-op threads for a training process's main thread, or None to keep torch's
    (``OMP_NUM_THREADS`` set, as torchrun does). With the model on a GPU, or none, 1: more
    OpenMP threads spin on the workers' cores (docs/performance.md, *Loader throughput*); a
    model on the CPU gets the node's cores over its processes (*Main-process threads*)."""
    if environ.get("OMP_NUM_THREADS"):
        return None
    if device_type != "cpu" or not runs_model:
        return 1
    cores = node_cores()
    return max(1, cores // max(1, processes_per_node))


def resolve_backend(args) -> tuple[str, bool]:
    """``(backend, lmdb)``: the :data:`loaders.BACKENDS` key and whether the splits are LMDBs
    (DALI reads them too). Raises :class:`ConfigError` for ``--lmdb`` with another backend."""
    lmdb = args.lmdb or args.loader == "lmdb"
    if args.dummy:
        return "synthetic", False
    if args.dali or args.loader == "dali":
        return "dali", lmdb
    if args.lmdb and args.loader not in ("folder", "lmdb"):  # --dali --loader shards: DALI
        raise ConfigError(f"--lmdb conflicts with --loader {args.loader}")
    return ("lmdb" if lmdb else args.loader), lmdb


@dataclass(frozen=True)
class ModelSettings:
    """The "model" flags and ``--gpu`` (None lets one process that sees several GPUs use
    them all through DataParallel); ``deterministic`` is ``--use-deterministic-algorithms``."""

    arch: str
    pretrained: bool = False
    blurpool: bool = False
    channels_last: bool = False
    compile: bool = False
    amp: bool = False
    amp_dtype: str = "float16"
    gpu: int | None = None
    weights: str | None = None
    sync_bn: bool = False
    deterministic: bool = False


@dataclass(frozen=True)
class OutputSettings:
    """The "output" flags; ``benchmark_batches``: ``--benchmark-data``'s ``--train-batches``;
    ``config``: a copy of ``vars(args)``, which checkpoints record."""

    output_dir: str
    print_freq: int
    save_every: int
    warmup: int
    benchmark_batches: int | None = None
    config: dict = field(default_factory=dict)


MODES = ("train", "evaluate", "benchmark")  # what run() does: train, -e, --benchmark-data


def run_mode(args) -> str:
    """The run's one of :data:`MODES`: ``--benchmark-data`` wins over ``-e``."""
    return "benchmark" if args.benchmark_data else "evaluate" if args.evaluate else "train"


def saved_seed(checkpoint: dict) -> int | None:
    """The seed a checkpoint's run used: its ``seed`` key, else ``config["seed"]``, else None."""
    if checkpoint.get("seed") is not None:
        return int(checkpoint["seed"])
    config = checkpoint.get("config")
    return config.get("seed") if isinstance(config, dict) else None


@dataclass(frozen=True)
class RunSettings:
    """What one training process derives from the command line. ``seed``: given, saved in the
    resumed checkpoint, or drawn by rank 0; ``loader``: per-process ``-b`` and ``-j``;
    ``resume``: the checkpoint path (``auto`` resolved; None: fresh)."""

    job: Job
    seed: int
    mode: str
    loader: LoaderSettings
    model: ModelSettings
    recipe: RecipeSettings
    output: OutputSettings
    resolution: ResolutionSchedule
    threads: int | None = None
    flip_tta: bool = False
    resume: str | None = None

    @property
    def dist(self) -> loaders.DistInfo:
        return self.job.dist


def resolve_settings(args, job: Job, checkpoint: dict | None,
                     resume: str | None = None) -> RunSettings:
    """This process's :class:`RunSettings` (``checkpoint``: the one read from ``resume``); a
    collective without ``--seed``. Raises :class:`ConfigError` or :class:`~loaders.DataError`."""
    backend, lmdb = resolve_backend(args)
    seed = args.seed
    if seed is None:
        seed = saved_seed(checkpoint) if checkpoint else None
        seed = broadcast_int(random.randrange(2**31) if seed is None else seed, job.dist)
    resolution = resolution_schedule(args)
    loader = _loader_settings(args, job, backend, lmdb, seed, resolution)
    mode = run_mode(args)
    model = ModelSettings(
        arch=args.arch, pretrained=args.pretrained, blurpool=args.blurpool,
        channels_last=args.channels_last, compile=args.compile, amp=args.amp,
        amp_dtype=args.amp_dtype, gpu=args.gpu, weights=args.weights, sync_bn=args.sync_bn,
        deterministic=args.use_deterministic_algorithms)
    output = OutputSettings(
        output_dir=args.output_dir, print_freq=args.print_freq, save_every=args.save_every,
        warmup=args.benchmark_warmup,
        benchmark_batches=args.train_batches if mode == "benchmark" else None,
        config=dict(vars(args)))
    threads = main_threads(job.dist.device.type, mode != "benchmark", job.processes_per_node)
    return RunSettings(
        job=job, seed=seed, mode=mode, loader=loader, model=model,
        recipe=RecipeSettings.from_args(args), output=output, resolution=resolution,
        threads=threads, flip_tta=args.val_flip_tta, resume=resume)


def data_root(args) -> str | None:
    """The dataset root: the positional ``DIR`` or torchvision's ``--data-path``. Raises
    :class:`ConfigError` if both are given and differ."""
    if args.data and args.data_path and args.data != args.data_path:
        raise ConfigError(f"DIR {args.data} and --data-path {args.data_path}: give one")
    return args.data or args.data_path


def val_transform_sizes(args) -> tuple[int, int, str]:
    """``(val resize, val crop, interpolation)``: the flags', or with ``--weights`` and ``-e``
    the weights' own ``transforms()``' (as torchvision's ``train.py``)."""
    if args.weights and args.evaluate:
        return weights_eval_sizes(args.arch, args.weights)
    return args.val_resize_size, args.val_crop_size, args.interpolation


def _loader_settings(args, job: Job, backend: str, lmdb: bool, seed: int,
                     resolution: ResolutionSchedule) -> LoaderSettings:
    """The loaders' settings: ``-b``/``-j`` per process, paths, caps, the image dtype."""
    nproc = job.processes_per_node
    batch_size, workers = args.batch_size, args.workers
    if job.spawned:
        batch_size //= nproc
        workers = workers if workers == "auto" else (workers + nproc - 1) // nproc
    paths = (None, None) if backend == "synthetic" else loaders.split_paths(
        data_root(args), args.train, args.val)
    val_resize, val_crop, interpolation = val_transform_sizes(args)
    return LoaderSettings(
        backend=backend, train_path=paths[0], val_path=paths[1], batch_size=batch_size,
        workers=resolve_workers(workers, nproc), seed=seed, lmdb=lmdb,
        # batch slots are sized once for the largest side; each epoch sets its own
        train_crop_size=resolution.min_res, train_max_crop_size=resolution.max_res,
        val_resize_size=val_resize, val_crop_size=val_crop,
        # --benchmark-data's timed batches run on past a capped epoch's end
        train_batches=None if args.benchmark_data else args.train_batches,
        val_batches=args.val_batches, max_bad_share=args.max_bad_share,
        channels_last=args.channels_last,
        dtype=loaders.input_dtype(args.amp, args.amp_dtype, job.dist.device),
        lmdb_order=args.lmdb_order, lmdb_block_size=args.lmdb_block_size,
        lmdb_buffer_blocks=args.lmdb_buffer_blocks, lmdb_readahead=args.lmdb_readahead,
        dali_cpu=args.dali_cpu, dali_hw_decoder_load=args.dali_hw_decoder_load,
        shards=args.loader == "shards", auto_augment=args.auto_augment,
        ra_magnitude=args.ra_magnitude, augmix_severity=args.augmix_severity,
        interpolation=interpolation, ra_sampler=args.ra_sampler, ra_reps=args.ra_reps,
        random_erase=args.random_erase,
        decode_device=_decode_device(args, backend, interpolation),
        hw_decoder_load=args.hw_decoder_load, allow_cpu_decode=args.allow_cpu_decode,
        shard_retries=args.shard_retries, shard_retry_delay=args.shard_retry_delay,
        max_image_pixels=args.max_image_pixels)


def _decode_device(args, backend: str, interpolation: str) -> str:
    """``--decode-device``, checked against the flags it conflicts with (:class:`ConfigError`)."""
    device = args.decode_device
    if device != "cpu" and backend in ("dali", "synthetic"):
        raise ConfigError(f"--decode-device {device} conflicts with "
                          f"{'--dali' if backend == 'dali' else '--dummy'}")
    if device != "cpu" and args.auto_augment:
        raise ConfigError(f"--decode-device {device} with --auto-augment: the policy runs in "
                          "the CPU workers; leave out --decode-device")
    if device != "cpu" and interpolation != "bilinear":
        raise ConfigError(f"--decode-device {device} resizes bilinear only, not "
                          f"--interpolation {interpolation}")
    load = args.hw_decoder_load
    if load is not None and not 0.0 <= load <= 1.0:
        raise ConfigError(f"--hw-decoder-load {load}: a share of each batch, 0 to 1")
    return device
