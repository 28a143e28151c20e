"""CUDA paths: page-locked slots and the side-stream copy, AMP float16 and bfloat16,
channels-last, torch.compile, --gpu, per-rank RNG resume and NCCL. Skipped without a GPU;
`make gpu-check` runs them on a GPU machine."""
import json
import os

import pytest
import torch

import loaders
import main
from loaders import DistInfo, input_dtype
from tests.helpers.loading import loader_settings, to_uint8
from tools.datagen import label_from_pixels

pytestmark = pytest.mark.gpu

TINY = ["-b", "8", "-j", "2", "--train-crop-size", "64", "--val-resize-size", "64",
        "--val-crop-size", "64", "-p", "0", "--seed", "0"]


def _pixels_match_labels(images, labels, num_classes):
    return [label_from_pixels(image, num_classes)
            for image in to_uint8(images.float().cpu())] == labels.tolist()


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("amp_dtype", [None, "float16", "bfloat16"])
def test_loader_delivers_normalised_batches_on_the_gpu(tiny, channels_last, amp_dtype):
    """Page-locked channels-last slots, the side-stream upload and normalisation on the GPU
    into the autocast dtype: over several epochs the pixels still encode each label."""
    dist = DistInfo(device=torch.device("cuda", 0))
    dtype = input_dtype(amp_dtype is not None, amp_dtype or "float16", dist.device)
    settings = loader_settings("lmdb", data=tiny.lmdb, channels_last=channels_last, workers=2,
                               dtype=dtype)
    train, _ = loaders.build_loaders(settings, dist)
    expected = getattr(torch, amp_dtype) if amp_dtype else torch.float32
    for epoch in range(3):
        train.set_epoch(epoch)
        for images, labels in train:
            assert images.is_cuda and labels.is_cuda and labels.dtype == torch.int64
            assert images.dtype == expected
            assert images.is_contiguous(
                memory_format=torch.channels_last if channels_last else torch.contiguous_format)
            assert _pixels_match_labels(images, labels, tiny.num_classes)
    assert train._locked, "the shared slots could not be page-locked (cudaHostRegister)"


def test_side_stream_copies_stay_correct_while_the_gpu_is_busy(tiny):
    """A long kernel queued on the current stream after each batch: batches copied ahead on
    the side stream must neither be overwritten nor read before they are complete."""
    dist = DistInfo(device=torch.device("cuda", 0))
    train, _ = loaders.build_loaders(loader_settings("folder", data=tiny.root, workers=2), dist)
    busy = torch.randn(2048, 2048, device="cuda")
    for images, labels in train:
        for _ in range(20):
            busy = busy @ busy / 2048
        assert _pixels_match_labels(images, labels, tiny.num_classes)


@pytest.mark.parametrize("amp_dtype", ["float16", "bfloat16"])
def test_amp_channels_last_training_on_gpu(tiny, tmp_path, amp_dtype):
    last = main.main(["--lmdb", tiny.lmdb, *TINY, "--epochs", "1", "--amp", "--amp-dtype",
                      amp_dtype, "--channels-last", "--output-dir", str(tmp_path)])
    assert last["train_loss"] > 0 and last["val_acc5"] >= 0
    scaler = torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)["scaler"]
    assert bool(scaler) == (amp_dtype == "float16")  # bfloat16 needs no loss scaling


def test_compile_trains_and_checkpoints_bare_keys(tiny, tmp_path):
    last = main.main([tiny.root, *TINY, "--epochs", "1", "--amp", "--channels-last",
                      "--compile", "--output-dir", str(tmp_path)])
    assert last["train_loss"] > 0
    state = torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)["state_dict"]
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in state)


def test_gpu_flag_makes_that_device_current(tiny, tmp_path):
    gpu = torch.cuda.device_count() - 1
    main.main([tiny.root, *TINY, "--epochs", "1", "--gpu", str(gpu),
               "--output-dir", str(tmp_path)])
    assert torch.cuda.current_device() == gpu


def test_resume_restores_this_gpus_rng_state_and_amp_resume_without_scaler(tiny, tmp_path):
    out = str(tmp_path / "run")
    main.main([tiny.root, *TINY, "--epochs", "1", "--output-dir", out])  # no AMP: empty scaler
    checkpoint = torch.load(os.path.join(out, "checkpoint.pth.tar"), weights_only=True)
    saved = checkpoint["rng"][0]["cuda"]
    assert isinstance(saved, torch.Tensor)
    stats = main.main([tiny.root, *TINY, "-e", "--amp", "--resume",
                       os.path.join(out, "checkpoint.pth.tar")])
    assert stats["images"] > 0
    main.main([tiny.root, *TINY, "--epochs", "2", "--amp", "--output-dir", out,
               "--resume", os.path.join(out, "checkpoint.pth.tar")])


def test_nccl_multiprocessing_distributed_trains_and_validates(tiny, tmp_path):
    out = str(tmp_path / "ddp")
    assert main.main([tiny.root, *TINY, "--epochs", "1", "--amp", "--channels-last",
                      "--multiprocessing-distributed", "--dist-backend", "nccl",
                      "--output-dir", out]) == {}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        record = json.loads(f.readline())
    assert record["val_images"] == 16 and record["train_images"] > 0
