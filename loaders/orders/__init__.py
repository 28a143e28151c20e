"""Epoch orders, one module per order (as FFCV's ``traversal_order/``): ``base`` (the
:class:`Order` interface, batch counts, :class:`ResumableSampler`), ``random`` (training's
:class:`RandomOrder` and ``--ra-sampler``'s :class:`RepeatedAugmentationOrder`), ``sequential``
(validation's :class:`ShardOrder`), ``block`` (``--lmdb-order block``'s :class:`BlockOrder`),
``streams`` (the shard reader's :class:`StreamTrainOrder` and :class:`StreamValOrder`) and
``positions`` (where a pass stands in its epoch's global order, for resumes at another layout).
"""
from __future__ import annotations

from .base import Order, ResumableSampler, batches_per_epoch, check_rank, train_batch_size
from .block import BlockOrder
from .random import RandomOrder, RepeatedAugmentationOrder, shuffled_order
from .sequential import ShardOrder
from .streams import StreamTrainOrder, StreamValOrder, buffer_shuffle

__all__ = ["BlockOrder", "Order", "RandomOrder", "RepeatedAugmentationOrder", "ResumableSampler",
           "ShardOrder", "StreamTrainOrder", "StreamValOrder", "batches_per_epoch",
           "buffer_shuffle", "check_rank", "shuffled_order", "train_batch_size"]
