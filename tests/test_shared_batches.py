"""Shared-memory batch slots (loaders/_shared_batches.py) and their use by DeviceLoader."""
import threading
import time
from types import SimpleNamespace

import pytest
import torch

import loaders
from loaders import DataError, DistInfo
from loaders import _shared_batches as sb
from tests.conftest import loader_settings


def test_batches_are_numbered_per_pass():
    sampler = sb.NumberedBatchSampler(range(10), 4, drop_last=False)
    batches = list(sampler)
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] and len(sampler) == 3
    assert [b.number for b in batches] == [0, 1, 2]
    assert [b.number for b in sb.NumberedBatchSampler(range(10), 4, drop_last=True)] == [0, 1]
    assert len(sb.NumberedBatchSampler(range(10), 4, drop_last=True)) == 2


def test_a_worker_waits_until_the_slot_is_released():
    pool = sb.SharedBatches(2, 4, (3, 8, 8), shared=False)
    assert pool.acquire(0) == 0 and pool.acquire(1) == 1  # first use of each slot: no wait
    got = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(2)))
    waiter.start()
    time.sleep(0.05)
    assert not got  # batch 2 needs slot 0, still holding batch 0
    pool.release(0, 0)
    waiter.join(timeout=5)
    assert got == [0]


def test_a_wait_that_never_ends_is_a_data_error(monkeypatch):
    monkeypatch.setattr(sb, "_WAIT_LIMIT_S", 0.05)
    pool = sb.SharedBatches(2, 4, (3, 8, 8), shared=False)
    with pytest.raises(DataError, match="stopped reading"):
        pool.acquire(2)


def test_too_little_shared_memory_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(sb.os, "statvfs", lambda path: SimpleNamespace(f_bavail=16, f_frsize=4096))
    with pytest.raises(DataError, match=r"/dev/shm has 0 MiB free .* --ipc=host"):
        sb.SharedBatches(10, 256, (3, 224, 224))


def test_a_transform_of_the_wrong_size_is_named():
    class Wrong(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, index):
            return torch.zeros(3, 9, 8, dtype=torch.uint8), 0, 0

    writer = sb.SlotWriter(Wrong())
    writer.use(sb.SharedBatches(2, 4, (3, 8, 8), shared=False))
    with pytest.raises(DataError, match=r"sample 0: .*\(3, 9, 8\), expected uint8 \(3, 8, 8\)"):
        writer.__getitems__(sb.NumberedBatch([0, 1], 0))


def test_slots_are_reused_after_a_pass_and_not_shared_with_a_suspended_one(tiny):
    train, _ = loaders.build_loaders(loader_settings("folder", data=tiny.root, workers=2),
                                     DistInfo())
    held = []
    for images, labels in train:  # batches are copies: holding them all is safe
        held.append((images, labels))
    first_pool = train._idle_pool
    assert first_pool is not None and len(held) == len(train)
    suspended = iter(train)
    next(suspended)  # a pass left half-way keeps its slots ...
    assert train._idle_pool is None
    fresh = list(train)  # ... so this pass gets new ones, and both stay correct
    assert len(fresh) == len(train)
    assert train._idle_pool is not first_pool
    suspended.close()
    assert train._idle_pool is first_pool
