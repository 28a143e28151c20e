"""Workers (training's and validation's) kept from pass to pass (DeviceLoader, persistent_workers) and crops seeded
per batch: the same batches whatever the workers, after a resume, and after a pass left early."""
import os
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import folder2lmdb
import loaders
from loaders import DistInfo
from loaders.pipelines import batches
from loaders.pipelines.workers import slots as sb
from tools import datagen
from tests.helpers.loading import loader_settings, to_uint8
from tests.helpers.processes import value_in_another_process
from tests.helpers.standin import write_twins
from tools.datagen import label_from_pixels


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """Images with shapes on a class colour, so different crops give different pixels; as an
    LMDB (4 classes, 8 train / 4 val images each)."""
    root = str(tmp_path_factory.mktemp("shapes"))
    datagen.make_dataset(root, 4, train_per_class=8, val_per_class=4, seed=3, shapes=6)
    for split in ("train", "val"):
        folder2lmdb.convert(os.path.join(root, split), os.path.join(root, "lmdb", split),
                            progress=False)
    return os.path.join(root, "lmdb")


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """16 copies of one picture as an LMDB: batches differ only in their crops' draws."""
    root = write_twins(str(tmp_path_factory.mktemp("twins")))
    for split in ("train", "val"):
        folder2lmdb.convert(os.path.join(root, split), os.path.join(root, "lmdb", split),
                            progress=False)
    return os.path.join(root, "lmdb")


def _loaders(data, workers, dist=DistInfo(), **overrides):
    settings = loader_settings("lmdb", data=data, workers=workers, **overrides)
    return loaders.build_loaders(settings, dist)


def _children() -> set[int]:
    pids = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids.update(int(pid) for pid in f.read().split())
        except FileNotFoundError:  # a thread that ended meanwhile has no children
            pass
    return pids


def _epoch(train, epoch, start_batch=0):
    train.set_epoch(epoch, start_batch)
    return [(to_uint8(images), labels) for images, labels in train]


def _same(a, b):
    assert len(a) == len(b)
    for (a_img, a_lab), (b_img, b_lab) in zip(a, b):
        assert torch.equal(a_lab, b_lab) and (a_img == b_img).all()


def test_workers_are_kept_from_pass_to_pass_and_close_stops_them(shapes):
    before = _children()
    train, val = _loaders(shapes, workers=2)
    _epoch(train, 0)
    kept = _children() - before
    assert len(kept) == 2  # the training pass's workers, still there
    list(val)  # validation's workers are kept too
    with_val = _children() - before
    assert len(with_val) == 4 and kept < with_val
    _epoch(train, 1)
    list(val)
    assert _children() - before == with_val  # the same processes served the next passes
    train.close()
    val.close()
    assert not (_children() - before)
    assert len(_epoch(train, 2)) == len(train)  # a later pass starts new ones
    train.close()


def test_crops_depend_on_seed_epoch_and_batch_not_on_the_workers(shapes, twins):
    runs = {workers: _epoch(_loaders(shapes, workers)[0], 3) for workers in (0, 1, 2)}
    _same(runs[0], runs[1])
    _same(runs[0], runs[2])
    for images, labels in runs[2]:  # the crops still show their class
        assert [label_from_pixels(image, 4) for image in images] == labels.tolist()

    def crops(seed=0, epoch=3, rank=0, world=1):  # one picture: only the draws differ
        train = _loaders(twins, 0, DistInfo(rank, world), seed=seed)[0]
        return [images for images, _ in _epoch(train, epoch)]

    base = crops()
    assert len(base) == 4 and all(np.array_equal(a, b) for a, b in zip(base, crops()))
    assert not any(np.array_equal(base[0], other) for other in base[1:])  # the batch number
    for other in (crops(seed=1), crops(epoch=4), crops(rank=1, world=2)):
        assert len(other) >= 2 and not any(np.array_equal(a, b) for a, b in zip(base, other))


def test_a_resumed_epoch_draws_the_crops_of_the_uninterrupted_one(shapes):
    train, _ = _loaders(shapes, workers=2)
    whole = _epoch(train, 5)
    resumed = _epoch(_loaders(shapes, workers=2)[0], 5, start_batch=3)
    _same(resumed, whole[3:])
    train.close()


def test_a_pass_left_early_does_not_disturb_the_next(shapes):
    """The kept workers finish the abandoned pass's batches in flight into the same slots
    while the next pass starts: the next pass must still be exactly right."""
    train, _ = _loaders(shapes, workers=2, batch_size=2)
    reference = _epoch(_loaders(shapes, workers=0, batch_size=2)[0], 1)
    train.set_epoch(0)
    left = iter(train)
    next(left)
    left.close()
    _same(_epoch(train, 1), reference)
    _same(_epoch(train, 1), reference)
    train.close()


def test_a_later_pass_waits_for_its_own_releases_only(monkeypatch):
    pool = sb.SharedBatches(2, 4, (3, 8, 8), shared=False)
    first, second = 0, 1  # the loader's pass numbers
    pool.release(0, 7, first)  # the first pass got as far as batch 7 in slot 0
    assert pool.acquire(8, first) == 0  # ... so its batch 8 may take slot 0 again
    polls = []

    def sleep(seconds):  # acquire's poll: batch 2 of the second pass is waiting for slot 0
        polls.append(seconds)
        if len(polls) == 3:
            pool.release(0, 0, second)  # ... until that pass's batch 0 leaves it

    monkeypatch.setattr(sb, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep))
    assert pool.acquire(2, second) == 0
    assert len(polls) == 3  # it waited for its own pass's release, and no longer


def test_batch_seeds_are_a_function_of_the_four_numbers():
    seeds = {batches.batch_seed(0, e, r, b) for e in range(3) for r in range(3) for b in range(3)}
    assert len(seeds) == 27
    # the same in another process (whose str hashes and addresses differ): ranks agree
    assert value_in_another_process(
        "from loaders.pipelines.batches import batch_seed",
        "[batch_seed(1, 2, 3, 4), batch_seed(2**64 - 1, 0, 7, 9)]") == [
        batches.batch_seed(1, 2, 3, 4), batches.batch_seed(2**64 - 1, 0, 7, 9)]
    plan = batches.PassPlan(seed_key=(1, 2, 3, 10))
    assert plan.seed(4) == batches.batch_seed(1, 2, 3, 14) and batches.PassPlan().seed(4) is None
