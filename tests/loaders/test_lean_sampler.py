"""LeanDistributedSampler yields exactly DistributedSampler's indices without a Python list."""
from __future__ import annotations

import tracemalloc

import pytest
from torch.utils.data import DistributedSampler

from loaders.orders.random import LeanDistributedSampler


class _Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


@pytest.mark.parametrize("n", [1, 7, 10, 4096, 10_001])
@pytest.mark.parametrize("world", [1, 3, 8])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_same_indices_as_distributed_sampler(n, world, shuffle, drop_last):
    """n < world with drop_last: empty, as DistributedSampler's."""
    for rank in range(world):
        kw = dict(num_replicas=world, rank=rank, shuffle=shuffle, seed=5, drop_last=drop_last)
        stock, lean = DistributedSampler(_Sized(n), **kw), LeanDistributedSampler(_Sized(n), **kw)
        for epoch in (0, 3):
            stock.set_epoch(epoch)
            lean.set_epoch(epoch)
            got = list(lean)
            assert got == list(stock)
            assert len(got) == len(lean) == len(stock)
            assert all(type(i) is int for i in got[:3])


def test_holds_no_list_of_the_permutation():
    n = 1_281_167
    sampler = LeanDistributedSampler(_Sized(n), num_replicas=1, rank=0, seed=0)
    tracemalloc.start()
    try:
        first = next(iter(sampler))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert 0 <= first < n
    # A list of n Python ints would be ~46 MB; one chunk of converted ints is ~150 kB.
    assert peak < 2 << 20, peak
