"""CUDA paths: page-locked slots and the side-stream copy, AMP float16 and bfloat16,
channels-last, torch.compile, --gpu, per-rank RNG resume and NCCL. Skipped without a GPU;
`make gpu-check` runs them on a GPU machine."""
import json
import math
import os
import threading

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
    """A finite loss; top-5 over 4 classes counts every image (top-min(5, classes)); the
    weights trained and saved in channels-last; loss scaling for float16 only."""
    last = main.main(["--lmdb", tiny.lmdb, *TINY, "--epochs", "1", "--amp", "--amp-dtype",
                      amp_dtype, "--channels-last", "--output-dir", str(tmp_path)])
    assert math.isfinite(last["train_loss"]) and last["train_loss"] > 0
    assert last["val_acc5"] == 100.0 and last["val_images"] == 16
    checkpoint = torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)
    convs = [t for t in checkpoint["state_dict"].values() if t.dim() == 4]
    assert convs and all(t.is_contiguous(memory_format=torch.channels_last) for t in convs)
    assert not all(t.is_contiguous() for t in convs)  # not merely both (1x1 kernels)
    assert bool(checkpoint["scaler"]) == (amp_dtype == "float16")  # bfloat16: no loss scaling


def test_compile_trains_and_checkpoints_bare_keys(tiny, tmp_path):
    last = main.main([tiny.root, *TINY, "--epochs", "1", "--amp", "--channels-last",
                      "--compile", "--output-dir", str(tmp_path)])
    assert last["train_loss"] > 0
    state = torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)["state_dict"]
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in state)


def test_gpu_flag_makes_that_device_current(tiny, tmp_path, monkeypatch):
    """--gpu N: the training thread makes GPU N current (``torch.cuda.set_device``) and trains
    there. With two GPUs or more N is one that is not current before the run, so the current
    device after it shows the switch; on one GPU (N = 0, current from the start) the call does,
    seen through a wrapper that records the main thread's calls and makes them."""
    gpu = 1 if torch.cuda.device_count() > 1 and torch.cuda.current_device() == 0 else 0
    assert torch.cuda.device_count() == 1 or torch.cuda.current_device() != gpu
    calls, set_device = [], torch.cuda.set_device

    def recorded(device):
        if threading.current_thread() is threading.main_thread():
            calls.append(torch.device("cuda", device) if isinstance(device, int)
                         else torch.device(device))
        set_device(device)

    monkeypatch.setattr(torch.cuda, "set_device", recorded)
    torch.cuda.reset_peak_memory_stats(gpu)
    main.main([tiny.root, *TINY, "--epochs", "1", "--gpu", str(gpu),
               "--output-dir", str(tmp_path)])
    assert torch.device("cuda", gpu) in calls and torch.cuda.current_device() == gpu
    assert torch.cuda.max_memory_allocated(gpu) > 0  # the model and batches went there


def test_resume_restores_this_gpus_rng_state_and_amp_resume_without_scaler(tiny, tmp_path):
    """The CUDA generator state saved for this rank is the one the resumed run goes on with
    (a planted state, unlike the one ``--seed`` gives, read back after a resume with nothing
    left to train); a checkpoint without AMP evaluates and trains on under --amp."""
    out = str(tmp_path / "run")
    main.main([tiny.root, *TINY, "--epochs", "1", "--output-dir", out])  # no AMP: empty scaler
    path = os.path.join(out, "checkpoint.pth.tar")
    checkpoint = torch.load(path, weights_only=True)
    assert isinstance(checkpoint["rng"][0]["cuda"], torch.Tensor) and not checkpoint["scaler"]
    torch.cuda.manual_seed(12345)
    planted = torch.cuda.get_rng_state()
    checkpoint["rng"][0]["cuda"] = planted
    torch.save(checkpoint, str(tmp_path / "planted.pth.tar"))
    torch.cuda.manual_seed(0)  # what the run's --seed 0 sets, before it resumes
    assert not torch.equal(torch.cuda.get_rng_state(), planted)
    assert main.main([tiny.root, *TINY, "--epochs", "1", "--output-dir", str(tmp_path / "r"),
                      "--resume", str(tmp_path / "planted.pth.tar")]) == {}  # epoch 1 of 1: done
    assert torch.equal(torch.cuda.get_rng_state(), planted)
    stats = main.main([tiny.root, *TINY, "-e", "--amp", "--resume", path])
    assert stats["images"] == 16 and math.isfinite(stats["loss"])
    last = main.main([tiny.root, *TINY, "--epochs", "2", "--amp", "--output-dir", out,
                      "--resume", path])
    assert last["epoch"] == 1 and math.isfinite(last["train_loss"])
    resumed = torch.load(path, weights_only=True)
    assert resumed["epoch"] == 2 and resumed["scaler"]  # float16 AMP: a loss scaler from here


def test_nccl_multiprocessing_distributed_trains_and_validates(tiny, tmp_path):
    out = str(tmp_path / "ddp")
    assert main.main([tiny.root, *TINY, "--epochs", "1", "--amp", "--channels-last",
                      "--multiprocessing-distributed", "--dist-backend", "nccl",
                      "--output-dir", out]) == {}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        record = json.loads(f.readline())
    assert record["val_images"] == 16 and record["train_images"] > 0
