"""Where a training pass stands in its epoch's *global order*, and how a resumed epoch goes on
at another world size, batch size or worker count.

Every training epoch has one global order of sample indices: position ``j x W + r`` is the
``j``-th index of rank ``r``'s order (:mod:`loaders.orders`) at the layout (:class:`Layout`:
``W`` processes, batch size, workers) the epoch began at, its *origin*. For :class:`~loaders.orders.RandomOrder` this is ``DistributedSampler``'s
permutation of ``(seed, epoch)`` itself, cut to a multiple of ``W``. Since every rank trains
its batches in step with the others, the samples trained after ``k`` steps of batch ``B`` are
always the global order's first ``k x B x W``: the position of a mid-epoch checkpoint is that
count (``consumed``), whatever the layout.

A resume at another layout deals the rest of the global order out again
(:func:`rest_of_epoch`): rank ``r'`` of ``W'`` takes positions ``consumed + r', consumed + r' +
W', ...``, the same count on every rank, in whole batches of the new size; what is left over
(fewer than ``W' x B'`` samples) sits out the epoch, as an uninterrupted epoch's tail does.
The trained samples stay a prefix of the global order, so none is trained twice and none is
skipped before that tail, after any number of such resumes. The pass numbers its first
batch ``start_batch = full - rest`` (``full``: the new layout's batches per epoch; ``rest``:
its batches left), so a resumed epoch ends at the same step count as an uninterrupted one at
the new layout and step-based schedules stand at the fraction of the epoch consumed (to
within one step).

``TRACE_ENV`` (a test hook): when set to a path, each training loader appends the dataset
indices of every batch it hands out to ``PATH.rankR`` (:class:`SampleTrace`).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

import numpy as np
import torch

from .random import RandomOrder

TRACE_ENV = "IMAGENET_FAST_TRACE_SAMPLES"


@dataclass(frozen=True)
class Layout:
    """How a training epoch is cut: ``world_size`` processes, ``batch_size`` samples per
    process and step, ``workers`` loader workers per process (orders over streamed shards
    depend on it, ``StreamTrainOrder``)."""

    world_size: int
    batch_size: int
    workers: int

    @classmethod
    def from_dict(cls, saved: dict) -> "Layout":
        """Raises ``KeyError``/``TypeError``/``ValueError`` for a malformed record."""
        return cls(int(saved["world_size"]), int(saved["batch_size"]), int(saved["workers"]))

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        return f"{self.world_size} process(es) x -b {self.batch_size} per process"


def order_depends_on(order, key: str) -> bool:
    """Whether ``order``'s indices change with ``key`` of the :class:`Layout` besides the world
    size (``batch_size``/``workers``: only orders over shards, which cut per-worker pieces)."""
    return key in getattr(order, "LAYOUT_KEYS", ())


def same_global_order(order, origin: Layout, now: Layout) -> bool:
    """Whether ``order`` at ``now`` reads the epoch exactly as at ``origin`` (then a resumed
    pass simply skips its first batches)."""
    return (origin.world_size == now.world_size and origin.batch_size == now.batch_size
            and (origin.workers == now.workers or not order_depends_on(order, "workers")))


def global_order(order, epoch: int, origin: Layout) -> np.ndarray:
    """The global order (int64 ``(W x len(order at W),)``) of ``epoch`` for ``order``'s kind at
    ``origin``: rank orders interleaved, position ``j x W + r`` = rank ``r``'s ``j``-th index.
    :class:`~loaders.orders.RandomOrder`'s is drawn directly (``LeanDistributedSampler``'s
    permutation, cut to a multiple of ``W``); the others are rebuilt rank by rank
    (``order.at(rank, layout)``), about one epoch's order of work in all."""
    w = origin.world_size
    if type(order) is RandomOrder:
        n = order.num_samples
        generator = torch.Generator()
        generator.manual_seed(order.seed + epoch)
        dtype = torch.int32 if n < 2**31 else torch.int64
        return torch.randperm(n, generator=generator, dtype=dtype).numpy().astype(
            np.int64)[:n // w * w]
    ranks = [np.fromiter(order.at(r, origin).order(epoch), dtype=np.int64) for r in range(w)]
    return np.stack(ranks, axis=1).reshape(-1)


@dataclass(frozen=True)
class RestOfEpoch:
    """A resumed epoch on this rank: its pass starts at batch ``start_batch`` (numbered as an
    uninterrupted pass at this layout would end at the same step) and reads ``indices``
    (dataset indices, whole batches; None: the order's own from ``start_batch`` on, the
    origin's layout being this one). ``consumed``: samples of the global order trained
    before; ``origin``: the layout that defines the epoch's global order."""

    epoch: int
    start_batch: int
    indices: list[int] | None
    consumed: int
    origin: Layout


def rest_of_epoch(order, epoch: int, consumed: int, origin: Layout, now: Layout,
                  rank: int) -> RestOfEpoch:
    """This rank's :class:`RestOfEpoch` after ``consumed`` samples of ``epoch``'s global order
    at ``origin``, for the layout ``now`` (``now.batch_size``: the loader's batch; ``order``:
    this rank's order at ``now``). Raises ``ValueError`` when ``consumed`` is not a count of
    that global order (another dataset or layout record)."""
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
    """The ``position`` a checkpoint saved before batch ``batch`` of ``epoch`` records: the
    samples of the epoch's global order consumed, its origin layout, the layout now, and
    what the global order is a function of (dataset size, seed, order kind) for checks."""
    if rest is not None and rest.epoch == epoch:
        consumed = rest.consumed + (batch - rest.start_batch) * now.world_size * now.batch_size
        origin = rest.origin
    else:
        consumed, origin = batch * now.world_size * now.batch_size, now
    return {"consumed": int(consumed), "origin": origin.to_dict(), "layout": now.to_dict(),
            "num_samples": int(order.num_samples), "seed": getattr(order, "seed", None),
            "order": type(order).__name__}


class PositionedLoader:
    """What a training loader adds to place its passes in the epoch's global order (mixed
    into every pipeline's loader). The loader sets ``position_order`` (its
    :class:`~loaders.orders.Order`), ``batch_size`` and ``rank``; its ``set_epoch(epoch,
    start_batch, rest)`` calls :meth:`_take_rest` and reads the indices it returns when not
    None; :meth:`pass_indices` is the loader's."""

    rest: RestOfEpoch | None = None

    @property
    def layout(self) -> Layout:
        """This loader's :class:`Layout` (``workers``: the order's own count of worker pieces,
        0 for orders that do not depend on it)."""
        order = self.position_order
        return Layout(order.world_size, self.batch_size, getattr(order, "workers", 0))

    def rest_of_epoch(self, epoch: int, consumed: int, origin: Layout) -> RestOfEpoch:
        """This rank's part of ``epoch`` after ``consumed`` samples of its global order at
        ``origin`` (:func:`rest_of_epoch`); raises ``ValueError`` as that does."""
        return rest_of_epoch(self.position_order, epoch, consumed, origin, self.layout,
                             self.rank)

    def position(self, epoch: int, batch: int) -> dict:
        """The checkpoint record of the position before batch ``batch`` of ``epoch``
        (:func:`position_record`)."""
        return position_record(self.position_order, self.layout, self.rest, epoch, batch)

    def _take_rest(self, epoch: int, start_batch: int, rest: RestOfEpoch | None):
        """Keep ``rest`` for the pass of ``(epoch, start_batch)`` it was planned for (else
        forget it); its indices, or None where the order's own are read."""
        fits = rest is not None and (rest.epoch, rest.start_batch) == (epoch, start_batch)
        self.rest = rest if fits else None
        return self.rest.indices if self.rest is not None else None


class TracedLoader:
    """A training loader whose batches' dataset indices go to a :class:`SampleTrace` as
    they are handed out; everything else is the loader's (``loader.pass_indices()`` gives a
    pass's indices)."""

    def __init__(self, loader, trace: "SampleTrace"):
        self.loader, self.trace = loader, trace
        self.epoch, self.start_batch = 0, 0

    def set_epoch(self, epoch: int, start_batch: int = 0, rest=None) -> None:
        self.epoch, self.start_batch = epoch, start_batch
        self.loader.set_epoch(epoch, start_batch, rest)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        indices = self.loader.pass_indices()
        for step, batch in enumerate(self.loader):
            self.trace.record(self.epoch, self.start_batch, indices, self.loader.batch_size,
                              step)
            yield batch

    def __getattr__(self, name):
        return getattr(self.loader, name)


class SampleTrace:
    """Test hook (:data:`TRACE_ENV`): appends one JSON line ``{"epoch", "batch", "indices"}``
    per training batch handed out (before it is trained) to ``PATH.rankR``, flushed at once so
    a SIGKILLed run keeps its lines. ``indices``: the dataset indices of the batch as the
    order gives them (before an unreadable sample's replacement)."""

    def __init__(self, path: str, rank: int):
        self.path = f"{path}.rank{rank}"

    @classmethod
    def from_env(cls, rank: int) -> "SampleTrace | None":
        path = os.environ.get(TRACE_ENV)
        return cls(path, rank) if path else None

    def record(self, epoch: int, start_batch: int, indices: list[int], batch_size: int,
               step: int) -> None:
        """Record batch ``start_batch + step`` of a pass over ``indices``."""
        chunk = indices[step * batch_size:(step + 1) * batch_size]
        with open(self.path, "a") as f:
            f.write(json.dumps({"epoch": epoch, "batch": start_batch + step,
                                "indices": [int(i) for i in chunk]}) + "\n")
