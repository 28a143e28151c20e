"""Shared fixtures: small generated datasets (pixels encode the label), their LMDBs, and the
real ImageNet sample beside the checkout (``../shared/data/imagenet-sample``)."""
from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import folder2lmdb  # noqa: E402
from tests import datagen  # noqa: E402

SAMPLE = os.environ.get("IMAGENET_SAMPLE",
                        os.path.join(REPO, "..", "shared", "data", "imagenet-sample"))
NUM_CLASSES = 4


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """Flat-colour images (label readable from pixels): ``root/{train,val}`` JPEG folders and
    ``root/lmdb/{train,val}`` LMDBs; 4 classes, 8 train and 4 val images per class."""
    root = str(tmp_path_factory.mktemp("tiny"))
    datagen.make_dataset(root, NUM_CLASSES, train_per_class=8, val_per_class=4, seed=0)
    for split in ("train", "val"):
        folder2lmdb.convert(os.path.join(root, split), os.path.join(root, "lmdb", split),
                            progress=False)
    return SimpleNamespace(root=root, lmdb=os.path.join(root, "lmdb"), num_classes=NUM_CLASSES)


@pytest.fixture(scope="session")
def sample():
    """The real ImageNet sample (250 JPEGs, 250 classes); skipped, with the reason, if absent."""
    if not os.path.isdir(os.path.join(SAMPLE, "train")):
        pytest.skip(f"real ImageNet sample not found at {SAMPLE} (set IMAGENET_SAMPLE)")
    return os.path.abspath(SAMPLE)


@pytest.fixture(scope="session")
def sample_lmdb(sample, tmp_path_factory):
    """The real sample converted with folder2lmdb: ``root/train``, ``root/val``."""
    root = str(tmp_path_factory.mktemp("sample-lmdb"))
    for split in ("train", "val"):
        folder2lmdb.convert(os.path.join(sample, split), os.path.join(root, split), progress=False)
    return root


def loader_settings(backend: str = "folder", data: str | None = None, **overrides):
    """A :class:`loaders.LoaderSettings` with small explicit test values: ``backend``, the
    splits ``data/train`` and ``data/val`` (or ``train_path``/``val_path``), batch 4, no
    workers, seed 0, 32-px crops (val resize 32), every batch, float32 NCHW, random LMDB
    order (blocks of 256, 8 open), readahead auto (the CLI defaults); ``lmdb`` is True for the lmdb backend.
    ``overrides`` replace any field."""
    from loaders import LoaderSettings

    fields = dict(
        backend=backend, train_path=os.path.join(data, "train") if data else None,
        val_path=os.path.join(data, "val") if data else None, batch_size=4, workers=0,
        seed=0, lmdb=backend == "lmdb", train_crop_size=32, val_resize_size=32,
        val_crop_size=32, train_batches=None, val_batches=None, max_bad_share=0.01,
        channels_last=False, dtype=torch.float32, lmdb_order="random", lmdb_block_size=256,
        lmdb_buffer_blocks=8, lmdb_readahead="auto", dali_cpu=False, dali_hw_decoder_load=None)
    fields.update(overrides)
    return LoaderSettings(**fields)


@pytest.fixture
def one_torch_thread():
    """Elementwise comparisons on one torch thread: OpenMP threads spin against a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest absolute difference of two uint8 tensors of one shape (no widening copy)."""
    return int((torch.maximum(a, b) - torch.minimum(a, b)).max())


def to_uint8(images: torch.Tensor):
    """Normalised float ``(N, 3, H, W)`` batch -> the uint8 pixels it came from (numpy)."""
    from loaders.normalize import imagenet_mean_std

    mean, std = imagenet_mean_std()
    return (images * std + mean).round().clamp(0, 255).to(torch.uint8).numpy()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """The process ids of ``pid``'s children, theirs, and so on (from /proc)."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            for child in map(int, f.read().split()):
                found += [child, *descendants(child)]
    return found


def cmdline(pid: int) -> bytes:
    """``pid``'s command line, NUL-separated as /proc has it."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


# metrics.jsonl keys that depend on the training alone (not on timing)
TRAINING_KEYS = ("epoch", "train_res", "train_loss", "train_acc1", "val_loss", "val_acc1",
                 "val_acc5", "lr", "train_images", "val_images")


def assert_same_training(out: str, expected: str, resumed: bool = True) -> None:
    """The run in ``out`` ended with the weights (bit for bit) and the per-epoch figures of the
    run in ``expected``. After a mid-epoch resume the epoch's training loss is summed in
    another order (carried sums), so it is compared to 1e-6; everything else exactly."""
    import json

    def records(where):
        with open(os.path.join(where, "metrics.jsonl")) as f:
            return {r["epoch"]: r for r in map(json.loads, f)}  # a repeated epoch: the last

    got, want = records(out), records(expected)
    assert sorted(got) == sorted(want)
    for epoch, record in want.items():
        for key in TRAINING_KEYS:
            if key == "train_loss" and resumed:
                assert got[epoch][key] == pytest.approx(record[key], rel=1e-6), (epoch, key)
            else:
                assert got[epoch][key] == record[key], (epoch, key)
    a, b = (torch.load(os.path.join(where, "checkpoint.pth.tar"), weights_only=True)
            for where in (out, expected))
    assert (a["epoch"], a["batch"]) == (b["epoch"], b["batch"])
    for name, tensor in b["state_dict"].items():
        assert torch.equal(a["state_dict"][name], tensor), name


def check_set_epoch_reproducible(build_train) -> list:
    """Loaders from ``build_train()`` give the same batches (order and augmentation) for the
    same ``set_epoch`` and others for another epoch. Returns the first epoch's batches."""
    def epoch_batches(epoch):
        train = build_train()
        train.set_epoch(epoch)
        return list(train)

    first, again, other = epoch_batches(3), epoch_batches(3), epoch_batches(4)
    assert len(first) == len(again) == len(other)
    for (a_img, a_lab), (b_img, b_lab) in zip(first, again):
        assert torch.equal(a_lab, b_lab) and torch.equal(a_img, b_img)
    assert not all(torch.equal(a, b) for (_, a), (_, b) in zip(first, other))
    return first
