"""The shuffled training orders of random-access readers."""
from __future__ import annotations

import math
from typing import Iterator

import torch
from torch.utils.data import DistributedSampler

from ..errors import DataError
from ..settings import DistInfo, LoaderSettings
from .base import Order, check_rank

_CHUNK = 4096  # indices turned into Python ints at a time


class LeanDistributedSampler(DistributedSampler):
    """``DistributedSampler``'s indices from an int32 tensor (int64 from 2**31) in small chunks:
    4 bytes per index, not ``tolist()``'s ~36 (50 MB per process on ImageNet)."""

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)  # type: ignore[arg-type]
        # int32 gives the same permutation as torch's default int64 (same random draws).
        dtype = torch.int32 if n < 2**31 else torch.int64
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
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


class RandomOrder:
    """``DistributedSampler(range(num_samples), world_size, rank, shuffle=True, seed,
    drop_last=True)``'s indices per epoch. ``ValueError`` for a bad rank."""

    def __init__(self, num_samples: int, rank: int = 0, world_size: int = 1, seed: int = 0):
        check_rank(rank, world_size)
        self.num_samples, self.rank, self.world_size = num_samples, rank, world_size
        self.seed = seed

    def __len__(self) -> int:
        return self.num_samples // self.world_size

    def at(self, rank: int, layout) -> "RandomOrder":
        return RandomOrder(self.num_samples, rank, layout.world_size, self.seed)

    def order(self, epoch: int) -> Iterator[int]:
        # Looked up at call time: benchmarks/loading/memory.py swaps in the stock sampler.
        sampler = LeanDistributedSampler(range(self.num_samples), num_replicas=self.world_size,
                                         rank=self.rank, shuffle=True, seed=self.seed,
                                         drop_last=True)
        sampler.set_epoch(epoch)
        return iter(sampler)


class RepeatedAugmentationOrder:
    """``--ra-sampler``: repeated augmentation (Hoffer et al. 2020) as torchvision's ``RASampler``
    (DeiT's). Raises :class:`DataError` for no image per rank, ``ValueError`` for bad sizes."""

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
        return RepeatedAugmentationOrder(self.num_samples, self.repetitions, rank,
                                         layout.world_size, self.seed)

    def order(self, epoch: int) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + epoch)
        indices = torch.randperm(self.num_samples, generator=generator)
        indices = indices.repeat_interleave(self.repetitions)
        total = self.per_rank * self.world_size
        indices = torch.cat([indices, indices[:total - len(indices)]])
        mine = indices[self.rank:total:self.world_size][:self.selected]
        for chunk in mine.split(_CHUNK):
            yield from chunk.tolist()


def shuffled_order(num_samples: int, settings: LoaderSettings, dist: DistInfo) -> Order:
    """``--ra-sampler``'s order in a distributed run (as torchvision's), else RandomOrder."""
    if settings.ra_sampler and dist.distributed:
        return RepeatedAugmentationOrder(num_samples, settings.ra_reps, dist.rank,
                                         dist.world_size, settings.seed)
    return RandomOrder(num_samples, dist.rank, dist.world_size, settings.seed)
