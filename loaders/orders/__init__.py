"""Epoch orders (FFCV's ``traversal_order/``); ``positions`` places a pass in its epoch."""
from __future__ import annotations

from .base import Order, ShardOrder, batches_per_epoch, train_batch_size
from .block import BlockOrder
from .random import RandomOrder, RepeatedAugmentationOrder, shuffled_order
from .streams import StreamTrainOrder, StreamValOrder
