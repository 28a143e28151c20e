"""RandomOrder yields DistributedSampler's indices (test_orders.py) without a Python list."""
from __future__ import annotations

import tracemalloc

from loaders.orders import RandomOrder


def test_holds_no_list_of_the_permutation():
    n = 1_281_167
    order = RandomOrder(n, rank=0, world_size=1, seed=0)
    tracemalloc.start()
    try:
        first = next(iter(order.order(0)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert 0 <= first < n
    # A list of n Python ints would be ~46 MB; one chunk of converted ints is ~150 kB.
    assert peak < 2 << 20, peak
