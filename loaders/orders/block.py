"""Block order (``--lmdb-order block``) for stores larger than the page cache, after FFCV's
``QuasiRandom`` (written independently): a block of records is a byte range of ``data.mdb``."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..draws import keyed_rng
from .base import Order, segment_runs


@dataclass(eq=False)
class BlockOrder(Order):
    """Per epoch, with one generator seeded from ``(seed, epoch)`` on every rank: (1) the
    ``ceil(num_samples / block_size)`` blocks are permuted and their records concatenated; (2)
    rank ``r`` takes the ``r``-th of ``world_size`` consecutive segments of ``num_samples //
    world_size`` records (the rest sit out, as ``DistributedSampler(drop_last=True)``); (3) it
    shuffles the records within each of its blocks and emits them by picking one of
    ``buffer_blocks`` open blocks uniformly and taking its next record: about ``buffer_blocks *
    block_size`` records in the page cache, a batch mixing only the open blocks' (few classes
    where records are sorted by class). Raises ``ValueError`` for sizes below 1 or a bad rank."""

    num_samples: int
    block_size: int = 256
    buffer_blocks: int = 8
    rank: int = 0
    world_size: int = 1
    seed: int = 0
    SIZES = ("block_size", "buffer_blocks")

    def order(self, epoch: int) -> list[int]:
        rng = keyed_rng(self.seed, epoch)
        starts = np.arange(0, self.num_samples, self.block_size)
        runs = segment_runs(starts, np.minimum(self.block_size, self.num_samples - starts),
                            rng.permutation(len(starts)), self.rank * len(self),
                            (self.rank + 1) * len(self))
        # this rank's blocks, each shuffled and reversed: read by pop()
        blocks = [(start + rng.permutation(stop - start)).tolist()[::-1] for start, stop in runs]
        out, open_blocks, unopened = [], [], iter(blocks)
        for u in rng.random(len(self)).tolist():
            while len(open_blocks) < self.buffer_blocks and (block := next(unopened, None)):
                open_blocks.append(block)
            k = int(u * len(open_blocks))
            out.append(open_blocks[k].pop())
            if not open_blocks[k]:
                # Swap-remove: the buffer's order carries no meaning, picks are uniform.
                open_blocks[k] = open_blocks[-1]
                open_blocks.pop()
        return out
