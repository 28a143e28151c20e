"""Block order (``--lmdb-order block``): training over record stores larger than the page cache.

The algorithm follows FFCV's ``QuasiRandom`` traversal order (https://github.com/libffcv/ffcv,
``ffcv/traversal_order/quasi_random.py``): shuffle *blocks* of consecutive records, shuffle the
records inside each block, and emit samples by drawing from a small buffer of open blocks. The
code here is written independently and differs in two ways: blocks are cut from the record
index (an LMDB written by ``folder2lmdb.py`` stores record ``i`` after record ``i-1``, so a
block is a contiguous byte range of ``data.mdb``), and the sharding over ranks happens on the
block sequence *before* the buffer shuffle, so that each rank reads whole blocks instead of
every ``world_size``-th sample of everyone's blocks.
"""
from __future__ import annotations

import numpy as np

from .base import check_rank


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
        """This order for ``rank`` of a :class:`~loaders.orders.positions.Layout`."""
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
