"""The epoch-order interface (FFCV's ``TraversalOrder``): which indices one rank reads in an epoch,
in which order; validation's :class:`ShardOrder`."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

from ..errors import DataError


class Order:
    """An epoch order, a dataclass of ``num_samples`` (indices are in 0..num_samples-1), ``rank``,
    ``world_size`` (``ValueError`` unless ``0 <= rank < world_size``) and what else it is drawn
    from: :meth:`order` is a pure function of those and ``epoch``; ``len()`` is the indices this
    rank reads per epoch (the same every epoch)."""

    num_samples: int
    rank: int
    world_size: int
    # Layout fields besides the world size the order changes with (loaders.orders.positions)
    LAYOUT_KEYS = ()
    SIZES = ()  # fields that must be >= 1 (ValueError)

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside 0..{self.world_size - 1}")
        if any(getattr(self, key) < 1 for key in self.SIZES):
            raise ValueError(f"{' and '.join(self.SIZES)} must be >= 1, got "
                             + ", ".join(str(getattr(self, key)) for key in self.SIZES))

    def __len__(self) -> int:
        return self.num_samples // self.world_size

    def order(self, epoch: int) -> Iterable[int]:
        """This rank's indices of ``epoch``, in reading order."""
        raise NotImplementedError

    def at(self, rank: int, layout) -> Order:
        """This order for ``rank`` of a :class:`~loaders.orders.positions.Layout`."""
        keys = {key: getattr(layout, key) for key in self.LAYOUT_KEYS}
        return replace(self, rank=rank, world_size=layout.world_size, **keys)


def batches_per_epoch(samples: int, batch_size: int, drop_last: bool,
                      max_batches: int | None = None) -> int:
    """Batches of ``batch_size`` in ``samples`` indices (whole ones only with ``drop_last``:
    training, no tiny batch for BatchNorm), at most ``max_batches``."""
    count = samples // batch_size if drop_last else -(-samples // batch_size)
    return count if max_batches is None else min(count, max_batches)


def segment_runs(starts, counts, units, lo: int, hi: int) -> list[tuple[int, int]]:
    """Records ``[lo, hi)`` of ``units`` (their first records ``starts[u]``, sizes ``counts[u]``)
    laid end to end, as record ranges: a rank's segment of an epoch's permuted blocks or shards."""
    runs, at = [], 0
    for unit in units.tolist():
        n = int(counts[unit])
        if at + n > lo and at < hi:
            first = int(starts[unit])
            runs.append((first + max(lo - at, 0), first + min(hi - at, n)))
        at += n
        if at >= hi:
            break
    return runs


def train_batch_size(order: Order, batch_size: int) -> int:
    """``batch_size``, or fewer if ``order`` holds fewer. :class:`DataError` if it is empty."""
    if len(order) == 0:
        raise DataError(f"training set has no image for this process ({order.num_samples} "
                        "images in all): use fewer processes or more images")
    return min(batch_size, len(order))


@dataclass(eq=False)
class ShardOrder(Order):
    """Validation: rank ``r`` of ``w`` reads ``r, r+w, ...``, none padded (unlike
    ``DistributedSampler``): metrics summed over ranks are exact."""

    num_samples: int
    rank: int = 0
    world_size: int = 1

    def __len__(self) -> int:
        return len(self.order(0))

    def order(self, epoch: int) -> range:
        return range(self.rank, self.num_samples, self.world_size)
