import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

import loaders
import main
from loaders import DistInfo
import formats.lmdb as codec
from loaders.orders import BlockOrder, RandomOrder, ShardOrder, batches_per_epoch
from loaders.pipelines.batches import NumberedBatchSampler
from loaders.readers.lmdb_records import LMDBReader
from tests.helpers.loading import loader_settings
from tests.helpers.processes import value_in_another_process
from tests.helpers.runs import read_metrics, SMALL


def order(n=1000, block=16, buffer=4, rank=0, world=1, seed=0, epoch=0):
    blocks = BlockOrder(n, block_size=block, buffer_blocks=buffer, rank=rank, world_size=world,
                        seed=seed)
    return list(blocks.order(epoch))


def mean_run(indices):
    """Mean length of runs of consecutive integers in the sorted indices."""
    s = np.sort(np.asarray(indices))
    breaks = np.count_nonzero(np.diff(s) != 1)
    return len(s) / (breaks + 1)


def test_deterministic_per_seed_and_epoch():
    """The same order in another process (every rank computes its own: they must agree)."""
    assert value_in_another_process(
        "from loaders.orders import BlockOrder",
        "[int(i) for i in BlockOrder(1000, block_size=16, buffer_blocks=4, rank=0, "
        "world_size=1, seed=3).order(2)]") == order(seed=3, epoch=2)
    assert order(seed=3, epoch=2) != order(seed=3, epoch=3)
    assert order(seed=3, epoch=2) != order(seed=4, epoch=2)
    assert sorted(order()) == list(range(1000))  # one rank: a permutation


@pytest.mark.parametrize("n", [1000, 1001, 37, 5])
@pytest.mark.parametrize("world", [2, 3])
def test_shards_disjoint_equal_length_each_index_once(n, world):
    for epoch in range(3):
        shards = [order(n, rank=r, world=world, epoch=epoch) for r in range(world)]
        for r, shard in enumerate(shards):
            blocks = BlockOrder(n, 16, 4, rank=r, world_size=world)
            assert len(shard) == len(blocks) == n // world
        flat = [i for shard in shards for i in shard]
        assert len(flat) == len(set(flat)) and all(0 <= i < n for i in flat)


def test_length_and_drop_like_distributed_sampler():
    for n, world in [(30, 3), (32, 3), (10, 4), (2, 3)]:
        reference = DistributedSampler(range(n), num_replicas=world, rank=0, drop_last=True)
        assert len(BlockOrder(n, 4, 2, 0, world)) == len(reference)
        assert len(RandomOrder(n, 0, world)) == len(reference)


def test_ranks_read_contiguous_blocks_and_buffer_bounds_working_set():
    n, block, buffer, world = 20_000, 64, 4, 2
    shard = order(n, block, buffer, rank=0, world=world, epoch=1)
    random_shard = list(DistributedSampler(range(n), num_replicas=world, rank=0, seed=0))
    # A rank holds whole blocks (partial ones only at its segment ends)...
    assert mean_run(shard) >= block - 1
    assert mean_run(random_shard) < 3
    # ...and reads from a few blocks at a time: any window of `block` consecutive reads
    # touches few blocks, where random order touches nearly `block` of them.
    windows = [len({i // block for i in shard[s:s + block]}) for s in range(0, len(shard), block)]
    random_windows = [len({i // block for i in random_shard[s:s + block]})
                      for s in range(0, len(random_shard), block)]
    assert np.mean(windows) <= 2 * buffer and np.mean(random_windows) > 0.5 * block
    # Within the buffer the order is shuffled, not sequential.
    assert np.mean(np.diff(shard[:block]) == 1) < 0.5


def test_invalid_parameters():
    with pytest.raises(ValueError):
        BlockOrder(10, block_size=0)
    with pytest.raises(ValueError):
        BlockOrder(10, rank=2, world_size=2)
    for make in (RandomOrder, ShardOrder):
        with pytest.raises(ValueError):
            make(10, rank=2, world_size=2)


@pytest.mark.parametrize("n", [1, 7, 10, 4096, 10_001])
@pytest.mark.parametrize("world", [1, 3, 8])
def test_random_order_is_distributed_samplers_permutation(n, world):
    """n < world: every rank's share is empty, as DistributedSampler's with drop_last."""
    for rank in range(world):
        stock = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True,
                                   seed=5, drop_last=True)
        random_order = RandomOrder(n, rank, world, seed=5)
        for epoch in (0, 3):
            stock.set_epoch(epoch)
            got = list(random_order.order(epoch))
            assert got == list(stock) and len(got) == len(random_order) == len(stock)
            assert all(type(i) is int for i in got[:3])


def test_batch_sampler_resumes_the_same_order():
    for inner in (RandomOrder(50, rank=1, world_size=2, seed=3), BlockOrder(50, 4, 2, 1, 2, 3),
                  ShardOrder(50, 1, 2)):
        sampler = NumberedBatchSampler(inner, 4, drop_last=False)
        sampler.epoch = 4
        full = list(sampler.indices())
        assert full == list(inner.order(4)) and len(sampler) == -(-len(inner) // 4)
        assert [i for batch in sampler for i in batch] == full
        sampler.start = 8
        assert list(sampler.indices()) == full[8:] and len(sampler) == -(-(len(full) - 8) // 4)
        assert [batch.number for batch in sampler][:2] == [0, 1]


def test_batches_per_epoch():
    assert batches_per_epoch(10, 4, drop_last=True) == 2
    assert batches_per_epoch(10, 4, drop_last=False) == 3
    assert batches_per_epoch(10, 4, drop_last=False, max_batches=1) == 1
    assert batches_per_epoch(3, 4, drop_last=True) == 0


def test_lmdb_loader_block_order_end_to_end(tiny):
    settings = loader_settings("lmdb", data=tiny.lmdb, lmdb_order="block", lmdb_block_size=4,
                               lmdb_buffer_blocks=2, lmdb_readahead="on")
    train, val = loaders.build_loaders(settings, DistInfo())
    assert isinstance(train.sampler, NumberedBatchSampler)
    assert isinstance(train.sampler.order, BlockOrder)
    assert train.reader.readahead and len(train) == 32 // 4
    train.set_epoch(1)
    labels = torch.cat([labels for _, labels in train])
    assert sorted(labels.tolist()) == sorted(list(range(4)) * 8)  # every image once
    assert len(list(val)) == 4


def test_block_order_warns_about_a_class_sorted_database_once(tiny, tmp_path, capsys):
    import folder2lmdb

    settings = loader_settings("lmdb", data=tiny.lmdb, lmdb_order="block", lmdb_block_size=4,
                               lmdb_buffer_blocks=2)
    loaders.build_loaders(settings, DistInfo())
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sorted by class" in err[0] and "about 3 of 4 classes" in err[0]
    assert "--shuffle-seed" in err[0]
    loaders.build_loaders(settings, DistInfo(rank=1, world_size=2))  # rank 0 says it
    loaders.build_loaders(loader_settings("lmdb", data=tiny.lmdb), DistInfo())  # random order
    assert capsys.readouterr().err == ""
    shuffled = str(tmp_path / "train")
    folder2lmdb.convert(f"{tiny.root}/train", shuffled, progress=False, shuffle_seed=0)
    settings = loader_settings("lmdb", train_path=shuffled, val_path=f"{tiny.lmdb}/val",
                               lmdb_order="block", lmdb_block_size=4, lmdb_buffer_blocks=2)
    loaders.build_loaders(settings, DistInfo())
    assert capsys.readouterr().err == ""


def test_readahead_setting_switch_reopens_and_datasets_recover(tiny):
    path = f"{tiny.lmdb}/val"
    plain, ahead = LMDBReader(path), LMDBReader(path, readahead=True)
    assert plain.read(3) == ahead.read(3)  # ahead's open closed plain's handle...
    assert ahead._env.flags()["readahead"] and not codec.is_open(plain._env)
    assert plain.read(3)[1] == 0  # ...and plain reopens rather than using a closed one
    env = codec.open_readonly(path)  # None: whatever is open
    assert env is plain._env and codec.is_open(env)
    codec.close_readonly(path)
    assert not codec.is_open(env)


def test_main_trains_one_epoch_in_block_order(tiny, tmp_path):
    out = str(tmp_path / "out")
    last = main.main(["--lmdb", tiny.lmdb, *SMALL, "--epochs", "1", "--output-dir", out,
                      "--lmdb-order", "block", "--lmdb-block-size", "4", "--lmdb-readahead", "on"])
    assert last["epoch"] == 0 and [r["epoch"] for r in read_metrics(out)] == [0]
    args = main.parse_args(["--lmdb"])
    assert (args.lmdb_order, args.lmdb_block_size, args.lmdb_readahead) == ("random", 256, "auto")


def test_readahead_auto_follows_database_size(tiny, monkeypatch):
    from loaders.readers import lmdb_records

    path = f"{tiny.lmdb}/train"
    assert lmdb_records.readahead_for(path, "auto")  # a few KiB: fits in memory
    assert lmdb_records.readahead_for(path, "on") and not lmdb_records.readahead_for(path, "off")
    monkeypatch.setattr(lmdb_records.os.path, "getsize", lambda _: 1 << 60)  # 1 EiB
    assert not lmdb_records.readahead_for(path, "auto")


def _rasampler(n: int, reps: int, rank: int, world: int, seed: int, epoch: int) -> list[int]:
    """torchvision's references/classification/sampler.py RASampler.__iter__, as lists."""
    import math

    g = torch.Generator()
    g.manual_seed(seed + epoch)
    indices = torch.randperm(n, generator=g).tolist()
    indices = [i for i in indices for _ in range(reps)]
    total = int(math.ceil(n * float(reps) / world)) * world
    indices += indices[:(total - len(indices))]
    return indices[rank:total:world][:int(math.floor(n // 256 * 256 / world))]


@pytest.mark.parametrize("n,reps,world", [(1000, 3, 2), (600, 4, 8), (256, 4, 2), (777, 1, 3)])
def test_repeated_augmentation_is_torchvisions_rasampler(n, reps, world):
    from loaders.orders import RepeatedAugmentationOrder

    for rank in range(world):
        order = RepeatedAugmentationOrder(n, reps, rank, world, seed=11)
        assert len(order) == n // 256 * 256 // world  # RASampler's per-epoch count
        for epoch in (0, 3):
            assert list(order.order(epoch)) == _rasampler(n, reps, rank, world, 11, epoch)
    # the copies of an image go to different ranks
    first = [list(RepeatedAugmentationOrder(n, reps, r, world, 11).order(0)) for r in range(world)]
    if reps > 1 and world >= reps:
        assert first[0][0] == first[1][0] and first[0][0] not in first[0][1:reps]


def test_repeated_augmentation_under_256_images_is_one_line():
    from loaders import DataError
    from loaders.orders import RepeatedAugmentationOrder

    with pytest.raises(DataError, match=r"RASampler reads floor\(250 // 256"):
        RepeatedAugmentationOrder(250, 4, 0, 2)


def test_ra_sampler_only_in_a_distributed_run(tiny):
    """torchvision samples with RASampler only when distributed: one process, RandomOrder."""
    from loaders.orders import RepeatedAugmentationOrder, shuffled_order

    settings = loader_settings("folder", tiny.root, ra_sampler=True, ra_reps=4)
    assert isinstance(shuffled_order(512, settings, DistInfo()), RandomOrder)
    dist = DistInfo(rank=1, world_size=2, distributed=True)
    order = shuffled_order(512, settings, dist)
    assert isinstance(order, RepeatedAugmentationOrder) and order.repetitions == 4
    assert len(order) == 256
