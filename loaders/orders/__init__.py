"""Epoch orders (as FFCV's ``traversal_order/``): the interface and validation's order in ``base``,
training's in ``random`` and ``block``, both over shards in ``streams``; ``positions`` places a
pass in its epoch's global order (for resumes)."""
from __future__ import annotations

from .base import (Order, ResumableSampler, ShardOrder, batches_per_epoch, check_rank,
                   train_batch_size)
from .block import BlockOrder
from .random import RandomOrder, RepeatedAugmentationOrder, shuffled_order
from .streams import StreamTrainOrder, StreamValOrder, buffer_shuffle

__all__ = ["BlockOrder", "Order", "RandomOrder", "RepeatedAugmentationOrder", "ResumableSampler",
           "ShardOrder", "StreamTrainOrder", "StreamValOrder", "batches_per_epoch",
           "buffer_shuffle", "check_rank", "shuffled_order", "train_batch_size"]
