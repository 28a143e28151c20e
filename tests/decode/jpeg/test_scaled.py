"""Decoding at the crop's scale (decode/jpeg/scaled.py): where it applies, the pixel difference
to a full decode within the bound docs/ffcv-and-decode.md gives, the same on every run, the same
random windows, and the same refusals as before."""
import glob
import io
import os
import subprocess
import sys

import pytest
import torch
from PIL import Image

from decode import jpeg
from decode import decode, resize, window_size
from loaders.transforms import (TrainTransform, ValTransform,
                                resize_center_crop)
from tests.helpers.paths import REPO

# The documented bound (docs/ffcv-and-decode.md, measured on all 250 sample images at 32-224 px:
# at most 76 levels at a pixel, 6.8 levels mean per output, 1.2-1.8 mean over the sample). The
# stand-in's pictures (a clone without the sample) stay within it too.
MAX_PIXEL, MAX_OUTPUT_MEAN, MAX_SAMPLE_MEAN = 96, 8.0, 2.5


@pytest.fixture(scope="module")
def blobs(sample_images):
    return [open(f, "rb").read()
            for f in sorted(glob.glob(f"{sample_images}/train/*/*.JPEG"))[:80]]


def test_scale_factor_is_the_largest_that_keeps_the_output_covered():
    assert jpeg.scaled.scale_factor(447, 1000, 224, 224) == 1
    assert jpeg.scaled.scale_factor(448, 448, 224, 224) == 2
    assert jpeg.scaled.scale_factor(1600, 2400, 160, 160) == 8
    assert jpeg.scaled.scale_factor(1279, 2400, 160, 160) == 4
    jpeg.scaled.set_enabled(False)
    try:
        assert jpeg.scaled.scale_factor(1600, 2400, 160, 160) == 1
    finally:
        jpeg.scaled.set_enabled(True)


def run_both(transform, blobs, seed=5):
    """The transform's outputs with scaled decoding on, again on, and off (same seeds)."""
    outs = []
    for on in (True, True, False):
        jpeg.scaled.set_enabled(on)
        torch.manual_seed(seed)
        outs.append([transform(b) for b in blobs])
    jpeg.scaled.set_enabled(True)
    return outs


def assert_within_bound(scaled, full):
    diffs = [(a.int() - b.int()).abs() for a, b in zip(scaled, full)]
    changed = [d for d in diffs if d.max() > 1]
    assert changed, "no output was decoded scaled"
    assert max(int(d.max()) for d in diffs) <= MAX_PIXEL
    assert max(float(d.float().mean()) for d in diffs) <= MAX_OUTPUT_MEAN
    assert sum(float(d.float().mean()) for d in changed) / len(changed) <= MAX_SAMPLE_MEAN


@pytest.mark.parametrize("size", [64, 112])
def test_training_crops_within_the_bound_and_the_same_every_run(blobs, size):
    scaled, again, full = run_both(TrainTransform(size), blobs)
    for a, b in zip(scaled, again):
        assert a.shape == (3, size, size) and a.dtype == torch.uint8 and torch.equal(a, b)
    assert_within_bound(scaled, full)


def test_validation_within_the_bound(blobs):
    scaled, again, full = run_both(ValTransform(64, 56), blobs)
    assert all(torch.equal(a, b) and a.shape == (3, 56, 56) for a, b in zip(scaled, again))
    assert_within_bound(scaled, full)
    for data, out in zip(blobs[:10], full):  # off: the full decode, as before
        assert torch.equal(out, resize_center_crop(decode(data), 64, 56))


def test_the_window_is_the_full_decodes_box():
    """A flat-by-blocks image: the scaled window equals the full decode's crop where the
    content has no detail finer than the scale."""
    image = Image.new("RGB", (640, 480), (200, 30, 60))
    image.paste((10, 220, 90), (320, 0, 640, 480))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=95)
    data = out.getvalue()
    box = (16, 40, 16 + 320, 40 + 400)
    scaled = jpeg.scaled.resized_window(data, 2, box, (100, 80))
    reference = resize(decode(data)[:, 16:336, 40:440], (100, 80))
    assert (scaled.int() - reference.int()).abs().max() <= 8


def test_what_it_declines_is_decoded_as_before(blobs):
    """A window reaching into the missing rows of a truncated JPEG is declined. (With
    decode/jpeg/_jpegcrop.so, as with the full-scale window decode, rows below a window are never
    read, so a window above the damage decodes: test_region_decode_reads_down_to_the_window.)"""
    truncated = blobs[0][:len(blobs[0]) // 2]
    height, width = window_size(truncated)
    assert jpeg.scaled.resized_window(truncated, 2, (0, 0, height, width), (32, 32)) is None
    assert jpeg.scaled.resized_window(b"not an image", 2, (0, 0, 9, 9), (4, 4)) is None
    png = io.BytesIO()
    Image.new("RGB", (600, 600)).save(png, "PNG")
    assert jpeg.scaled.resized_window(png.getvalue(), 2, (0, 0, 600, 600), (64, 64)) is None
    with pytest.raises((OSError, RuntimeError)):
        TrainTransform(8)(truncated)  # refused as the full decoders refuse it


def test_grayscale_comes_out_rgb():
    out = io.BytesIO()
    Image.new("L", (800, 600), 77).save(out, "JPEG")
    image = jpeg.scaled.resized_window(out.getvalue(), 4, (0, 0, 600, 800), (48, 64))
    assert image.shape == (3, 48, 64) and int(image.float().mean().round()) == 77


def test_full_decode_switch_turns_it_off():
    code = ("from decode import jpeg; "
            "print(jpeg.scaled.enabled(), jpeg.window.available())")
    env = dict(os.environ, IMAGENET_FAST_FULL_DECODE="1")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                         text=True, check=True).stdout
    assert out.split() == ["False", "False"]  # both partial decoders off under it


def test_damaged_jpegs_declined_exactly_where_the_full_decode_refuses(blobs):
    """So a sample is remembered as bad (loaders/pipelines/bad_samples.py) whichever path its window
    takes: on 140 damaged variants of the sample's JPEGs, the scaled decode declines (and the full
    decode, which then runs, raises) exactly the ones the full decode refuses."""
    from tests.helpers.badcorpus import damaged_variants

    for data in damaged_variants(blobs[:20]):
        shape = window_size(data)
        if shape is None:
            continue
        try:
            decode(data)
            full = True
        except (RuntimeError, OSError):
            full = False
        scaled = jpeg.scaled.resized_window(data, 2, (0, 0, *shape), (shape[0] // 2,
                                                                     shape[1] // 2))
        assert (scaled is not None) == full
