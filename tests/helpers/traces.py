"""Runs killed mid-epoch and resumed, and the samples each rank trained in them (the
``IMAGENET_FAST_TRACE_SAMPLES`` hook of :mod:`loaders.orders.positions`)."""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess

import torch

from loaders import DistInfo
from loaders.orders.positions import TRACE_ENV, Layout, global_order
from loaders.readers import open_reader
from tests.helpers.loading import loader_settings
from tests.helpers import warm
from tests.helpers.paths import REPO
from tests.helpers.runs import main_cmd, small_run


def layout_flags(nproc: int, batch: int, workers: int = 0) -> list[str]:
    """``main.py`` flags of ``nproc`` spawned CPU processes of ``batch`` images each (``-b``
    is the global batch under ``--multiprocessing-distributed``), ``workers`` each."""
    flags = small_run(batch=batch * nproc, workers=workers * nproc, seed=3, print_freq=1)
    if nproc > 1:
        flags += ["--multiprocessing-distributed", "--nproc-per-node", str(nproc)]
    return flags + ["--epochs", "1", "--save-every", "1"]


def epoch_order(source: str, train: str, nproc: int, batch: int, seed: int = 3) -> list[int]:
    """Epoch 0's global order (dataset indices) of reader ``source`` over split ``train`` at
    ``nproc`` processes of ``batch``, as the library defines it (seed 3: layout_flags')."""
    settings = loader_settings(source, None, train_path=train, batch_size=batch, seed=seed)
    order = open_reader(source, train, settings).train_order(settings, DistInfo(0, nproc))
    layout = Layout(nproc, batch, getattr(order, "workers", 0))
    return global_order(order, 0, layout).tolist()


def traced_env(trace: str) -> dict:
    return {**os.environ, TRACE_ENV: trace}


def kill_at_step(args: list[str], trace: str, step: int) -> None:
    """Run ``main.py ARGS`` (``-p 1``) and SIGKILL its process group once step ``step`` of
    epoch 0 was printed."""
    proc = warm.Popen(main_cmd(*args), cwd=REPO, stdout=subprocess.PIPE,
                      stderr=subprocess.DEVNULL, text=True, start_new_session=True,
                      env=traced_env(trace))
    for line in proc.stdout:
        if line.startswith(f"Epoch: [0][{step}/") or line.startswith(f"Epoch: [0][ {step}/"):
            os.killpg(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=60)
    proc.stdout.close()


def traced_batches(trace: str, epoch: int = 0, before: int | None = None) -> list[list[int]]:
    """The batches (dataset indices) the ranks of a traced run handed out in ``epoch``, rank
    by rank, batch by batch; ``before``: only batches numbered below it (a killed run: those
    its checkpoint counts as trained)."""
    batches = []
    for path in sorted(glob.glob(f"{trace}.rank*")):
        with open(path) as f:
            rows = [json.loads(line) for line in f]
        batches += [row["indices"] for row in rows if row["epoch"] == epoch
                    and (before is None or row["batch"] < before)]
    return batches


def saved_position(out: str) -> dict:
    """The ``batch`` and ``position`` of the checkpoint in ``out``."""
    checkpoint = torch.load(os.path.join(out, "checkpoint.pth.tar"), weights_only=True)
    return {"batch": checkpoint["batch"], **checkpoint.get("position", {})}


def step_lrs(out: str) -> dict[int, float]:
    """``step/lr`` of a run's TensorBoard events: global step -> LR."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(os.path.join(out, "tensorboard"))
    events.Reload()
    return {e.step: e.value for e in events.Scalars("step/lr")}
