"""Checkpoints: the pytorch/examples keys plus AMP scaler, config, seed, per-rank RNG states and
the position inside an epoch; written atomically, restored into a :class:`~engine.loop.TrainState`.
"""
from __future__ import annotations

import os
import random

import torch

from engine import ConfigError
from engine.distributed import unwrap
from loaders import DistInfo


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


def checkpoint_state(state, epoch: int, best_acc1: float, config: dict, seed: int,
                     rng_states: list[dict], batch: int = 0, partial: dict | None = None) -> dict:
    """The checkpoint of ``state`` (a :class:`~engine.loop.TrainState`).

    ``epoch`` is the epoch to run next and ``batch`` the batch of it to start with (0 at epoch
    ends; > 0 for a ``--save-every`` checkpoint, with ``partial``: the epoch's sums so far over
    all ranks, :meth:`EpochSums.to_dict`). ``config``: the command line as the user gave it
    (``vars(args)``); ``seed``: the seed the run resolved (drawn when ``--seed`` was not given);
    ``rng_states`` from :func:`~engine.distributed.gather_rng_states`."""
    return {
        "epoch": epoch, "batch": batch, "partial": partial,
        "arch": config["arch"], "state_dict": unwrap(state.model).state_dict(),
        "best_acc1": best_acc1, "optimizer": state.optimizer.state_dict(),
        "scheduler": state.scheduler.state_dict(), "scaler": state.scaler.state_dict(),
        "config": dict(config), "seed": seed, "rng": rng_states,
    }


def saved_seed(checkpoint: dict) -> int | None:
    """The seed a checkpoint's run used: its ``seed`` key, or (older checkpoints, whose
    ``config`` held the resolved per-process settings) ``config["seed"]``."""
    if checkpoint.get("seed") is not None:
        return checkpoint["seed"]
    return checkpoint.get("config", {}).get("seed")


def save_checkpoint(state: dict, is_best: bool, output_dir: str) -> None:
    """Write ``checkpoint.pth.tar`` (and ``model_best.pth.tar`` if ``is_best``) atomically: a
    temporary file in the same directory, then ``os.replace``, so a kill never leaves a torn
    file. Raises :class:`ConfigError` if the write fails (the previous file is kept)."""
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


def restore(checkpoint: dict, model, optimizer, scheduler, scaler, arch: str,
            dist: DistInfo) -> tuple[int, float]:
    """Load every state from ``checkpoint`` and this rank's RNG states; return
    ``(start_epoch, best_acc1)``: the epoch to run next and the best top-1 (%) so far.

    The loss scale is restored only where both runs scale (a checkpoint saved without
    float16 ``--amp`` holds an empty scaler state; this run then starts a fresh scale).
    Raises :class:`ConfigError` if the checkpoint holds another architecture than ``arch``."""
    if checkpoint["arch"] != arch:
        raise ConfigError(f"--resume: checkpoint is a {checkpoint['arch']}, not -a {arch}")
    unwrap(model).load_state_dict(checkpoint["state_dict"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    if scaler.is_enabled() and checkpoint.get("scaler"):
        scaler.load_state_dict(checkpoint["scaler"])
    restore_rng(checkpoint["rng"], dist)
    return int(checkpoint["epoch"]), float(checkpoint["best_acc1"])
