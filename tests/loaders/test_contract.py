"""The loader contract (``loaders.settings``), once for every reader x pipeline: shapes, dtypes,
device, exact ``len()``, labels that match the pixels, every validation image once,
``set_epoch`` reproducibility, ``close()``; a reader written here in a few lines plugs into
every pipeline; then what the workers pipeline and the readers do beyond it."""
import json
import os
import pickle
import sys

import pytest
import torch

import loaders
from loaders import DataError, DistInfo
from loaders.readers import split_paths
from loaders.orders import RandomOrder, ShardOrder
from loaders.readers import Reader, open_reader
from loaders.readers.lmdb_records import LMDBReader
from tests.helpers.loading import check_set_epoch_reproducible, loader_settings, to_uint8
from tools.datagen import label_from_pixels

READERS = ["folder", "lmdb", "shards"]
STORES = READERS + ["lmdb-raw", "shards-raw"]  # -raw: a store with a raw-pixel share
PIPELINES = ["workers"]
try:
    import nvidia.nvimgcodec  # noqa: F401
    PIPELINES.append("gpu_decode")  # on nvImageCodec's CPU backend (--decode-device cpu-nvimgcodec)
except ImportError:
    pass
try:
    import nvidia.dali  # noqa: F401
    PIPELINES.append("dali")
except ImportError:
    pass


def build(backend, tiny, **overrides):
    overrides.setdefault("data", tiny.lmdb if backend == "lmdb" else tiny.root)
    return loaders.build_loaders(loader_settings(backend, **overrides), DistInfo())


def build_pair(tiny, tiny_shards, reader, pipeline, tiny_raw=None, **overrides):
    """``(train, val)`` of ``reader`` through ``pipeline`` (2 workers or DALI threads); a
    ``-raw`` reader reads ``tiny_raw``'s stores (raw records and JPEGs mixed)."""
    data = {"folder": tiny.root, "lmdb": tiny.lmdb, "shards": tiny_shards,
            "lmdb-raw": tiny_raw and tiny_raw.lmdb, "shards-raw": tiny_raw and tiny_raw.shards}
    source = reader.removesuffix("-raw")
    settings = loader_settings(source if pipeline != "dali" else "dali", data=data[reader],
                               lmdb=source == "lmdb", shards=source == "shards", workers=2,
                               decode_device=_DECODE_DEVICE[pipeline], **overrides)
    assert (settings.source, settings.pipeline) == (source, pipeline)
    return loaders.build_loaders(settings, DistInfo())


_DECODE_DEVICE = {"workers": "cpu", "gpu_decode": "cpu-nvimgcodec", "dali": "cpu"}


def check_contract(train, val, num_classes: int) -> None:
    assert train.classes == val.classes == [f"n{c:08d}" for c in range(num_classes)]
    assert isinstance(train, loaders.Loader) and isinstance(val, loaders.Loader)
    for loader, images_total in ((train, 32), (val, 16)):
        batches = list(loader)
        assert len(batches) == len(loader) == images_total // 4  # exact len()
        for images, labels in batches:
            assert images.dtype == torch.float32 and images.shape == (4, 3, 32, 32)
            assert labels.dtype == torch.int64 and labels.shape == (4,)
            assert images.device.type == labels.device.type == "cpu"
            # Normalised with the ImageNet mean/std, and the pixels still encode the label.
            pixels = to_uint8(images)
            assert [label_from_pixels(p, num_classes) for p in pixels] == labels.tolist()
    val_labels = torch.cat([labels for _, labels in val])
    assert sorted(val_labels.tolist()) == sorted(list(range(4)) * 4)  # every val image once
    for loader in (train, val):
        loader.close()
        assert len(list(loader)) == len(loader)  # a pass after close() starts afresh


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("reader", STORES)
def test_contract(tiny, tiny_shards, tiny_raw, reader, pipeline):
    check_contract(*build_pair(tiny, tiny_shards, reader, pipeline, tiny_raw), tiny.num_classes)


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("reader", STORES)
def test_set_epoch_makes_order_and_augmentation_reproducible(tiny, tiny_shards, tiny_raw, reader,
                                                             pipeline):
    check_set_epoch_reproducible(lambda: build_pair(tiny, tiny_shards, reader, pipeline,
                                                    tiny_raw)[0])


class MemoryReader(Reader):
    """A new source in a few lines: samples held in memory (what a new format's reader adds)."""

    def __init__(self, folder_reader):
        self.classes = folder_reader.classes
        self.samples = [folder_reader.read(i) for i in range(len(folder_reader))]

    def __len__(self):
        return len(self.samples)

    def read(self, index):
        return self.samples[index]

    def name_of(self, index):
        return f"memory record {index}"

    def train_order(self, settings, dist):
        return RandomOrder(len(self), dist.rank, dist.world_size, settings.seed)

    def val_order(self, settings, dist):
        return ShardOrder(len(self), dist.rank, dist.world_size)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_new_reader_plugs_into_every_pipeline(tiny, pipeline):
    import importlib

    settings = loader_settings("folder" if pipeline != "dali" else "dali", data=tiny.root,
                               workers=2, decode_device=_DECODE_DEVICE[pipeline])
    pair = [MemoryReader(open_reader("folder", os.path.join(tiny.root, split), settings))
            for split in ("train", "val")]
    module = importlib.import_module(loaders.PIPELINES[pipeline])
    check_contract(*module.build_loaders(*pair, settings, DistInfo()), tiny.num_classes)


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


@pytest.mark.slow
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
        train_seen.append(list(train.sampler.indices()))
        val_seen.extend(val.sampler.indices())
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


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_split_under_one_batch_trains_as_one_smaller_batch(tiny, tiny_shards, reader,
                                                             pipeline):
    """pytorch/examples' DataLoader keeps the partial batch: 32 images, -b 64 -> one batch
    of 32 per epoch, on every reader and pipeline; equal on two ranks (16 each)."""
    train, val = build_pair(tiny, tiny_shards, reader, pipeline, batch_size=64)
    assert train.batch_size == 32 and len(train) == 1
    (images, labels), = list(train)
    assert images.shape == (32, 3, 32, 32) and len(labels) == 32
    train.close()
    val.close()
    data = {"folder": tiny.root, "lmdb": tiny.lmdb, "shards": tiny_shards}[reader]
    settings = loader_settings(reader if pipeline == "workers" else "dali", data=data,
                               lmdb=reader == "lmdb", shards=reader == "shards", batch_size=64)
    for rank in (0, 1):
        two, _ = loaders.build_loaders(settings, DistInfo(rank=rank, world_size=2))
        assert two.batch_size == 16 and len(two) == 1 and len(next(iter(two))[1]) == 16
        two.close()


def test_more_processes_than_images_is_one_line(tiny):
    with pytest.raises(DataError, match="no image for this process"):
        loaders.build_loaders(loader_settings("folder", data=tiny.root),
                              DistInfo(rank=40, world_size=41))


@pytest.mark.parametrize("reader", READERS)
def test_readers_read_from_several_threads_at_once(tiny, tiny_shards, reader, tmp_path):
    """DALI's feeds read one reader from a thread each: a store never opened in this process
    is opened by whichever thread reads first while the others race it (py-lmdb refuses a
    second open of one file in a process; the shard reader's file handles are a shared cache),
    and every thread still gets the stored bytes."""
    import shutil

    data = {"folder": tiny.root, "lmdb": tiny.lmdb, "shards": tiny_shards}[reader]
    settings = loader_settings(reader, data=data)
    want = [open_reader(reader, settings.train_path, settings).read(i) for i in range(32)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two bytecodes: races show
    try:
        for copy in range(6):  # a copy never opened here: its first reads race to open it
            path = str(tmp_path / f"copy{copy}")
            shutil.copytree(settings.train_path, path)
            check_threads(open_reader(reader, path, settings), want)
    finally:
        sys.setswitchinterval(interval)


def check_threads(shared, want):
    """8 threads read every sample of ``shared`` at once, each from another offset."""
    import threading

    got, errors, start = {}, [], threading.Barrier(8)

    def read_all(offset):
        start.wait()
        try:
            for i in range(32):
                got[(offset, i)] = shared.read((i + offset) % 32)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=read_all, args=(k * 4,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert all(value == want[(i + offset) % 32] for (offset, i), value in got.items())


def test_the_raw_share_stores_mix_both_kinds(tiny_raw):
    """The ``-raw`` stores above hold raw records and JPEGs (each path of decode/ is read)."""
    from tests.helpers.stores import raw_records

    kinds = raw_records(os.path.join(tiny_raw.lmdb, "train"))
    assert 0 < sum(kinds) < len(kinds)
    with open(os.path.join(tiny_raw.shards, "train", "index.json")) as f:
        assert 0 < json.load(f)["raw"]["records"] < len(kinds)
