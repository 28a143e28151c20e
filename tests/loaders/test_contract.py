import os
import pickle

import pytest
import torch

import loaders
from loaders import DataError, DistInfo
from loaders.contract import split_paths
from loaders.orders import ShardOrder
from loaders.readers.lmdb_records import LMDBReader
from tests.conftest import check_set_epoch_reproducible, loader_settings, to_uint8
from tests.datagen import label_from_pixels

FILE_BACKENDS = ["folder", "lmdb"]


def build(backend, tiny, **overrides):
    overrides.setdefault("data", tiny.lmdb if backend == "lmdb" else tiny.root)
    return loaders.build_loaders(loader_settings(backend, **overrides), DistInfo())


@pytest.mark.parametrize("backend", FILE_BACKENDS)
def test_contract_shapes_dtypes_labels_and_length(backend, tiny):
    train, val = build(backend, tiny)
    assert train.classes == val.classes == [f"n{c:08d}" for c in range(tiny.num_classes)]
    for loader, images_total in ((train, 32), (val, 16)):
        batches = list(loader)
        assert len(batches) == len(loader) == images_total // 4  # exact len()
        for images, labels in batches:
            assert images.dtype == torch.float32 and images.shape == (4, 3, 32, 32)
            assert labels.dtype == torch.int64 and labels.shape == (4,)
            assert images.device.type == labels.device.type == "cpu"
            # Normalised with the ImageNet mean/std, and the pixels still encode the label.
            pixels = to_uint8(images)
            assert [label_from_pixels(p, tiny.num_classes) for p in pixels] == labels.tolist()
    val_labels = torch.cat([labels for _, labels in val])
    assert sorted(val_labels.tolist()) == sorted(list(range(4)) * 4)  # every val image once


@pytest.mark.parametrize("backend", FILE_BACKENDS)
def test_set_epoch_makes_order_and_augmentation_reproducible(backend, tiny):
    check_set_epoch_reproducible(lambda: build(backend, tiny, workers=2)[0])


def test_folder_and_lmdb_deliver_identical_validation_batches(tiny):
    _, folder_val = build("folder", tiny)
    _, lmdb_val = build("lmdb", tiny)
    for (fi, fl), (li, ll) in zip(folder_val, lmdb_val, strict=True):
        assert torch.equal(fl, ll) and torch.equal(fi, li)


def test_channels_last_and_batch_caps(tiny):
    train, val = build("lmdb", tiny, channels_last=True, train_batches=3, val_batches=1)
    assert len(train) == 3 and len(list(train)) == 3 and len(list(val)) == 1
    images, _ = next(iter(train))
    assert images.is_contiguous(memory_format=torch.channels_last)


def test_lmdb_reader_opens_lazily_and_pickles_without_environment(tiny):
    dataset = LMDBReader(os.path.join(tiny.lmdb, "val"))
    assert dataset._env is None and len(dataset) == 16
    data, label = dataset.read(5)
    assert dataset._env is not None and label == 1 and data[:3] == b"\xff\xd8\xff"
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone._env is None and clone.read(5) == dataset.read(5)
    with pytest.raises(IndexError):
        dataset.read(16)


@pytest.mark.parametrize("backend", ["lmdb", "folder"])
def test_loader_works_in_spawned_workers(tiny, backend):
    """Spawned workers get the dataset and the shared batch slots by pickling, not fork."""
    train, _ = build(backend, tiny, workers=2, batch_size=8)
    train.loader.multiprocessing_context = "spawn"
    for epoch in range(2):  # the second pass reuses the first one's slots
        train.set_epoch(epoch)
        batches = [(to_uint8(images), labels) for images, labels in train]
        labels = torch.cat([labels for _, labels in batches])
        assert sorted(labels.tolist()) == sorted(list(range(4)) * 8)
        for images, labels in batches:
            assert [label_from_pixels(image, 4) for image in images] == labels.tolist()


@pytest.mark.parametrize("world_size", [2, 3])
def test_shards_are_disjoint_and_validation_counts_each_image_once(tiny, world_size):
    train_seen, val_seen = [], []
    for rank in range(world_size):
        train, val = loaders.build_loaders(loader_settings("lmdb", data=tiny.lmdb, batch_size=2),
                                           DistInfo(rank=rank, world_size=world_size))
        train_seen.append(list(train.sampler))
        val_seen.extend(val.sampler)
        assert len(train) == (32 // world_size) // 2  # same batch count on every rank
    flat = [i for shard in train_seen for i in shard]
    assert len(flat) == len(set(flat)) == (32 // world_size) * world_size
    assert sorted(val_seen) == list(range(16))


def test_shard_order_never_pads():
    shards = [list(ShardOrder(10, rank, 3).order(epoch=5)) for rank in range(3)]
    assert shards == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]


def test_synthetic_loader_has_imagenet_sizes():
    settings = loader_settings("synthetic", batch_size=8, train_batches=None, val_batches=None)
    train, val = loaders.build_loaders(settings, DistInfo())
    assert len(train) == 1_281_167 // 8 and len(val) == 6250 and len(train.classes) == 1000
    images, labels = next(iter(train))
    assert images.shape == (8, 3, 32, 32) and images.dtype == torch.float32
    assert labels.dtype == torch.int64 and int(labels.max()) < 1000


def test_backend_mismatch_errors_are_clear(tiny):
    with pytest.raises(DataError, match="drop --lmdb"):
        build("lmdb", tiny, data=tiny.root)
    with pytest.raises(DataError, match="add --lmdb"):
        build("folder", tiny, data=tiny.lmdb)
    with pytest.raises(DataError, match="no such file"):  # main.py resolves the paths with it
        split_paths(os.path.join(tiny.root, "nope"))


def test_different_class_lists_are_refused(tiny, tmp_path):
    (tmp_path / "val" / "n09999999").mkdir(parents=True)
    src = os.path.join(tiny.root, "val", "n00000000", "n00000000_0.JPEG")
    (tmp_path / "val" / "n09999999" / "x.JPEG").write_bytes(open(src, "rb").read())
    with pytest.raises(DataError, match="different classes"):
        build("folder", tiny, val_path=str(tmp_path / "val"))


def test_too_few_images_for_one_batch(tiny):
    with pytest.raises(DataError, match="fewer than one batch"):
        build("folder", tiny, batch_size=64)
