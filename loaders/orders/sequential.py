"""Validation's order: every sample once across the ranks, in index order (FFCV's
``Sequential``, ``ffcv/traversal_order/sequential.py``, strided over ranks)."""
from __future__ import annotations

from .base import check_rank


class ShardOrder:
    """Rank ``r`` of ``w`` reads indices ``r, r+w, r+2w, ...`` in order, in every epoch. Every
    sample is read exactly once across ranks and none is padded or repeated (unlike
    ``DistributedSampler``), so a metric summed over ranks equals the single-process one;
    ``len()`` may differ by one between ranks. Raises ``ValueError`` for a bad rank."""

    def __init__(self, num_samples: int, rank: int = 0, world_size: int = 1):
        check_rank(rank, world_size)
        self.num_samples, self.rank, self.world_size = num_samples, rank, world_size

    def __len__(self) -> int:
        return len(range(self.rank, self.num_samples, self.world_size))

    def order(self, epoch: int) -> range:
        return range(self.rank, self.num_samples, self.world_size)
