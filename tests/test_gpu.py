"""CUDA paths: pinned, non-blocking copies, AMP and channels-last. Skipped without a GPU."""
import pytest
import torch

import loaders
import main
from loaders import DistInfo
from tests.conftest import loader_args, to_uint8
from tests.datagen import label_from_pixels

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("channels_last", [True, False])
def test_loader_delivers_normalised_batches_on_the_gpu(tiny, channels_last):
    """Channels-last shared slots, pinned staging, upload and normalisation on the GPU: the
    pixels still encode each sample's label."""
    dist = DistInfo(device=torch.device("cuda", 0))
    train, _ = loaders.build_loaders(
        "lmdb", loader_args(data=tiny.lmdb, channels_last=channels_last, workers=2), dist)
    for images, labels in train:
        assert images.is_cuda and labels.is_cuda and labels.dtype == torch.int64
        assert images.dtype == torch.float32
        assert images.is_contiguous(
            memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        assert [label_from_pixels(image, tiny.num_classes)
                for image in to_uint8(images.cpu())] == labels.tolist()


def test_amp_channels_last_training_on_gpu(tiny, tmp_path):
    last = main.main(["--lmdb", tiny.lmdb, "-b", "8", "-j", "2", "--epochs", "1", "--amp",
                      "--channels-last", "--train-crop-size", "64", "--val-resize-size", "64",
                      "--val-crop-size", "64", "--output-dir", str(tmp_path), "-p", "0"])
    assert last["train_loss"] > 0 and last["val_acc5"] >= 0
