"""Crop-window JPEG decoding (loaders/_jpegcrop.c) against full decoding."""
import glob
import io
import os
import random

import pytest
import torch
from PIL import Image

from loaders import _jpeg_window as jpeg_window
from loaders._transforms import TrainTransform, decode

pytestmark = pytest.mark.skipif(not jpeg_window.available(),
                                reason="loaders/_jpegcrop.so not built (make install builds it)")


def windows(data, count, rng):
    height, width = jpeg_window.jpeg_size(data)
    for _ in range(count):
        h, w = rng.randint(1, height), rng.randint(1, width)
        yield rng.randint(0, height - h), rng.randint(0, width - w), h, w


def check_matches_full_decode(blobs, rng, per_image=3):
    worst = 0.0
    for data in blobs:
        full = decode(data).int()
        for top, left, h, w in windows(data, per_image, rng):
            window = jpeg_window.decode_window(data, top, left, h, w)
            assert window.shape == (3, h, w) and window.dtype == torch.uint8
            diff = (window.int() - full[:, top:top + h, left:left + w]).abs()
            # Only chroma upsampling at the window's edges may differ from a full decode.
            worst = max(worst, diff.float().mean().item())
            assert diff.max().item() <= 64
    assert worst < 1.0


def test_windows_of_real_imagenet_jpegs_match_full_decode(sample):
    blobs = [open(f, "rb").read() for f in sorted(glob.glob(f"{sample}/train/*/*.JPEG"))]
    assert len(blobs) == 250  # 4 of them grayscale: decoded to 3 channels
    check_matches_full_decode(blobs, random.Random(0))


def test_windows_of_odd_sizes_and_subsampling(tmp_path):
    rng = random.Random(1)
    blobs = []
    for (w, h), subsampling, mode in [((1, 1), 0, "RGB"), ((7, 300), 2, "RGB"), ((513, 17), 1, "RGB"),
                                      ((64, 48), 2, "L")]:
        image = Image.effect_noise((w, h), 64).convert(mode)
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=90, subsampling=subsampling if mode == "RGB" else -1)
        blobs.append(buffer.getvalue())
    check_matches_full_decode(blobs, rng, per_image=5)


def test_what_it_declines_falls_back_to_full_decoding():
    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    cmyk = io.BytesIO()
    Image.new("CMYK", (8, 8), (1, 2, 3, 4)).save(cmyk, "JPEG")
    assert jpeg_window.jpeg_size(png.getvalue()) is None
    assert jpeg_window.jpeg_size(cmyk.getvalue()) is None  # 4 components
    good = io.BytesIO()
    Image.effect_noise((64, 64), 64).convert("RGB").save(good, "JPEG")
    truncated = good.getvalue()[:len(good.getvalue()) // 2]
    assert jpeg_window.jpeg_size(truncated) == (64, 64)
    assert jpeg_window.decode_window(truncated, 0, 0, 64, 64) is None  # corrupt data: decline
    with pytest.raises(OSError):
        TrainTransform(32)(truncated)  # ... and the full decoders (libjpeg-turbo, PIL) refuse it


def test_train_transform_draws_the_same_crop_either_way(sample):
    blobs = [open(f, "rb").read() for f in sorted(glob.glob(f"{sample}/train/*/*.JPEG"))[:40]]
    transform = TrainTransform(64)
    torch.manual_seed(3)
    windowed = [transform(b) for b in blobs]
    jpeg_window.set_enabled(False)
    try:
        torch.manual_seed(3)
        whole = [transform(b) for b in blobs]
    finally:
        jpeg_window.set_enabled(True)
    for a, b in zip(windowed, whole):
        assert a.shape == b.shape == (3, 64, 64)
        assert (a.int() - b.int()).abs().float().mean().item() < 1.0


def test_a_stale_build_is_not_called(monkeypatch):
    """A _jpegcrop.so built from an older _jpegcrop.c (other ABI) means whole-image decoding."""
    monkeypatch.setattr(jpeg_window, "_ABI_VERSION", jpeg_window._ABI_VERSION + 1)
    jpeg_window.set_enabled(True)
    try:
        assert not jpeg_window.available()
    finally:
        monkeypatch.undo()
        jpeg_window.set_enabled(True)
    assert jpeg_window.available()
