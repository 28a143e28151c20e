"""Loader throughput measurement shared by ``main.py --benchmark-data`` and ``benchmarks/``."""
from __future__ import annotations

import itertools
import time

import torch


def _batches(loader, start_epoch: int = 0):
    """Batches of ``loader`` over as many epochs as asked for (``set_epoch`` between epochs)."""
    for epoch in itertools.count(start_epoch):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        yield from loader


def measure(loader, batches: int, warmup: int = 2) -> dict:
    """Iterate ``warmup`` batches untimed, then ``batches`` timed batches (cycling epochs if
    the loader is shorter), touching every batch so lazy work is done.

    Returns ``images`` (timed), ``seconds`` (wall clock) and ``images_per_sec``. On CUDA the
    clock stops after ``torch.cuda.synchronize()`` so queued copies are counted.
    Raises ``ValueError`` if ``batches`` < 1 or the loader has no batch.
    """
    if batches < 1 or len(loader) == 0:
        raise ValueError("need batches >= 1 and a loader with at least one batch")
    it = _batches(loader)
    for _ in range(warmup):
        next(it)
    images, start = 0, time.perf_counter()
    for batch in itertools.islice(it, batches):
        images += len(batch[1]) if isinstance(batch, (tuple, list)) else len(batch)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {"images": images, "seconds": seconds, "images_per_sec": images / seconds}
