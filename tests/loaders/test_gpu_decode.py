"""The batch-decode pipeline (``--decode-device``), on nvImageCodec's CPU backend
(``cpu-nvimgcodec``, the code the GPU runs with its GPU backends): the workers draw the CPU
loaders' windows, its pixels stay within a stated bound of theirs on the real sample, resume is
exact, bad samples follow the CPU loaders' rules, and main.py runs it (its first line names the
decoder). Its contract (every reader) is in test_contract.py."""
import os
import shutil

import numpy as np
import pytest
import torch

import loaders
from decode import jpeg
from loaders import DataError, DistInfo
from loaders.pipelines.batches import NumberedBatch, PassPlan
from loaders.transforms import TrainTransform
from tests.helpers.loading import loader_settings, to_uint8
from tests.helpers.runs import SMALL, cli_in_process, read_metrics, run_cli

pytestmark = pytest.mark.skipif(not jpeg.window.available(), reason="nvImageCodec not installed")

# Measured on the real sample (250 JPEGs, folder, -b 25, seed 0, 224 px; the CPU loaders
# against cpu-nvimgcodec, after normalisation rounded back to uint8). Training crops, epoch 1:
# max 32, mean 0.020 levels, 245 of 250 crops equal (epoch 0: max 55, mean 0.038); the others
# are windows at least twice the output, which the CPU loaders decode at libjpeg-turbo's DCT
# scale. Validation: max 76, mean 0.077 (the CPU loaders' own shortcut, DCT-scaled decoding,
# against this pipeline's exact resize-then-crop: test_validation_is_exactly_resize_then_crop).
# Bounds: a margin above.
TRAIN_MEAN_BOUND, VAL_MEAN_BOUND = 0.1, 0.2
EQUAL_SHARE = 0.9  # share of training crops equal to the CPU loaders'


def _build(data, decode_device, **overrides):
    settings = loader_settings("folder", data=data, decode_device=decode_device, **overrides)
    return loaders.build_loaders(settings, DistInfo())


def _uint8_epoch(loader, epoch=0, start_batch=0):
    if loader.train:
        loader.set_epoch(epoch, start_batch)
    return [(to_uint8(images), labels) for images, labels in loader]


def test_workers_draw_the_cpu_loaders_windows(sample_images):
    train, _ = _build(sample_images, "cpu-nvimgcodec", batch_size=8)
    plan = PassPlan(0, None, (0, 2, 0, 0), None)
    batch = NumberedBatch(list(range(0, 64, 8)), 3, plan)
    item = train._dataset.__getitems__(batch)
    draw = TrainTransform()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(plan.seed(3))
        expected = [draw.window(train.reader.read(i)[0]) for i in batch]
    assert item["windows"].tolist() == [list(w) for w, _, _ in expected]
    assert item["flips"].tolist() == [flip for _, flip, _ in expected]
    assert item["indices"].tolist() == list(batch)


def test_pixels_within_the_stated_bound_of_the_cpu_loaders(sample):
    sizes = dict(batch_size=25, workers=2, train_crop_size=224, val_resize_size=256,
                 val_crop_size=224)
    runs = {}
    for device in ("cpu", "cpu-nvimgcodec"):
        train, val = _build(sample, device, **sizes)
        runs[device] = (_uint8_epoch(train, 1), _uint8_epoch(val))
        train.close()
        val.close()
    for split, bound in ((0, TRAIN_MEAN_BOUND), (1, VAL_MEAN_BOUND)):
        diffs = []
        for (a, la), (b, lb) in zip(runs["cpu"][split], runs["cpu-nvimgcodec"][split],
                                    strict=True):
            assert torch.equal(la, lb)
            diffs.append(np.abs(a.astype(np.int16) - b.astype(np.int16)))
        diff = np.concatenate(diffs)
        assert diff.mean() <= bound, (split, diff.mean(), diff.max())
        if split == 0:
            equal = (diff.reshape(len(diff), -1).max(1) == 0).mean()
            assert equal >= EQUAL_SHARE


def test_resume_and_worker_count_give_the_same_batches(tiny):
    def epoch(workers, start_batch=0):
        train, _ = _build(tiny.root, "cpu-nvimgcodec", workers=workers)
        out = _uint8_epoch(train, 4, start_batch)
        train.close()
        return out

    whole, with_workers, resumed = epoch(0), epoch(2), epoch(2, start_batch=3)
    assert len(whole) == len(with_workers) == len(resumed) + 3
    for (a, la), (b, lb) in zip(whole, with_workers):
        assert torch.equal(la, lb) and (a == b).all()
    for (a, la), (b, lb) in zip(whole[3:], resumed):
        assert torch.equal(la, lb) and (a == b).all()


def test_set_resolution_resizes_in_the_training_process(tiny):
    train, val = _build(tiny.root, "cpu-nvimgcodec", train_max_crop_size=48)
    train.set_resolution(48)
    assert next(iter(train))[0].shape == (4, 3, 48, 48) and train.resolution == 48
    with pytest.raises(ValueError):
        train.set_resolution(64)
    with pytest.raises(ValueError):
        val.set_resolution(32)


def _with_damaged(tiny, tmp_path):
    """A copy of tiny's folders with two damaged training files: one no header parser reads
    (the workers' rule), one whose header parses but whose data nothing decodes (the
    training process's)."""
    root = str(tmp_path / "data")
    shutil.copytree(tiny.root, root, ignore=shutil.ignore_patterns("lmdb"))
    cls = os.path.join(root, "train", sorted(os.listdir(os.path.join(root, "train")))[0])
    good = open(os.path.join(cls, sorted(os.listdir(cls))[0]), "rb").read()
    with open(os.path.join(cls, "zz_text.JPEG"), "wb") as f:
        f.write(b"<html>404</html>\n" * 8)
    with open(os.path.join(cls, "zz_header_only.JPEG"), "wb") as f:
        f.write(good[:good.index(b"\xff\xda") + 20])
    from PIL import Image  # and a CMYK JPEG: declined by the batch decoder, decoded on the CPU
    Image.new("CMYK", (40, 40), (10, 200, 30, 0)).save(os.path.join(cls, "zz_cmyk.JPEG"))
    return root


def test_declined_samples_decode_on_the_cpu_and_undecodable_ones_are_replaced(tiny, tmp_path, capfd):
    root = _with_damaged(tiny, tmp_path)
    train, _ = _build(root, "cpu-nvimgcodec", workers=2, max_bad_share=0.1)
    for epoch in range(3):
        batches = _uint8_epoch(train, epoch)
        assert len(batches) == len(train) and all(len(b[1]) == 4 for b in batches)
    err = capfd.readouterr().err
    assert err.count("zz_text.JPEG") == 1 and err.count("zz_header_only.JPEG") == 1
    assert train.unreadable.count() == 2
    assert train.cpu_fallbacks >= 1 and "samples decoded on the CPU this pass" in err
    train.close()
    for workers in (0, 2):  # raised on this thread, or handed over by the decode thread
        strict, _ = _build(root, "cpu-nvimgcodec", workers=workers, max_bad_share=0.01)
        with pytest.raises(DataError, match="max-bad-share"):
            for epoch in range(3):
                _uint8_epoch(strict, epoch)
        strict.close()


def test_main_trains_with_the_batch_decoder_and_names_it_first(tiny, tmp_path, capfd):
    out = str(tmp_path / "run")
    result = cli_in_process([tiny.root, *SMALL, "--epochs", "1", "--decode-device",
                             "cpu-nvimgcodec", "--output-dir", out], capfd)
    assert result.returncode == 0, result.stderr[-2000:]
    device_line = next(line for line in result.stdout.splitlines()
                       if line.startswith("device:"))
    assert "batch windows: nvImageCodec" in device_line and "CPU backend" in device_line
    assert np.isfinite(read_metrics(out)[0]["train_loss"])


@pytest.mark.parametrize("flags, message", [
    (["--decode-device", "cuda", "--no-accel"], "--decode-device cuda needs a CUDA device"),
    (["--decode-device", "cuda", "--dali"], "conflicts with --dali"),
    (["--decode-device", "cuda", "--hw-decoder-load", "1.5"], "--hw-decoder-load 1.5"),
    (["--decode-device", "cpu-nvimgcodec", "--auto-augment", "ta_wide"], "with --auto-augment"),
    (["--decode-device", "cpu-nvimgcodec", "--interpolation", "bicubic"],
     "not --interpolation bicubic"),
])
def test_bad_decode_flags_end_in_one_line(tiny, tmp_path, flags, message, capfd):
    result = cli_in_process([tiny.root, *SMALL, "--epochs", "1", *flags,
                             "--output-dir", str(tmp_path)], capfd)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("main.py: error:") and message in lines[-1], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_resumed_training_matches_the_uninterrupted_run(tiny, tmp_path):
    """Two epochs in one run against one epoch, then ``--resume auto`` for the second: the
    same weights bit for bit and the same figures (the windows are a function of (seed,
    epoch, rank, batch))."""
    from tests.helpers.runs import assert_same_training

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    flags = [tiny.root, *SMALL, "-j", "2", "--decode-device", "cpu-nvimgcodec"]
    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    for extra, out in ((["--epochs", "2"], whole), (["--epochs", "1"], parts),
                       (["--epochs", "2", "--resume", "auto"], parts)):
        result = run_cli(*flags, *extra, "--output-dir", out, env=env)
        assert result.returncode == 0, result.stderr[-2000:]
    assert_same_training(parts, whole, resumed=False)


def test_validation_is_exactly_resize_then_crop(sample_images):
    """The central crop's region (with the filter's reach) decoded and resampled in its frame
    gives pytorch/examples' Resize + CenterCrop pixels exactly (torch's antialiased resize of
    the whole decode), on the sample's validation images."""
    import glob

    from decode import decode, gpu
    from loaders.transforms import center_crop_plan, resize_center_crop

    decoder = gpu.WindowDecoder("cpu-nvimgcodec", torch.device("cpu"))
    for path in sorted(glob.glob(os.path.join(sample_images, "val", "*", "*")))[::5]:
        data = open(path, "rb").read()
        whole = decode(data)
        region, frame = center_crop_plan(*whole.shape[-2:], 256, 224)
        assert region[2] * region[3] < whole.shape[-1] * whole.shape[-2]  # a part, not all
        out = decoder.decode([data], [region], (224, 224), 0, [frame]).images[0]
        assert torch.equal(out, resize_center_crop(whole, 256, 224)), path


def test_streamed_shards_match_the_workers_pipeline_and_resume(tiny_shards):
    """Streamed shards (``pipe:``: each worker reads its own streams, the reader plans each
    pass): the same labels batch for batch as the CPU loaders, and a mid-epoch resume yields
    exactly the rest."""
    import glob

    tars = sorted(os.path.basename(p) for p in glob.glob(os.path.join(tiny_shards, "train",
                                                                       "*.tar")))
    prefix = tars[0].rsplit("-", 1)[0]
    stream = (f"pipe:cat {tiny_shards}/train/{prefix}-{{000000..{len(tars) - 1:06d}}}.tar")
    runs = {}
    for device in ("cpu", "cpu-nvimgcodec"):
        settings = loader_settings("shards", data=tiny_shards, shards=True, workers=2,
                                   decode_device=device, train_path=stream)
        train, _ = loaders.build_loaders(settings, DistInfo())
        runs[device] = _uint8_epoch(train, 2)
        if device != "cpu":
            rest = _uint8_epoch(train, 2, start_batch=3)
        train.close()
    for (_, la), (_, lb) in zip(runs["cpu"], runs["cpu-nvimgcodec"], strict=True):
        assert torch.equal(la, lb)
    for (a, la), (b, lb) in zip(runs["cpu-nvimgcodec"][3:], rest, strict=True):
        assert torch.equal(la, lb) and (a == b).all()


def test_a_pass_left_early_stops_its_decode_thread_and_the_next_is_exact(tiny):
    import threading

    def threads():
        return {t for t in threading.enumerate() if t.name == "batch-decode"}

    reference, _ = _build(tiny.root, "cpu-nvimgcodec", workers=2)
    expected = _uint8_epoch(reference, 1)
    reference.close()
    train, _ = _build(tiny.root, "cpu-nvimgcodec", workers=2)
    train.set_epoch(0)
    left = iter(train)
    next(left)
    assert threads()  # decoding ahead of this thread
    left.close()
    assert not threads()
    got = _uint8_epoch(train, 1)
    for (a, la), (b, lb) in zip(expected, got, strict=True):
        assert torch.equal(la, lb) and (a == b).all()
    train.close()


def test_cuda_without_a_gpu_decoder_refuses_in_one_line_naming_the_wheel_and_the_flag():
    """Where no GPU decoder decodes (no libnvjpeg), ``--decode-device cuda`` stops before
    training in one line: what each decoder said, the wheel to install, and the flag that
    allows the CPU fallback instead (``--allow-cpu-decode``)."""
    from decode.gpu import CudaChoice, nvjpeg_pip_package
    from loaders.pipelines.gpu_decode import refusal

    choice = CudaChoice("cuda:0", None, ("nvImageCodec: declined a baseline JPEG (libnvjpeg "
                                         "not found?)", "torchvision decode_jpeg: RuntimeError: x"))
    line = refusal(choice)
    assert "\n" not in line and line.startswith("--decode-device cuda: no GPU decoder decodes on "
                                                "cuda:0 (nvImageCodec: declined")
    cuda = (torch.version.cuda or "13").split(".")[0]
    assert f"install {nvjpeg_pip_package(cuda)} beside nvidia-nvimgcodec-cu{cuda}, " in line
    assert line.endswith("or pass --allow-cpu-decode to decode every window on the CPU")
    assert loader_settings("folder").allow_cpu_decode is False
