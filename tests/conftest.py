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


def loader_args(**overrides):
    """A namespace with the attributes backends read, as main.parse_args would produce."""
    import main

    args = main.parse_args([])
    args.workers, args.seed, args.batch_size = 0, 0, 4
    args.train_crop_size, args.val_resize_size, args.val_crop_size = 32, 32, 32
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


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
