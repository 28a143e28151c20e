"""Process launch, the process group and the collectives of a (possibly) distributed run;
resolved values travel as arguments and in a frozen :class:`Job`, never in ``args``."""
from __future__ import annotations

import datetime
import multiprocessing
import os
import random
import warnings
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
from torch import nn

from engine import ConfigError
from engine.distributed import preempt
from engine.distributed.slurm import SlurmStep, gpu_for_task, launcher, slurm_step
from loaders import DistInfo


class ProcessFailed(Exception):
    """A spawned training process failed; it has printed its own message."""


@dataclass(frozen=True)
class Job:
    """This training process's place in the job: ``processes_per_node`` share the node's cores
    (``-j auto``); ``spawned`` by ``--multiprocessing-distributed``, whose ``-b``/``-j`` are node
    totals; ``dist_url`` None without a group; ``launcher``: what started it, in words."""

    dist: DistInfo
    processes_per_node: int = 1
    spawned: bool = False
    dist_url: str | None = None
    launcher: str = "none (one process)"


def use_cuda(no_accel: bool) -> bool:
    return torch.cuda.is_available() and not no_accel


def check_cuda(no_accel: bool) -> None:
    """Raise :class:`ConfigError` when the driver cannot run torch's CUDA build (torch would
    warn once and train on the CPU); call before anything else asks torch about CUDA."""
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
    """CUDA (GPU ``gpu``, else the current device) unless ``no_accel`` or none exists, made
    current. Raises :class:`ConfigError` for a GPU index that does not exist."""
    if not use_cuda(no_accel):
        if gpu is not None:
            raise ConfigError(f"--gpu {gpu}: no CUDA device available")
        return torch.device("cpu")
    if gpu is not None and gpu >= torch.cuda.device_count():
        raise ConfigError(f"--gpu {gpu}: only {torch.cuda.device_count()} CUDA device(s)")
    device = torch.device("cuda", gpu if gpu is not None else torch.cuda.current_device())
    torch.cuda.set_device(device)  # else synchronize(), new streams and events act on GPU 0
    return device


def check_gpu_flag(gpu: int | None, nproc: int) -> None:
    """Raise :class:`ConfigError` for ``--gpu`` with several processes per node: each uses its
    local rank's GPU (pytorch/examples would put all on GPU N: NCCL "Duplicate GPU detected")."""
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
    """Run ``target(local_rank, args, nproc, dist_url)`` (module-level) in ``nproc`` forkserver
    processes, passing on SIGUSR1/SIGTERM; as pytorch/examples, ``--world-size`` counts nodes and
    ``--rank`` is this node's (one node meets on a free localhost port). If one fails, the others
    are ended and this raises :class:`ProcessFailed` (:class:`~engine.distributed.preempt.Stopped` for
    :data:`~engine.distributed.preempt.STOP_EXIT`); :class:`ConfigError` for nodes without ``--dist-url``."""
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException, ProcessExitedException

    if max(args.world_size, 1) > 1 and not args.dist_url:
        raise ConfigError("--dist-url tcp://HOST:PORT is needed for more than one node")
    dist_url = args.dist_url or f"tcp://127.0.0.1:{free_port()}"
    # forkserver, not spawn: main.py's imports (3-7 s of CPU) are paid once, not per process;
    # the server never touches CUDA, so its forks may (Python's multiprocessing docs).
    context = mp.start_processes(target, args=(args, nproc, dist_url), nprocs=nproc, join=False,
                                 start_method="forkserver")
    try:
        with preempt.forward_stop_signals([p.pid for p in context.processes]):
            while not context.join():
                pass
    except ProcessExitedException as exc:
        if exc.exit_code == preempt.STOP_EXIT:
            raise preempt.Stopped(0) from None
        raise ProcessFailed(f"process {exc.error_index} failed; the job was stopped") from None
    except ProcessException as exc:
        raise ProcessFailed(f"process {exc.error_index} failed; the job was stopped") from None


def use_default_start_method() -> None:
    """Start this spawned process's DataLoader workers with the platform's default method, as
    one process does: the inherited forkserver would pickle each worker's dataset."""
    multiprocessing.set_start_method(None, force=True)


def setup_distributed(args, local_rank: int | None = None, nproc: int = 1,
                      dist_url: str | None = None) -> Job:
    """Join the process group if this is a distributed run; return this process's :class:`Job`.
    Ranks come from the launch, torchrun's or srun's variables, or ``--world-size``/``--rank``;
    as pytorch/examples, a spawned or torchrun process uses DDP even at world size 1. Raises
    :class:`ConfigError` for unusable device, backend or SLURM values."""
    place = _place(args, local_rank, nproc, dist_url)
    check_gpu_flag(args.gpu, place.nproc)
    gpu = args.gpu
    if place.step is not None and use_cuda(args.no_accel) and gpu is None:
        gpu = gpu_for_task(place.step, torch.cuda.device_count())
    spawned = local_rank is not None
    if not place.joins_group:
        return Job(DistInfo(device=resolve_device(gpu, args.no_accel)), place.nproc, spawned,
                   launcher=place.launcher)
    if gpu is None and use_cuda(args.no_accel):
        gpu = place.local_rank
    device = resolve_device(gpu, args.no_accel)
    backend = dist_backend(args.dist_backend, device.type == "cuda")
    if not place.url:
        raise ConfigError(f"--world-size {place.world} needs --dist-url (or launch with torchrun)")
    torch.distributed.init_process_group(
        backend, init_method=place.url, world_size=place.world, rank=place.rank,
        timeout=datetime.timedelta(seconds=args.dist_timeout))
    dist = DistInfo(rank=place.rank, world_size=place.world, local_rank=place.local_rank,
                    device=device, distributed=True)
    return Job(dist, place.nproc, spawned, place.url, place.launcher)


class _Place(NamedTuple):
    """Where :func:`_place` puts a process; ``nproc``: training processes on its node."""

    rank: int
    world: int
    local_rank: int
    nproc: int
    url: str | None
    joins_group: bool
    launcher: str
    step: SlurmStep | None = None


def _place(args, local_rank: int | None, nproc: int, dist_url: str | None) -> _Place:
    """This process's :class:`_Place`, by who started it (see :func:`setup_distributed`)."""
    env, url = os.environ, dist_url or args.dist_url
    if local_rank is not None:
        return _Place(max(args.rank, 0) * nproc + local_rank, max(args.world_size, 1) * nproc,
                      local_rank, nproc, url, True,
                      f"--multiprocessing-distributed ({nproc} processes on this node)")
    started_by = launcher(env)
    if started_by == "torchrun" and args.dist_url in (None, "env://"):
        return _Place(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)),
                      int(env.get("LOCAL_WORLD_SIZE", 1)), "env://", True,
                      f"torchrun ({env['WORLD_SIZE']} processes, "
                      f"{env.get('LOCAL_WORLD_SIZE', 1)} on this node)")
    if started_by == "srun":
        step = slurm_step(env)
        return _Place(step.rank, step.world_size, step.local_rank, step.tasks_on_node,
                      args.dist_url or step.url, step.world_size > 1, step.describe(), step=step)
    world = max(args.world_size, 1)
    if world > 1:
        described = f"by hand (--world-size {world} --rank {max(args.rank, 0)})"
    elif started_by == "sbatch":
        described = "none: one process in a SLURM batch script (srun starts one per task)"
    else:
        described = "none (one process)"
    return _Place(max(args.rank, 0), world, 0, nproc, url, world > 1, described)


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model inside ``torch.compile``'s wrapper and (Distributed)DataParallel."""
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model)


def wrap_parallel(model: nn.Module, dist: DistInfo, gpu: int | None, log) -> nn.Module:
    """DDP in a distributed run; pytorch/examples' DataParallel when one process sees several
    GPUs and no ``--gpu`` was given; else the model itself."""
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
    """Give every rank rank 0's buffers (BatchNorm statistics): all validate rank 0's model."""
    if dist.world_size > 1:
        for buffer in unwrap(model).buffers():
            torch.distributed.broadcast(buffer, src=0)


def rng_state(device: torch.device) -> dict:
    """This process's Python, torch CPU and own CUDA device (None on the CPU) RNG states."""
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


class StopAgreement:
    """Whether the ranks stop, the same answer on every rank after the same step (all ranks make
    the same calls): an all-reduce (MAX) of the signals on a gloo group of its own (no GPU wait,
    no mixing with DDP's NCCL), read a step later to hide its latency
    (benchmarks.training.stop_agreement)."""

    def __init__(self, world_size: int):
        self.agreed, self._pending = 0, None
        self.group = torch.distributed.new_group(backend="gloo") if world_size > 1 else None

    def after_step(self) -> int:
        """The agreed stop signal (0: go on). Call after every training step."""
        if self.agreed or self.group is None:
            self.agreed = self.agreed or preempt.received()
            return self.agreed
        self._read_pending()
        if not self.agreed:
            flag = torch.tensor([preempt.received()], dtype=torch.int32)
            work = torch.distributed.all_reduce(flag, torch.distributed.ReduceOp.MAX,
                                                group=self.group, async_op=True)
            self._pending = (work, flag)
        return self.agreed

    def settle(self) -> int:
        """The agreed stop signal now, signals since the last step included (blocking)."""
        if self.group is None:
            return self.after_step()
        self._read_pending()
        if not self.agreed:
            flag = torch.tensor([preempt.received()], dtype=torch.int32)
            torch.distributed.all_reduce(flag, torch.distributed.ReduceOp.MAX, group=self.group)
            self.agreed = int(flag.item())
        return self.agreed

    def _read_pending(self) -> None:
        if self._pending is not None:
            work, flag = self._pending
            work.wait()
            self._pending, self.agreed = None, self.agreed or int(flag.item())

    def close(self) -> None:
        """Finish the all-reduce in flight (before the process group is destroyed)."""
        if self.group is not None:
            self._read_pending()
