"""Process launch, the process group, and the collectives of a (possibly) distributed run.

Nothing here writes to the command line's namespace: :func:`setup_distributed` returns this
process's place in the job as a frozen :class:`Job`, and :func:`launch_processes` hands the
values it resolves (processes per node, rendezvous URL) to each process as arguments.
"""
from __future__ import annotations

import datetime
import os
import random
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from engine import ConfigError
from loaders import DistInfo


class ProcessFailed(Exception):
    """A spawned training process failed; it has printed its own message."""


@dataclass(frozen=True)
class Job:
    """This training process's place in the job, resolved once by :func:`setup_distributed`.

    ``dist``: global rank, world size, local rank, device, whether a process group was joined.
    ``processes_per_node``: training processes sharing this node's cores (``-j auto``).
    ``spawned``: started by ``--multiprocessing-distributed``, whose ``-b``/``-j`` are the
    node's totals to divide among its processes. ``dist_url``: the rendezvous used (None
    without a process group)."""

    dist: DistInfo
    processes_per_node: int = 1
    spawned: bool = False
    dist_url: str | None = None


def use_cuda(no_accel: bool) -> bool:
    return torch.cuda.is_available() and not no_accel


def check_cuda(no_accel: bool) -> None:
    """Stop with one line when this machine's NVIDIA driver cannot run torch's CUDA build (too
    old, or broken): torch would otherwise train on the CPU with only a warning. Must run
    before anything else asks torch about CUDA (torch warns once per process). ``--no-accel``
    trains on the CPU on purpose. Raises :class:`ConfigError`."""
    if no_accel or torch.version.cuda is None:
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


def resolve_device(gpu: int | None, no_accel: bool) -> torch.device:
    """CUDA (GPU ``gpu``, else the current device) unless ``no_accel`` or none exists; made
    the current device. Raises :class:`ConfigError` for a GPU index that does not exist."""
    if not use_cuda(no_accel):
        if gpu is not None:
            raise ConfigError(f"--gpu {gpu}: no CUDA device available")
        return torch.device("cpu")
    if gpu is not None and gpu >= torch.cuda.device_count():
        raise ConfigError(f"--gpu {gpu}: only {torch.cuda.device_count()} CUDA device(s)")
    device = torch.device("cuda", gpu if gpu is not None else torch.cuda.current_device())
    # Make it the current device: otherwise torch.cuda.synchronize(), new streams and events
    # (the throughput timer, the side-stream copy) would act on GPU 0.
    torch.cuda.set_device(device)
    return device


def check_gpu_flag(gpu: int | None, nproc: int) -> None:
    """``--gpu N`` names one GPU; with several training processes per node each must use the GPU
    of its local rank (pytorch/examples would put them all on GPU N: NCCL "Duplicate GPU
    detected"). Raises :class:`ConfigError` for that combination."""
    if gpu is not None and nproc > 1:
        raise ConfigError(f"--gpu {gpu} with {nproc} processes per node would put every rank "
                          "on one GPU: each process uses the GPU of its local rank; drop --gpu "
                          "(CUDA_VISIBLE_DEVICES selects the node's GPUs)")


def dist_backend(requested: str | None, cuda: bool) -> str:
    """``--dist-backend``, else NCCL with CUDA and gloo without; NCCL without CUDA is a
    :class:`ConfigError`."""
    backend = requested or ("nccl" if cuda else "gloo")
    if backend == "nccl" and not cuda:
        raise ConfigError("--dist-backend nccl needs CUDA; use gloo on CPU")
    return backend


def free_port() -> int:
    """A TCP port free on localhost now (for a single node's rendezvous)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_processes(target: Callable, args, nproc: int) -> None:
    """``--multiprocessing-distributed``: run ``target(local_rank, args, nproc, dist_url)`` in
    ``nproc`` spawned processes (``target`` must be a module-level function).

    As pytorch/examples: ``--world-size`` counts nodes and ``--rank`` is this node's rank.
    Without ``--dist-url`` one node rendezvous on a free localhost port. If one process fails,
    ``torch.multiprocessing`` ends the others and this raises :class:`ProcessFailed`;
    :class:`ConfigError` for several nodes without ``--dist-url``.
    """
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    if max(args.world_size, 1) > 1 and not args.dist_url:
        raise ConfigError("--dist-url tcp://HOST:PORT is needed for more than one node")
    dist_url = args.dist_url or f"tcp://127.0.0.1:{free_port()}"
    try:
        mp.spawn(target, args=(args, nproc, dist_url), nprocs=nproc, join=True)
    except ProcessException as exc:
        raise ProcessFailed(f"process {exc.error_index} failed; the job was stopped") from None


def setup_distributed(args, local_rank: int | None = None, nproc: int = 1,
                      dist_url: str | None = None) -> Job:
    """Join the process group if this is a distributed run; return this process's :class:`Job`.

    A spawned process (``local_rank`` given, ``dist_url`` from the launcher) has global rank
    ``node_rank * nproc + local_rank``; under torchrun (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``
    set, ``--dist-url env://`` or none) the environment says; a hand-launched process gives
    ``--world-size`` and ``--rank``. As in pytorch/examples, a process started by
    ``--multiprocessing-distributed`` or torchrun joins a process group and trains with DDP
    even at world size 1. Raises :class:`ConfigError` for unusable device or backend flags.
    """
    env, spawned = os.environ, local_rank is not None
    joins_group, url = True, dist_url or args.dist_url
    if spawned:
        rank, world = max(args.rank, 0) * nproc + local_rank, max(args.world_size, 1) * nproc
    elif "RANK" in env and "WORLD_SIZE" in env and args.dist_url in (None, "env://"):
        rank, world, url = int(env["RANK"]), int(env["WORLD_SIZE"]), "env://"
        local_rank, nproc = int(env.get("LOCAL_RANK", 0)), int(env.get("LOCAL_WORLD_SIZE", 1))
    else:
        rank, world, local_rank = max(args.rank, 0), max(args.world_size, 1), 0
        joins_group = world > 1
    check_gpu_flag(args.gpu, nproc)
    if not joins_group:
        return Job(DistInfo(device=resolve_device(args.gpu, args.no_accel)), nproc, spawned)
    gpu = local_rank if args.gpu is None and use_cuda(args.no_accel) else args.gpu
    device = resolve_device(gpu, args.no_accel)
    backend = dist_backend(args.dist_backend, device.type == "cuda")
    if not url:
        raise ConfigError(f"--world-size {world} needs --dist-url (or launch with torchrun)")
    torch.distributed.init_process_group(
        backend, init_method=url, world_size=world, rank=rank,
        timeout=datetime.timedelta(seconds=args.dist_timeout))
    dist = DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=device,
                    distributed=True)
    return Job(dist, nproc, spawned, url)


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model inside ``torch.compile``'s wrapper and DataParallel /
    DistributedDataParallel (state_dict keys without ``_orig_mod.`` or ``module.``)."""
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model)


def wrap_parallel(model: nn.Module, dist: DistInfo, gpu: int | None, log) -> nn.Module:
    """DistributedDataParallel in a distributed run; pytorch/examples' DataParallel fallback
    when one process sees several GPUs and no ``--gpu`` was given; else the model itself."""
    if dist.distributed:
        ids = [dist.device.index] if dist.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)
    if dist.device.type == "cuda" and gpu is None and torch.cuda.device_count() > 1:
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
