"""The epoch-order interface (FFCV's ``TraversalOrder``): which indices one rank reads in an epoch,
in which order; validation's :class:`ShardOrder`; :class:`ResumableSampler`, DataLoader's face."""
from __future__ import annotations

import itertools
from typing import Iterable, Iterator, Protocol

from torch.utils.data import Sampler

from ..errors import DataError


class Order(Protocol):
    """``order(epoch)`` is a pure function of the constructor's arguments and ``epoch``; a
    training order also has ``at(rank, layout)``: itself for another rank and layout."""

    num_samples: int  # the dataset's size; indices are in 0..num_samples-1

    def __len__(self) -> int: ...  # indices this rank reads per epoch (the same every epoch)

    def order(self, epoch: int) -> Iterable[int]: ...  # this rank's, in reading order


def check_rank(rank: int, world_size: int) -> None:
    """Raise ``ValueError`` unless ``0 <= rank < world_size`` (and ``world_size >= 1``)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside 0..{world_size - 1}")


def batches_per_epoch(samples: int, batch_size: int, drop_last: bool,
                      max_batches: int | None = None) -> int:
    """Batches of ``batch_size`` in ``samples`` indices (whole ones only with ``drop_last``:
    training, no tiny batch for BatchNorm), at most ``max_batches``."""
    count = samples // batch_size if drop_last else -(-samples // batch_size)
    return count if max_batches is None else min(count, max_batches)


def train_batch_size(order: Order, batch_size: int) -> int:
    """``batch_size``, or fewer if ``order`` holds fewer. :class:`DataError` if it is empty."""
    if len(order) == 0:
        raise DataError(f"training set has no image for this process ({order.num_samples} "
                        "images in all): use fewer processes or more images")
    return min(batch_size, len(order))


class ShardOrder:
    """Validation: rank ``r`` of ``w`` reads ``r, r+w, ...``, none padded (unlike
    ``DistributedSampler``): metrics summed over ranks are exact. ``ValueError``: a bad rank."""

    def __init__(self, num_samples: int, rank: int = 0, world_size: int = 1):
        check_rank(rank, world_size)
        self.num_samples, self.rank, self.world_size = num_samples, rank, world_size

    def __len__(self) -> int:
        return len(self.order(0))

    def order(self, epoch: int) -> range:
        return range(self.rank, self.num_samples, self.world_size)


class ResumableSampler(Sampler[int]):
    """``order.order(epoch)`` from position ``start`` on, or ``rest`` when set (dealt anew)."""

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
