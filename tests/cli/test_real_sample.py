"""The real ImageNet sample (../shared/data/imagenet-sample): conversion, loaders, training."""
import json
import os

import pytest
import torch
from torchvision.datasets import ImageFolder

import loaders
import main
from loaders import DistInfo
from tests.helpers.loading import loader_settings
from tests.helpers.stores import check_db_matches_folder


def test_every_record_matches_source_bytes_and_imagefolder_labels(sample, sample_lmdb):
    for split in ("train", "val"):
        check_db_matches_folder(os.path.join(sample_lmdb, split), os.path.join(sample, split))
    assert len(ImageFolder(os.path.join(sample, "train")).classes) == 250


def test_folder_and_lmdb_decode_every_real_image_identically(sample, sample_lmdb):
    """Includes the sample's grayscale JPEGs, which must come out as 3-channel images."""
    args = dict(batch_size=25, val_resize_size=64, val_crop_size=56, workers=2)
    _, folder_val = loaders.build_loaders(loader_settings("folder", data=sample, **args),
                                          DistInfo())
    _, lmdb_val = loaders.build_loaders(loader_settings("lmdb", data=sample_lmdb, **args),
                                        DistInfo())
    seen = 0
    for (fi, fl), (li, ll) in zip(folder_val, lmdb_val, strict=True):
        assert fi.shape == (25, 3, 56, 56) and torch.equal(fi, li) and torch.equal(fl, ll)
        seen += len(fl)
    assert seen == 250


@pytest.mark.parametrize("backend", ["folder", "lmdb"])
def test_one_short_epoch_on_real_images(sample, sample_lmdb, backend, tmp_path):
    data = ["--lmdb", sample_lmdb] if backend == "lmdb" else [sample]
    main.main([*data, "-a", "resnet18", "-b", "16", "-j", "2", "--epochs", "1",
               "--train-batches", "3", "--val-batches", "2", "--train-crop-size", "128",
               "--val-resize-size", "146", "--val-crop-size", "128", "-p", "1",
               "--output-dir", str(tmp_path)])
    with open(tmp_path / "metrics.jsonl") as f:
        (record,) = [json.loads(line) for line in f]
    assert record["epoch"] == 0 and record["train_loss"] > 0 and record["train_images_per_sec"] > 0
