"""The epoch-order interface (as FFCV's ``TraversalOrder``, ``ffcv/traversal_order/base.py``):
which dataset indices one rank reads in an epoch, and in which order.

An order has ``num_samples`` (the dataset's size), ``len()`` (indices per epoch on this rank)
and ``order(epoch)`` (those indices, an iterable of Python ints, a pure function of the
constructor's arguments and ``epoch``); a training order also has ``at(rank, layout)``, itself
for another rank of a :class:`~loaders.orders.positions.Layout`. Every pipeline reads orders:
the DataLoader ones through :class:`ResumableSampler`, DALI as a list.

:func:`batches_per_epoch` is the one place the batch count of an epoch is computed,
:func:`train_batch_size` the one place a training batch is sized.
"""
from __future__ import annotations

import itertools
from typing import Iterable, Iterator, Protocol

from torch.utils.data import Sampler

from ..errors import DataError


class Order(Protocol):
    """What every epoch order provides (see the module docstring)."""

    num_samples: int  # the dataset's size; indices are in 0..num_samples-1

    def __len__(self) -> int:
        """Indices this rank reads per epoch (the same for every epoch)."""

    def order(self, epoch: int) -> Iterable[int]:
        """This rank's indices of ``epoch``, in reading order."""


def check_rank(rank: int, world_size: int) -> None:
    """Raise ``ValueError`` unless ``0 <= rank < world_size`` (and ``world_size >= 1``)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside 0..{world_size - 1}")


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


class ResumableSampler(Sampler[int]):
    """The DataLoader face of an :class:`Order`: yields ``order.order(epoch)`` from position
    ``start`` on (``start`` = batches already trained on x batch size, for a run resumed from a
    mid-epoch checkpoint, ``--save-every``: none repeated, none skipped), or, when ``rest`` is
    set, those indices instead (a resumed epoch dealt anew from its global order at another
    layout, :func:`loaders.orders.positions.rest_of_epoch`). ``set_epoch`` selects the epoch;
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
