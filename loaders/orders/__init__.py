"""Epoch orders (as FFCV's ``traversal_order/``): the interface and validation's order in ``base``,
training's in ``random`` and ``block``, both over shards in ``streams``; ``positions`` places a
pass in its epoch's global order (for resumes)."""
from __future__ import annotations

from .base import Order, ResumableSampler, ShardOrder, batches_per_epoch, train_batch_size
from .block import BlockOrder
from .random import RandomOrder, RepeatedAugmentationOrder, shuffled_order
from .streams import StreamTrainOrder, StreamValOrder
