"""Runs killed mid-epoch and resumed, and the samples each rank trained in them (the
``IMAGENET_FAST_TRACE_SAMPLES`` hook of :mod:`loaders.orders.positions`)."""
from __future__ import annotations

import glob
import json
import os

import torch

from loaders import DistInfo
from loaders.orders.positions import TRACE_ENV, Layout, global_order
from loaders.readers import open_reader
from tests.helpers.loading import loader_settings
from tests.helpers.ranks import Ranks
from tests.helpers.runs import small_run


def layout_flags(batch: int, workers: int = 0) -> list[str]:
    """``main.py`` flags of one epoch at ``batch`` images and ``workers`` DataLoader workers per
    process (as torchrun's ranks take them: :mod:`tests.helpers.ranks`), checkpointed at every
    step."""
    flags = small_run(batch=batch, workers=workers, seed=3, print_freq=1)
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


def kill_at_step(args: list[str], trace: str, step: int, world: int = 1) -> None:
    """Run ``main.py ARGS`` (``-p 1``) and SIGKILL it, workers and ranks, once step ``step``
    of epoch 0 was printed: in ``world`` ranks as torchrun starts them
    (:class:`tests.helpers.ranks.Ranks`; 1: one process, whose ``--multiprocessing-distributed``
    in ``args`` starts its own)."""
    with Ranks(args, world, traced_env(trace)) as ranks:
        printed = ranks.wait_for_line((f"Epoch: [0][{step}/", f"Epoch: [0][ {step}/"))
        ranks.kill()
        assert printed, ranks.output(0, "err")[-2000:]


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
