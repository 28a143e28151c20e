"""The shuffled training orders of random-access readers."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import torch

from ..errors import DataError
from ..settings import DistInfo, LoaderSettings
from .base import Order

_CHUNK = 4096  # indices turned into Python ints at a time


def _ints(indices: torch.Tensor) -> Iterator[int]:
    """``indices`` as Python ints, a chunk at a time: 4 bytes per index of an int32 tensor held,
    not a list's ~36 (50 MB per process on ImageNet)."""
    for chunk in indices.split(_CHUNK):
        yield from chunk.tolist()


@dataclass(eq=False)
class RandomOrder(Order):
    """``DistributedSampler(range(num_samples), world_size, rank, shuffle=True, seed,
    drop_last=True)``'s indices per epoch, its permutation drawn as int32 (int64 from 2**31: the
    same draws as its int64). ``ValueError`` for a bad rank."""

    num_samples: int
    rank: int = 0
    world_size: int = 1
    seed: int = 0

    def order(self, epoch: int) -> Iterator[int]:
        n = self.num_samples
        generator = torch.Generator().manual_seed(self.seed + epoch)
        indices = torch.randperm(n, generator=generator,
                                 dtype=torch.int32 if n < 2**31 else torch.int64)
        return _ints(indices[self.rank:len(self) * self.world_size:self.world_size])


@dataclass(eq=False)
class RepeatedAugmentationOrder(Order):
    """``--ra-sampler``: repeated augmentation (Hoffer et al. 2020) as torchvision's ``RASampler``
    (DeiT's). Raises :class:`DataError` for no image per rank, ``ValueError`` for bad sizes."""

    num_samples: int
    repetitions: int = 3
    rank: int = 0
    world_size: int = 1
    seed: int = 0
    SIZES = ("repetitions",)

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self) == 0:
            n = self.num_samples
            raise DataError(f"--ra-sampler: torchvision's RASampler reads floor({n} // 256 x "
                            f"256 / {self.world_size}) = 0 images per process of these {n}: "
                            "leave it out, or train on 256 images or more")

    def __len__(self) -> int:
        return int(math.floor(self.num_samples // 256 * 256 / self.world_size))

    def order(self, epoch: int) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + epoch)
        indices = torch.randperm(self.num_samples, generator=generator)
        indices = indices.repeat_interleave(self.repetitions)
        total = math.ceil(self.num_samples * float(self.repetitions) / self.world_size) \
            * self.world_size
        indices = torch.cat([indices, indices[:total - len(indices)]])
        return _ints(indices[self.rank:total:self.world_size][:len(self)])


def shuffled_order(num_samples: int, settings: LoaderSettings, dist: DistInfo) -> Order:
    """``--ra-sampler``'s order in a distributed run (as torchvision's), else RandomOrder."""
    if settings.ra_sampler and dist.distributed:
        return RepeatedAugmentationOrder(num_samples, settings.ra_reps, dist.rank,
                                         dist.world_size, settings.seed)
    return RandomOrder(num_samples, dist.rank, dist.world_size, settings.seed)
