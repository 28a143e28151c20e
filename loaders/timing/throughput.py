"""A loader's images/s and CPU seconds: ``main.py --benchmark-data`` and ``benchmarks/``."""
from __future__ import annotations

import glob
import itertools
import os
import time
from contextlib import suppress

import torch


def _batches(loader):
    """Batches of ``loader``, epoch after epoch."""
    for epoch in itertools.count():
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        yield from loader


def measure(loader, batches: int, warmup: int = 2) -> dict:
    """``warmup`` batches untimed, then ``batches`` timed: ``images``, ``seconds`` (wall, CUDA
    synchronised), ``images_per_sec``, ``cpu_seconds`` (:func:`tree_cpu_seconds`). Raises
    ``ValueError`` if ``batches`` < 1 or the loader has no batch."""
    if batches < 1 or len(loader) == 0:
        raise ValueError("need batches >= 1 and a loader with at least one batch")
    it = _batches(loader)
    for _ in range(warmup):
        next(it)
    if hasattr(loader, "reset_stages"):
        loader.reset_stages()
    cpu_start = tree_cpu_seconds()
    images, start = 0, time.perf_counter()
    for batch in itertools.islice(it, batches):
        images += len(batch[1]) if isinstance(batch, (tuple, list)) else len(batch)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    cpu_end = tree_cpu_seconds()
    cpu = None if cpu_start is None or cpu_end is None else cpu_end - cpu_start
    return {"images": images, "seconds": seconds, "images_per_sec": images / seconds,
            "cpu_seconds": cpu}


def tree_cpu_seconds() -> float | None:
    """CPU seconds (user + system) so far of this process and its live children (kept workers
    count); None without ``/proc``."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
        pids = {os.getpid()}
        for path in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
            with suppress(OSError), open(path) as f:  # a thread that ended meanwhile
                pids.update(int(pid) for pid in f.read().split())
        total = 0.0
        for pid in pids:
            with suppress(OSError), open(f"/proc/{pid}/stat") as f:  # a child that ended meanwhile
                fields = f.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        return total
    except (OSError, ValueError, IndexError):
        return None
