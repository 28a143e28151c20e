"""Epoch orders: which dataset indices one rank reads in an epoch, and in which order.

One interface, shared by the DataLoader backends (through :class:`ResumableSampler`) and DALI
(``loaders.pipelines.dali``), as FFCV's ``TraversalOrder``: an order has ``num_samples`` (the dataset's
size), ``len()`` (indices per epoch on this rank) and ``order(epoch)`` (those indices, an
iterable of Python ints, a pure function of the constructor's arguments and ``epoch``):

* :class:`RandomOrder`: training; the ``DistributedSampler(shuffle=True, drop_last=True)``
  permutation of ``(seed, epoch)``, this rank's shard, kept as a tensor (memory-lean).
* :class:`RepeatedAugmentationOrder`: training with ``--ra-sampler`` (torchvision's
  ``RASampler``); :func:`shuffled_order` picks it or :class:`RandomOrder`.
* :class:`BlockOrder`: training over record stores larger than the page cache
  (``--lmdb-order block``), below.
* :class:`ShardOrder`: validation; ``rank, rank + world_size, ...``, every sample once.

:func:`batches_per_epoch` is the one place the batch count of an epoch is computed,
:func:`train_batch_size` the one place a training batch is sized.

:class:`BlockOrder`'s algorithm follows FFCV's ``QuasiRandom`` traversal order
(https://github.com/libffcv/ffcv, ``ffcv/traversal_order/quasi_random.py``): shuffle *blocks* of
consecutive records, shuffle the records inside each block, and emit samples by drawing from a
small buffer of open blocks. The code here is written independently and differs in two ways:
blocks are cut from the record index (an LMDB written by ``folder2lmdb.py`` stores record ``i``
after record ``i-1``, so a block is a contiguous byte range of ``data.mdb``), and the sharding
over ranks happens on the block sequence *before* the buffer shuffle, so that each rank reads
whole blocks instead of every ``world_size``-th sample of everyone's blocks.
"""
from __future__ import annotations

import itertools
import math
from typing import Iterable, Iterator, Protocol

import numpy as np
import torch
from torch.utils.data import Sampler

from .contract import DataError, DistInfo, LoaderSettings, check_rank
from ._lean_sampler import LeanDistributedSampler


class Order(Protocol):
    """What every epoch order provides (see the module docstring)."""

    num_samples: int  # the dataset's size; indices are in 0..num_samples-1

    def __len__(self) -> int:
        """Indices this rank reads per epoch (the same for every epoch)."""

    def order(self, epoch: int) -> Iterable[int]:
        """This rank's indices of ``epoch``, in reading order."""


class RandomOrder:
    """Training order: for each epoch, exactly the indices (and their order) of
    ``DistributedSampler(range(num_samples), world_size, rank, shuffle=True, seed,
    drop_last=True)`` after ``set_epoch(epoch)``: a permutation drawn from ``seed + epoch``,
    trimmed to a multiple of ``world_size``, rank ``r`` taking every ``world_size``-th index
    from ``r``. ``len()`` is ``num_samples // world_size`` on every rank.

    Memory: the permutation is an int32 tensor while an epoch is read (4 bytes per index,
    :class:`~loaders._lean_sampler.LeanDistributedSampler`), never a list of Python ints (~50
    MB per process on ImageNet). Raises ``ValueError`` for a ``rank`` outside
    ``0..world_size-1``.
    """

    def __init__(self, num_samples: int, rank: int = 0, world_size: int = 1, seed: int = 0):
        check_rank(rank, world_size)
        self.num_samples, self.rank, self.world_size, self.seed = (num_samples, rank,
                                                                   world_size, seed)

    def __len__(self) -> int:
        return self.num_samples // self.world_size

    def at(self, rank: int, layout) -> "RandomOrder":
        """This order for ``rank`` of a :class:`~loaders.positions.Layout`."""
        return RandomOrder(self.num_samples, rank, layout.world_size, self.seed)

    def order(self, epoch: int) -> Iterator[int]:
        # Looked up at call time: benchmarks/bench_memory.py swaps in the stock sampler.
        sampler = LeanDistributedSampler(range(self.num_samples), num_replicas=self.world_size,
                                         rank=self.rank, shuffle=True, seed=self.seed,
                                         drop_last=True)
        sampler.set_epoch(epoch)
        return iter(sampler)


class ShardOrder:
    """Validation order: rank ``r`` of ``w`` reads indices ``r, r+w, r+2w, ...`` in order, in
    every epoch. Every sample is read exactly once across ranks and none is padded or repeated
    (unlike ``DistributedSampler``), so a metric summed over ranks equals the single-process
    one; ``len()`` may differ by one between ranks."""

    def __init__(self, num_samples: int, rank: int = 0, world_size: int = 1):
        check_rank(rank, world_size)
        self.num_samples, self.rank, self.world_size = num_samples, rank, world_size

    def __len__(self) -> int:
        return len(range(self.rank, self.num_samples, self.world_size))

    def order(self, epoch: int) -> range:
        return range(self.rank, self.num_samples, self.world_size)


def batches_per_epoch(samples: int, batch_size: int, drop_last: bool,
                      max_batches: int | None = None) -> int:
    """Batches of ``batch_size`` in an epoch of ``samples`` indices (``len()`` of an order):
    whole batches only with ``drop_last`` (training: no tiny last batch for BatchNorm), else
    the last one partial (validation); capped at ``max_batches`` (``--train-batches``)."""
    count = samples // batch_size if drop_last else -(-samples // batch_size)
    return count if max_batches is None else min(count, max_batches)


def train_batch_size(order: Order, batch_size: int) -> int:
    """The batch size of a training loader over ``order``: ``batch_size``, or all of an epoch's
    indices in one smaller batch when the order holds fewer (a training split smaller than one
    global batch trains as pytorch/examples' DataLoader does, which keeps the partial batch;
    every rank's order has the same length, so the batches stay equal). Raises
    :class:`DataError` if the order is empty (fewer images than processes)."""
    if len(order) == 0:
        raise DataError(f"training set has no image for this process ({order.num_samples} "
                        "images in all): use fewer processes or more images")
    return min(batch_size, len(order))


def shuffled_order(num_samples: int, settings: LoaderSettings, dist: DistInfo) -> Order:
    """A random-access reader's shuffled training order: :class:`RandomOrder`, or with
    ``--ra-sampler`` in a distributed run :class:`RepeatedAugmentationOrder` (torchvision's
    ``train.py`` samples with its ``RASampler`` only when distributed; one process reads
    :class:`RandomOrder`)."""
    if settings.ra_sampler and dist.distributed:
        return RepeatedAugmentationOrder(num_samples, settings.ra_reps, dist.rank,
                                         dist.world_size, settings.seed)
    return RandomOrder(num_samples, dist.rank, dist.world_size, settings.seed)


class RepeatedAugmentationOrder:
    """``--ra-sampler``: repeated augmentation (Hoffer et al. 2020, Berman et al. 2019), exactly
    torchvision's ``RASampler`` (``references/classification/sampler.py``, from DeiT's
    ``samplers.py``) at ``set_epoch(epoch)``, with this run's seed (torchvision's is 0).

    Per epoch: a permutation of ``range(num_samples)`` from a torch generator seeded with
    ``seed + epoch`` (as ``DistributedSampler``), each index repeated ``repetitions`` times in a
    row, padded from its start to ``ceil(num_samples x repetitions / world_size) x
    world_size``; rank ``r`` takes every ``world_size``-th from ``r`` (so the copies of an image
    go to different ranks) and keeps the first ``len(self) = floor(num_samples // 256 x 256 /
    world_size)``: RASampler's epoch, about one pass over the dataset in all, not
    ``repetitions`` passes (DeiT's 256 is a constant of the sampler, not the batch). The same
    length on every rank. Raises :class:`DataError` when that length is 0 (fewer than 256
    images), ``ValueError`` for ``repetitions`` < 1 or a bad rank."""

    def __init__(self, num_samples: int, repetitions: int = 3, rank: int = 0,
                 world_size: int = 1, seed: int = 0):
        check_rank(rank, world_size)
        if repetitions < 1:
            raise ValueError(f"repetitions must be >= 1, got {repetitions}")
        self.num_samples, self.repetitions = num_samples, repetitions
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.per_rank = math.ceil(num_samples * float(repetitions) / world_size)
        self.selected = int(math.floor(num_samples // 256 * 256 / world_size))
        if self.selected == 0:
            raise DataError(f"--ra-sampler: torchvision's RASampler reads floor({num_samples} "
                            f"// 256 x 256 / {world_size}) = 0 images per process of these "
                            f"{num_samples}: leave it out, or train on 256 images or more")

    def __len__(self) -> int:
        return self.selected

    def at(self, rank: int, layout) -> "RepeatedAugmentationOrder":
        """This order for ``rank`` of a :class:`~loaders.positions.Layout`."""
        return RepeatedAugmentationOrder(self.num_samples, self.repetitions, rank,
                                         layout.world_size, self.seed)

    def order(self, epoch: int) -> Iterator[int]:
        generator = torch.Generator()
        generator.manual_seed(self.seed + epoch)
        indices = torch.randperm(self.num_samples, generator=generator)
        indices = indices.repeat_interleave(self.repetitions)
        total = self.per_rank * self.world_size
        indices = torch.cat([indices, indices[:total - len(indices)]])
        mine = indices[self.rank:total:self.world_size][:self.selected]
        for chunk in mine.split(4096):
            yield from chunk.tolist()


class ResumableSampler(Sampler[int]):
    """The DataLoader face of an :class:`Order`: yields ``order.order(epoch)`` from position
    ``start`` on (``start`` = batches already trained on x batch size, for a run resumed from a
    mid-epoch checkpoint, ``--save-every``: none repeated, none skipped), or, when ``rest`` is
    set, those indices instead (a resumed epoch dealt anew from its global order at another
    layout, :func:`loaders.positions.rest_of_epoch`). ``set_epoch`` selects the epoch;
    ``len()`` counts only what is left."""

    def __init__(self, order: Order):
        self.order, self.epoch, self.start = order, 0, 0
        self.rest: list[int] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if self.rest is not None:
            return iter(self.rest)
        return itertools.islice(iter(self.order.order(self.epoch)), self.start, None)

    def __len__(self) -> int:
        if self.rest is not None:
            return len(self.rest)
        return max(0, len(self.order) - self.start)


class BlockOrder:
    """Training order that reads contiguous blocks of records in a shuffled order.

    Per epoch, with one generator seeded from ``(seed, epoch)`` and identical on every rank:

    1. the ``ceil(num_samples / block_size)`` blocks ``[b*block_size, (b+1)*block_size)`` are
       permuted, and their records concatenated in that order;
    2. the concatenation is cut into ``world_size`` consecutive segments of
       ``num_samples // world_size`` records, rank ``r`` taking segment ``r``; the last
       ``num_samples % world_size`` records are dropped for this epoch (as
       ``DistributedSampler(drop_last=True)`` does), so a segment is whole blocks plus at most
       one partial block at each end;
    3. each rank shuffles the records within each of its blocks and emits them by repeatedly
       picking one of ``buffer_blocks`` open blocks uniformly at random and taking its next
       record; an exhausted block is replaced by the rank's next block.

    Guarantees: the order is a pure function of ``(num_samples, block_size, buffer_blocks,
    seed, epoch, rank, world_size)``; within one epoch the ranks' shards are disjoint, each has
    exactly ``len(self) == num_samples // world_size`` indices, and no index occurs twice; at
    any moment a rank reads from at most ``buffer_blocks`` blocks, i.e. its page-cache working
    set is about ``buffer_blocks * block_size`` records.

    Trade-off: a batch only mixes records from the open blocks, so this is less random than a
    full permutation; if the records are stored sorted by class (``folder2lmdb.py`` without
    ``--shuffle-seed`` writes ImageFolder order), a batch sees few classes unless
    ``buffer_blocks * block_size`` spans many classes (``lmdb_records.warn_if_class_sorted``).

    Raises ``ValueError`` for ``block_size`` or ``buffer_blocks`` < 1, ``world_size`` < 1 or a
    ``rank`` outside ``0..world_size-1``.
    """

    def __init__(self, num_samples: int, block_size: int = 256, buffer_blocks: int = 8,
                 rank: int = 0, world_size: int = 1, seed: int = 0):
        if block_size < 1 or buffer_blocks < 1:
            raise ValueError(f"block_size and buffer_blocks must be >= 1, got {block_size}, "
                             f"{buffer_blocks}")
        check_rank(rank, world_size)
        self.num_samples = num_samples
        self.block_size = block_size
        self.buffer_blocks = buffer_blocks
        self.rank = rank
        self.world_size = world_size
        self.seed = seed

    def __len__(self) -> int:
        return self.num_samples // self.world_size

    def at(self, rank: int, layout) -> "BlockOrder":
        """This order for ``rank`` of a :class:`~loaders.positions.Layout`."""
        return BlockOrder(self.num_samples, self.block_size, self.buffer_blocks, rank,
                          layout.world_size, self.seed)

    def runs(self, epoch: int) -> list[tuple[int, int]]:
        """This rank's ``(start, stop)`` record ranges of ``epoch``, in reading order (before
        the within-block and buffer shuffles)."""
        return self._runs(self._rng(epoch))

    def order(self, epoch: int) -> list[int]:
        rng = self._rng(epoch)
        runs = self._runs(rng)
        return self._interleave(runs, rng)

    def _rng(self, epoch: int) -> np.random.Generator:
        # SeedSequence mixes the pair properly; seed*K+epoch schemes collide across seeds.
        return np.random.default_rng([self.seed & 0xFFFFFFFFFFFFFFFF, epoch])

    def _runs(self, rng: np.random.Generator) -> list[tuple[int, int]]:
        n, size = self.num_samples, self.block_size
        num_blocks = -(-n // size)
        order = rng.permutation(num_blocks)
        # Record offsets of each permuted block inside the concatenation.
        lengths = np.minimum(size, n - order * size)
        ends = np.cumsum(lengths)
        per_rank = len(self)
        lo, hi = self.rank * per_rank, (self.rank + 1) * per_rank
        runs = []
        first = int(np.searchsorted(ends, lo, side="right"))
        for b in range(first, num_blocks):
            block_lo = int(ends[b] - lengths[b])
            if block_lo >= hi:
                break
            start = int(order[b]) * size
            cut_lo, cut_hi = max(lo, block_lo), min(hi, int(ends[b]))
            runs.append((start + cut_lo - block_lo, start + cut_hi - block_lo))
        return runs

    def _interleave(self, runs: list[tuple[int, int]], rng: np.random.Generator) -> list[int]:
        blocks = [(start + rng.permutation(stop - start)).tolist() for start, stop in runs]
        picks = rng.random(len(self)).tolist()
        out: list[int] = []
        open_blocks: list[list[int]] = []
        cursors: list[int] = []
        next_block = 0
        for u in picks:
            while len(open_blocks) < self.buffer_blocks and next_block < len(blocks):
                open_blocks.append(blocks[next_block])
                cursors.append(0)
                next_block += 1
            k = int(u * len(open_blocks))
            block, pos = open_blocks[k], cursors[k]
            out.append(block[pos])
            if pos + 1 == len(block):
                # Swap-remove: the buffer's order carries no meaning, picks are uniform.
                open_blocks[k], cursors[k] = open_blocks[-1], cursors[-1]
                open_blocks.pop()
                cursors.pop()
            else:
                cursors[k] = pos + 1
        return out
