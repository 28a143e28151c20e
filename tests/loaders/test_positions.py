"""loaders.orders.positions: an epoch's global order, and its rest dealt anew at another layout."""
from dataclasses import asdict

import numpy as np
import pytest

from loaders.orders import BlockOrder, RandomOrder, RepeatedAugmentationOrder
from loaders.orders.positions import Layout, global_order, position_record, rest_of_epoch
from loaders.orders.streams import StreamTrainOrder

N, SEED, EPOCH = 50, 5, 1

# Each kind of training order at (rank, layout); shards of unequal sizes.
ORDERS = {
    "random": lambda r, at: RandomOrder(N, r, at.world_size, SEED),
    "block": lambda r, at: BlockOrder(N, 4, 2, r, at.world_size, SEED),
    "repeated": lambda r, at: RepeatedAugmentationOrder(512, 3, r, at.world_size, SEED),
    "shards": lambda r, at: StreamTrainOrder([10, 7, 15, 18], at.batch_size, at.workers, r,
                                             at.world_size, SEED, buffer=3),
}


def interleaved(make, at: Layout) -> list[int]:
    ranks = [list(make(r, at).order(EPOCH)) for r in range(at.world_size)]
    return np.stack(ranks, axis=1).reshape(-1).tolist()


def read_rest(make, consumed: int, origin: Layout, now: Layout) -> tuple[list[int], set]:
    """Indices the ranks at ``now`` read after ``consumed`` samples (whole batches, global
    order), and their start batches."""
    parts, starts = [], set()
    for r in range(now.world_size):
        order = make(r, now)
        rest = rest_of_epoch(order, EPOCH, consumed, origin, now, r)
        indices = rest.indices
        if indices is None:  # same layout: the order's own, from start_batch on
            total = len(order) // now.batch_size * now.batch_size
            indices = list(order.order(EPOCH))[rest.start_batch * now.batch_size:total]
        assert len(indices) % now.batch_size == 0  # whole batches
        parts.append(indices)
        starts.add(rest.start_batch)
    assert len({len(p) for p in parts}) == 1  # the same batch count on every rank
    # position j x W' + r: rank r's j-th (as the global order is dealt)
    return np.stack(parts, axis=1).reshape(-1).tolist(), starts


@pytest.mark.parametrize("kind", sorted(ORDERS))
def test_global_order_interleaves_the_ranks(kind):
    at = Layout(3, 4, 2)
    assert global_order(ORDERS[kind](0, at), EPOCH, at).tolist() == interleaved(ORDERS[kind], at)


@pytest.mark.parametrize("kind", sorted(ORDERS))
@pytest.mark.parametrize("origin,steps,now", [
    (Layout(2, 4, 1), 3, Layout(3, 4, 1)), (Layout(2, 4, 1), 3, Layout(1, 4, 1)),
    (Layout(1, 4, 1), 5, Layout(1, 8, 1)), (Layout(1, 4, 1), 5, Layout(1, 2, 1)),
    (Layout(2, 4, 2), 2, Layout(2, 4, 1)), (Layout(2, 4, 1), 3, Layout(2, 4, 1))])
def test_rest_continues_the_global_order(kind, origin, steps, now):
    """What the new ranks read, step by step, is the global order from ``consumed`` on: no
    sample twice, none skipped but the last < W' x B'; at the same layout exactly the
    order's own batches from the saved one."""
    make = ORDERS[kind]
    full = global_order(make(0, origin), EPOCH, origin).tolist()
    consumed = steps * origin.world_size * origin.batch_size
    read, starts = read_rest(make, consumed, origin, now)
    per_step = now.world_size * now.batch_size
    assert read == full[consumed:consumed + len(read)]
    assert len(full) - consumed - len(read) < per_step
    (start,) = starts
    assert start == len(make(0, now)) // now.batch_size - len(read) // per_step
    if origin == now or (kind != "shards" and origin.world_size == now.world_size
                         and origin.batch_size == now.batch_size):
        assert start == steps


def test_chained_resumes_stay_a_prefix():
    """2 ranks -> 3 ranks -> 1 rank: the samples trained are still the global order's first."""
    make, origin, mid, last = ORDERS["random"], Layout(2, 4, 0), Layout(3, 2, 0), Layout(1, 4, 0)
    full = global_order(make(0, origin), EPOCH, origin).tolist()
    first = rest_of_epoch(make(1, mid), EPOCH, 8, origin, mid, 1)
    record = position_record(make(1, mid), mid, first, EPOCH, first.start_batch + 2)
    assert record["consumed"] == 8 + 2 * 3 * 2 and record["origin"] == asdict(origin)
    read, _ = read_rest(make, record["consumed"], origin, last)
    assert read == full[20:20 + len(read)] and len(full) - 20 - len(read) < 4


def test_a_count_off_the_steps_is_refused():
    with pytest.raises(ValueError, match="whole steps"):
        rest_of_epoch(ORDERS["random"](0, Layout(2, 4, 0)), EPOCH, 6, Layout(2, 4, 0),
                      Layout(2, 4, 0), 0)
    with pytest.raises(ValueError, match="consumed of an epoch of 50"):
        rest_of_epoch(ORDERS["random"](0, Layout(1, 4, 0)), EPOCH, 60, Layout(2, 4, 0),
                      Layout(1, 4, 0), 0)
