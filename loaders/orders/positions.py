"""Where a pass stands in its epoch's *global order* (the ranks' orders interleaved at its first
:class:`Layout`), and how a resume at another layout deals the rest out (none trained twice)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Iterator

import numpy as np

from .base import batches_per_epoch

TRACE_ENV = "IMAGENET_FAST_TRACE_SAMPLES"


@dataclass(frozen=True)
class Layout:
    """How a training epoch is cut: processes, samples per process and step, workers each."""

    world_size: int
    batch_size: int
    workers: int

    @classmethod
    def from_dict(cls, saved: dict) -> "Layout":
        """Raises ``KeyError``/``TypeError``/``ValueError`` for a malformed record."""
        return cls(*(int(saved[key]) for key in ("world_size", "batch_size", "workers")))

    def describe(self) -> str:
        return f"{self.world_size} process(es) x -b {self.batch_size} per process"


def same_global_order(order, origin: Layout, now: Layout) -> bool:
    """Whether ``order`` at ``now`` reads the epoch as at ``origin`` (a resume skips batches):
    the same world size, batch size, and worker count where the order cuts per-worker pieces."""
    keys = ("world_size", "batch_size", *order.LAYOUT_KEYS)
    return all(getattr(origin, key) == getattr(now, key) for key in keys)


def global_order(order, epoch: int, origin: Layout) -> np.ndarray:
    """``epoch``'s global order (int64 ``(W x len(order at W),)``) at ``origin``."""
    ranks = [np.fromiter(order.at(r, origin).order(epoch), dtype=np.int64)
             for r in range(origin.world_size)]
    return np.stack(ranks, axis=1).reshape(-1)


@dataclass(frozen=True)
class RestOfEpoch:
    """A resumed epoch on this rank: ``indices`` (None: the order's) from ``start_batch`` on."""

    epoch: int
    start_batch: int
    indices: list[int] | None
    consumed: int
    origin: Layout


def rest_of_epoch(order, epoch: int, consumed: int, origin: Layout, now: Layout,
                  rank: int) -> RestOfEpoch:
    """This rank's :class:`RestOfEpoch` at ``now`` after ``consumed`` samples of the global order
    at ``origin``. ``ValueError`` when ``consumed`` is not a count of that order."""
    if same_global_order(order, origin, now):
        per_step = now.world_size * now.batch_size
        if consumed % per_step:
            raise ValueError(f"{consumed} samples are not whole steps of {per_step}")
        return RestOfEpoch(epoch, consumed // per_step, None, consumed, origin)
    full = global_order(order, epoch, origin)
    if not 0 <= consumed <= len(full):
        raise ValueError(f"{consumed} samples consumed of an epoch of {len(full)}")
    rest = full[consumed:]
    batches = len(rest) // now.world_size // now.batch_size
    mine = rest[rank::now.world_size][:batches * now.batch_size]
    start = len(order) // now.batch_size - batches
    return RestOfEpoch(epoch, start, mine.tolist(), consumed, origin)


def position_record(order, now: Layout, rest: RestOfEpoch | None, epoch: int,
                    batch: int) -> dict:
    """A checkpoint's ``position`` before batch ``batch`` of ``epoch``."""
    consumed, origin = batch * now.world_size * now.batch_size, now
    if rest is not None and rest.epoch == epoch:
        consumed += rest.consumed - rest.start_batch * now.world_size * now.batch_size
        origin = rest.origin
    return {"consumed": int(consumed), "origin": asdict(origin), "layout": asdict(now),
            "num_samples": int(order.num_samples), "seed": getattr(order, "seed", None),
            "order": type(order).__name__}


class PositionedLoader:
    """Every loader's base: it sets ``position_order``, ``batch_size``, ``rank``, ``train`` and
    ``max_batches``, reads :attr:`rest_indices` where set, yields passes through
    :meth:`_delivered` and erases by :meth:`_eraser` after normalising; ``build_loaders`` sets
    ``erasing`` and ``trace``."""

    rest: RestOfEpoch | None = None
    erasing = None
    # Test hook (TRACE_ENV): a JSON line per training batch appended to this path (PATH.rankR)
    trace: str | None = None
    epoch = start_batch = 0

    def __len__(self) -> int:
        """The batches of the epoch on this rank from ``start_batch`` on."""
        total = batches_per_epoch(len(self.position_order), self.batch_size, self.train,
                                  self.max_batches)
        return max(0, total - self.start_batch)

    def set_epoch(self, epoch: int, start_batch: int = 0,
                  rest: RestOfEpoch | None = None) -> None:
        """``epoch`` from batch ``start_batch`` on; ``rest``: an epoch dealt anew at this
        layout, whose indices are read instead."""
        fits = rest is not None and (rest.epoch, rest.start_batch) == (epoch, start_batch)
        self.epoch, self.start_batch, self.rest = epoch, start_batch, rest if fits else None

    @property
    def rest_indices(self) -> list[int] | None:
        """The indices of the pass dealt anew (:attr:`rest`), or None: the order's."""
        return None if self.rest is None else self.rest.indices

    def _delivered(self, batches: Iterator) -> Iterator:
        """This pass's ``batches`` as the step gets them, traced where ``trace`` is set."""
        return batches if self.trace is None else self._traced(batches)

    def _traced(self, batches: Iterator) -> Iterator:
        indices, size = self.pass_indices(), self.batch_size
        try:
            for step, batch in enumerate(batches):
                chunk = [int(i) for i in indices[step * size:(step + 1) * size]]
                with open(self.trace, "a") as f:
                    f.write(json.dumps({"epoch": self.epoch, "batch": self.start_batch + step,
                                        "indices": chunk}) + "\n")
                yield batch
        finally:
            if hasattr(batches, "close"):
                batches.close()

    def _eraser(self):
        """None, or this pass's ``erase(images, number)``: batch ``number`` (float ``(N, C, H,
        W)``) erased in place as batch ``start_batch + number`` of the epoch, returned."""
        erasing, epoch, first = self.erasing, self.epoch, self.start_batch
        return None if erasing is None else (
            lambda images, number: erasing(images, epoch, first + number))

    @property
    def layout(self) -> Layout:
        """This loader's :class:`Layout` (``workers`` 0 for orders that do not depend on it)."""
        order = self.position_order
        return Layout(order.world_size, self.batch_size, getattr(order, "workers", 0))

    def rest_of_epoch(self, epoch: int, consumed: int, origin: Layout) -> RestOfEpoch:
        """:func:`rest_of_epoch` for this loader's order, layout and rank."""
        return rest_of_epoch(self.position_order, epoch, consumed, origin, self.layout,
                             self.rank)

    def position(self, epoch: int, batch: int) -> dict:
        """:func:`position_record` before batch ``batch`` of ``epoch``."""
        return position_record(self.position_order, self.layout, self.rest, epoch, batch)
