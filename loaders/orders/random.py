"""A ``DistributedSampler`` whose epoch permutation is a tensor, not a list of Python ints.

torch's ``DistributedSampler.__iter__`` turns the permutation into a Python list
(``torch.randperm(n).tolist()``), then copies it twice more while padding or trimming and
sharding; the main process holds that list for the whole epoch. On ImageNet (n = 1,281,167)
that is about 50 MB of int objects and pointers per training process (``benchmarks/
bench_memory.py`` measures it). :class:`LeanDistributedSampler` draws the same permutation as
an int32 tensor (4 bytes per index, 5 MB on ImageNet), pads/trims/shards with tensor views and
converts to Python ints one small chunk at a time, yielding exactly the same indices in the
same order as ``DistributedSampler`` with the same arguments, seed and epoch.
"""
from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import DistributedSampler

# Indices converted to Python ints at a time: small enough to be negligible memory, large
# enough that the per-chunk overhead does not matter next to loading a sample.
_CHUNK = 4096


class LeanDistributedSampler(DistributedSampler):
    """Drop-in for ``torch.utils.data.DistributedSampler`` (same constructor, ``set_epoch``,
    ``len()`` and index sequence) that keeps the epoch's permutation as a tensor.

    Memory in the process iterating it: 4 bytes per dataset index (8 above 2**31 - 1 records)
    instead of a list of Python ints (about 36 bytes per index).
    """

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)  # type: ignore[arg-type]
        # int32 gives the same permutation as torch's default int64 (same random draws).
        dtype = torch.int32 if n < 2**31 else torch.int64
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            indices = torch.randperm(n, generator=g, dtype=dtype)
        else:
            indices = torch.arange(n, dtype=dtype)
        if not self.drop_last and self.total_size > n:
            # Pad by repeating from the start, as DistributedSampler does.
            padding = self.total_size - n
            indices = torch.cat([indices, indices.repeat(-(-padding // n))[:padding]])
        shard = indices[self.rank:self.total_size:self.num_replicas]
        assert len(shard) == self.num_samples, (len(shard), self.num_samples)
        for chunk in shard.split(_CHUNK):
            yield from chunk.tolist()
