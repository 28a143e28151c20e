"""ImageFolderLMDB (folder2lmdb.py): the contract of
torchvision's ImageFolder over one of our LMDBs, as PyTorch-LMDB's README promises."""
from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

import folder2lmdb
from folder2lmdb import ImageFolderLMDB
from formats.lmdb import encode_record
from loaders import DataError
from tools.datagen import label_from_pixels


def _same_metadata(ours: ImageFolderLMDB, ref: datasets.ImageFolder) -> None:
    assert ours.classes == ref.classes
    assert ours.class_to_idx == ref.class_to_idx
    assert len(ours) == len(ref)
    assert ours.targets == ref.targets
    assert all(type(t) is int for t in ours.targets)


@pytest.mark.parametrize("split", ["train", "val"])
def test_tiny_matches_imagefolder(tiny, split):
    ours = ImageFolderLMDB(os.path.join(tiny.lmdb, split))
    ref = datasets.ImageFolder(os.path.join(tiny.root, split))
    _same_metadata(ours, ref)
    for i in range(len(ref)):
        image, label = ours[i]
        ref_image, ref_label = ref[i]
        assert isinstance(image, Image.Image) and image.mode == "RGB"
        assert label == ref_label == label_from_pixels(np.asarray(image), tiny.num_classes)
        assert image.size == ref_image.size
        assert np.array_equal(np.asarray(image), np.asarray(ref_image))
    assert np.array_equal(np.asarray(ours[-1][0]), np.asarray(ref[len(ref) - 1][0]))
    with pytest.raises(IndexError):
        ours[len(ours)]


def test_sample_pixel_identical(sample_images, sample_images_lmdb):
    for split in ("train", "val"):
        ours = ImageFolderLMDB(os.path.join(sample_images_lmdb, split))
        ref = datasets.ImageFolder(os.path.join(sample_images, split))
        _same_metadata(ours, ref)
    # A few dozen training images across the classes: same JPEG bytes, same PIL decode.
    for i in np.linspace(0, len(ref) - 1, 36).round().astype(int).tolist():
        image, label = ours[i]
        ref_image, ref_label = ref[i]
        assert label == ref_label and image.mode == "RGB" and image.size == ref_image.size
        assert np.array_equal(np.asarray(image), np.asarray(ref_image)), f"record {i}"


def test_transforms_applied(tiny):
    ours = ImageFolderLMDB(os.path.join(tiny.lmdb, "val"), transform=transforms.ToTensor(),
                           target_transform=lambda t: t + 100)
    ref = datasets.ImageFolder(os.path.join(tiny.root, "val"), transform=transforms.ToTensor())
    image, label = ours[5]
    assert torch.equal(image, ref[5][0])
    assert label == ref.targets[5] + 100
    assert ours.targets == ref.targets  # targets are the stored labels, untransformed


def _plus_ten(label):  # module level: picklable for spawned workers
    return label + 10


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers(tiny, context):
    transform = transforms.Compose([transforms.Resize(32), transforms.CenterCrop(32),
                                    transforms.ToTensor()])
    ours = ImageFolderLMDB(os.path.join(tiny.lmdb, "val"), transform, _plus_ten)
    ours[0]  # an environment open in the parent must not reach the workers
    loader = DataLoader(ours, batch_size=4, num_workers=2, multiprocessing_context=context)
    images, labels = zip(*loader)
    images, labels = torch.cat(images), torch.cat(labels)
    assert images.shape == (len(ours), 3, 32, 32)
    assert labels.tolist() == [t + 10 for t in ours.targets]
    pixels = (images * 255).round().to(torch.uint8).numpy()
    assert [label_from_pixels(p, tiny.num_classes) + 10 for p in pixels] == labels.tolist()


def test_pickle_round_trip(tiny):
    ours = ImageFolderLMDB(os.path.join(tiny.lmdb, "train"), transform=transforms.ToTensor())
    first = ours[3]  # opens the environment in this process
    copy = pickle.loads(pickle.dumps(ours))
    assert copy.classes == ours.classes and len(copy) == len(ours)
    again = copy[3]
    assert torch.equal(again[0], first[0]) and again[1] == first[1]
    assert copy.targets == ours.targets
    kept = pickle.loads(pickle.dumps(ours))  # targets read once travel with the dataset
    assert kept._targets == ours.targets


def test_targets_lazy_and_without_decoding(tiny, monkeypatch):
    ours = ImageFolderLMDB(os.path.join(tiny.lmdb, "train"))
    assert ours._targets is None  # nothing read at construction

    def no_decode(data):
        raise AssertionError("targets decoded an image")

    monkeypatch.setattr(folder2lmdb, "pil_decode", no_decode)
    assert ours.targets == datasets.ImageFolder(os.path.join(tiny.root, "train")).targets


@pytest.mark.parametrize("size", [0, 200, 300, 70_000])  # bin8, bin8, bin16, bin32 headers
@pytest.mark.parametrize("label", [0, 127, 999, 70_000])
def test_label_of_matches_codec(size, label):
    value = encode_record(os.urandom(size), label)
    assert folder2lmdb._label_of(value) == label
    assert folder2lmdb._label_of(memoryview(value)) == label


def test_bad_path_one_line_error(tiny, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("not an lmdb")
    for path in (str(tmp_path / "missing"), os.path.join(tiny.root, "train"),
                 str(tmp_path / "empty"), str(tmp_path / "file.txt")):
        with pytest.raises(DataError) as info:
            ImageFolderLMDB(path)
        message = str(info.value)
        assert path in message and "\n" not in message
