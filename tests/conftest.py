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
    from loaders._common import imagenet_mean_std

    mean, std = imagenet_mean_std()
    return (images * std + mean).round().clamp(0, 255).to(torch.uint8).numpy()


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
