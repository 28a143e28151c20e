"""Crop-window JPEG decoding (nvImageCodec, decode/jpeg/window.py) against full decoding."""
import glob
import io
import random

import pytest
import torch
from PIL import Image

from decode import libraries
from decode import jpeg
from decode import decode, window_size
from loaders.transforms import TrainTransform
from tests.helpers.loading import max_abs_diff

pytestmark = [pytest.mark.skipif(
    not jpeg.window.available(),
    reason=f"{jpeg.window.status()}: pip install nvidia-nvimgcodec-cu13 (requirements.txt)"),
    pytest.mark.usefixtures("one_torch_thread")]


def windows(data, count, rng):
    height, width = window_size(data)
    for _ in range(count):
        h, w = rng.randint(1, height), rng.randint(1, width)
        yield rng.randint(0, height - h), rng.randint(0, width - w), h, w


def check_matches_full_decode(blobs, rng, per_image=3):
    """Each window equals the crop of a whole decode within 1 intensity level (libjpeg-turbo
    builds may round the IDCT differently; the former C code differed by up to 64 at the
    window's edges, from chroma upsampling there)."""
    for data in blobs:
        full = decode(data)
        for top, left, h, w in windows(data, per_image, rng):
            window = jpeg.window.decode_window(data, top, left, h, w)
            assert window.shape == (3, h, w) and window.dtype == torch.uint8
            assert max_abs_diff(window, full[:, top:top + h, left:left + w]) <= 1


@pytest.mark.parametrize("whole", [b for b in libraries.backends() if b != "PIL"])
def test_windows_of_real_imagenet_jpegs_match_full_decode(sample, whole):
    blobs = [open(f, "rb").read() for f in sorted(glob.glob(f"{sample}/train/*/*.JPEG"))]
    assert len(blobs) == 250  # 4 of them grayscale: decoded to 3 channels
    previous = libraries.use(whole)  # the whole-image decoder it is compared with
    try:
        check_matches_full_decode(blobs, random.Random(0))
    finally:
        libraries.use(previous)


def test_windows_of_odd_sizes_and_subsampling(tmp_path):
    rng = random.Random(1)
    blobs = []
    for (w, h), subsampling, mode, progressive in [
            ((1, 1), 0, "RGB", False), ((7, 300), 2, "RGB", False), ((513, 17), 1, "RGB", False),
            ((64, 48), 2, "L", False), ((200, 150), 2, "RGB", True)]:
        image = Image.effect_noise((w, h), 64).convert(mode)
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=90, subsampling=subsampling if mode == "RGB" else -1,
                   progressive=progressive)
        blobs.append(buffer.getvalue())
    check_matches_full_decode(blobs, rng, per_image=5)


def test_what_it_declines_falls_back_to_full_decoding():
    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    cmyk = io.BytesIO()
    Image.new("CMYK", (8, 8), (1, 2, 3, 4)).save(cmyk, "JPEG")
    assert window_size(png.getvalue()) is None
    assert window_size(cmyk.getvalue()) is None  # 4 components
    good = io.BytesIO()
    Image.effect_noise((64, 64), 64).convert("RGB").save(good, "JPEG")
    truncated = good.getvalue()[:len(good.getvalue()) // 2]
    assert window_size(truncated) == (64, 64)
    assert jpeg.window.decode_window(truncated, 0, 0, 64, 64) is None  # corrupt data: decline
    with pytest.raises(OSError):
        TrainTransform(32)(truncated)  # ... and the full decoders (libjpeg-turbo, PIL) refuse it


def test_train_transform_draws_the_same_crop_either_way(sample_images):
    blobs = [open(f, "rb").read()
             for f in sorted(glob.glob(f"{sample_images}/train/*/*.JPEG"))[:40]]
    transform = TrainTransform(64)
    jpeg.scaled.set_enabled(False)  # windows vs whole images here; scaled: test_scaled.py
    try:
        torch.manual_seed(3)
        windowed = [transform(b) for b in blobs]
        jpeg.window.set_enabled(False)
        torch.manual_seed(3)
        whole = [transform(b) for b in blobs]
    finally:
        jpeg.window.set_enabled(True)
        jpeg.scaled.set_enabled(True)
    for a, b in zip(windowed, whole):
        assert a.shape == b.shape == (3, 64, 64)
        assert max_abs_diff(a, b) <= 1


def test_windows_decode_in_forked_workers(sample_images):
    """DataLoader workers fork after the parent decoded windows: each makes its own Decoder."""
    blobs = [open(f, "rb").read()
             for f in sorted(glob.glob(f"{sample_images}/train/*/*.JPEG"))[:8]]
    jpeg.window.decode_window(blobs[0], 0, 0, 16, 16)  # the parent's Decoder exists
    loader = torch.utils.data.DataLoader(blobs, batch_size=4, num_workers=2,
                                         multiprocessing_context="fork",
                                         collate_fn=lambda items: [
                                             tuple(jpeg.window.decode_window(b, 1, 2, 30, 40).shape)
                                             for b in items])
    assert [shape for batch in loader for shape in batch] == [(3, 30, 40)] * 8
