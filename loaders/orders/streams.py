"""Epoch orders over shards. DataLoader hands batch ``k`` to worker ``k % W``, so a rank's records
are cut into ``W`` *pieces* of whole batches interleaved in that rhythm: each stream is read once,
in order up to the shuffle buffer, by one worker."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..draws import keyed_rng
from .base import Order, batches_per_epoch, segment_runs


def _pieces(runs: list[tuple[int, int]], batches: int, batch_size: int, workers: int,
            total: int) -> list[list[tuple[int, int]]]:
    """Cut the concatenated ``runs`` (record ranges) into ``workers`` consecutive pieces: piece
    ``w`` holds batches ``w, w + W, ...`` of ``batches`` (the last one the rest of ``total``)."""
    sizes = [len(range(w, batches, workers)) * batch_size for w in range(workers)]
    if batches:  # the last batch, worker (batches - 1) % W's, holds the rest
        sizes[(batches - 1) % workers] -= batches * batch_size - total
    starts, stops = np.array(runs, dtype=np.int64).reshape(-1, 2).T
    ends = np.cumsum([0, *sizes]).tolist()
    return [segment_runs(starts, stops - starts, np.arange(len(runs)), lo, hi) if lo < hi else []
            for lo, hi in zip(ends, ends[1:])]


def _interleave(pieces: list[list[int]], batches: int, batch_size: int) -> list[int]:
    """Batch ``k`` is the next ``batch_size`` indices of piece ``k % W``: its ``k // W``-th."""
    out = []
    for k in range(batches):
        j, w = divmod(k, len(pieces))
        out.extend(pieces[w][j * batch_size:(j + 1) * batch_size])
    return out


def buffer_shuffle(indices: Sequence[int], buffer: int, rng: np.random.Generator) -> list[int]:
    """WebDataset's sample shuffle: a uniform pick of the ``buffer`` each time it is full."""
    out, held = [], []
    picks = iter(rng.random(len(indices)).tolist())
    for index in indices:
        held.append(index)
        if len(held) >= buffer:
            out.append(_pick(held, picks))
    while held:  # the stream's end: the rest drawn one by one
        out.append(_pick(held, picks))
    return out


def _pick(held: list[int], picks) -> int:
    """Remove and return the entry of ``held`` at the next uniform pick."""
    k = int(next(picks) * len(held))
    held[k], held[-1] = held[-1], held[k]
    return held.pop()


@dataclass(eq=False)
class StreamTrainOrder(Order):
    """Training order over shards (``counts`` records each): per epoch the shards permuted, rank
    ``r`` taking the ``r``-th segment's whole batches, a piece per worker shuffled through a
    ``buffer``. ``ValueError``: bad sizes or ranks."""

    counts: Sequence[int]
    batch_size: int
    workers: int
    rank: int = 0
    world_size: int = 1
    seed: int = 0
    buffer: int = 1000
    LAYOUT_KEYS = ("batch_size", "workers")
    SIZES = ("batch_size", "buffer")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.counts = np.asarray(self.counts, dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)
        self.workers = max(1, self.workers)
        self.num_samples = int(self.counts.sum())
        self.batches = self.num_samples // self.world_size // self.batch_size

    def __len__(self) -> int:
        return self.batches * self.batch_size

    def runs(self, epoch: int) -> list[tuple[int, int]]:
        """This rank's record ranges of ``epoch`` in reading order, ``len(self)`` records."""
        shards = keyed_rng(self.seed, epoch).permutation(len(self.counts))
        lo = self.rank * (self.num_samples // self.world_size)
        return segment_runs(self.starts, self.counts, shards, lo, lo + len(self))

    def pieces(self, epoch: int) -> list[list[tuple[int, int]]]:
        """Each worker's record ranges of ``epoch``, in the order it reads them."""
        return _pieces(self.runs(epoch), self.batches, self.batch_size, self.workers, len(self))

    def order(self, epoch: int) -> list[int]:
        shuffled = []
        for w, piece in enumerate(self.pieces(epoch)):
            rng = keyed_rng(self.seed, epoch, self.rank, w)
            indices = [i for start, stop in piece for i in range(start, stop)]
            shuffled.append(buffer_shuffle(indices, self.buffer, rng))
        return _interleave(shuffled, self.batches, self.batch_size)


@dataclass(eq=False)
class StreamValOrder(Order):
    """Validation: rank ``r`` of ``R`` reads ``[r*N//R, (r+1)*N//R)``, a piece per worker."""

    num_samples: int
    batch_size: int
    workers: int
    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        self.lo = self.rank * self.num_samples // self.world_size
        self.hi = (self.rank + 1) * self.num_samples // self.world_size
        self.workers = max(1, self.workers)
        self.batches = batches_per_epoch(self.hi - self.lo, self.batch_size, drop_last=False)

    def __len__(self) -> int:
        return self.hi - self.lo

    def pieces(self, epoch: int) -> list[list[tuple[int, int]]]:
        """Each worker's record ranges (the same every epoch), in the order it reads them."""
        return _pieces([(self.lo, self.hi)], self.batches, self.batch_size, self.workers,
                       len(self))

    def order(self, epoch: int) -> list[int]:
        ranges = [[i for start, stop in piece for i in range(start, stop)]
                  for piece in self.pieces(epoch)]
        return _interleave(ranges, self.batches, self.batch_size)
