"""Our crop + scale decode (decode/jpeg/_jpegcrop.c through decode/jpeg/region.py): every region at
every scale equals the whole image decoded at that scale, damaged data is declined, the
transforms give the pixels they gave without it, and an install without it says so."""
import glob
import io
import random

import numpy as np
import pytest
import torch
from PIL import Image

import decode as decoding
from decode import jpeg
from decode import decode
from loaders.transforms import TrainTransform, ValTransform
from tests.helpers.badcorpus import damaged_variants

pytestmark = [pytest.mark.skipif(not jpeg.region.available(),
                                 reason=f"{jpeg.region.status()}: needs cc and libjpeg-dev"),
              pytest.mark.usefixtures("one_torch_thread")]


def to_jpeg(image: Image.Image, **kwargs) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", **kwargs)
    return out.getvalue()


def generated() -> list[bytes]:
    """Noise JPEGs of odd sizes: 4:4:4, 4:2:2, 4:2:0, progressive, grayscale."""
    blobs = []
    for subsampling in (0, 1, 2):
        for progressive in (False, True):
            for size in ((1, 1), (7, 300), (513, 17), (200, 150), (640, 480)):
                image = Image.effect_noise(size, 64).convert("RGB")
                blobs.append(to_jpeg(image, quality=90, subsampling=subsampling,
                                  progressive=progressive))
    blobs.append(to_jpeg(Image.effect_noise((301, 203), 64).convert("L")))
    return blobs


def whole_at_scale(data: bytes, denom: int) -> np.ndarray | None:
    """The whole image at 1/denom: PIL's ``draft`` (libjpeg's scale_denom), RGB; None where
    ``draft`` picks another scale (a side under ``denom`` pixels)."""
    image = Image.open(io.BytesIO(data))
    height, width = jpeg.region.jpeg_size(data)
    if denom > 1:
        image.draft(None, (max(1, width // denom), max(1, height // denom)))
    if image.size != (-(-width // denom), -(-height // denom)):
        return None
    return np.asarray(image.convert("RGB"))


def check_regions(blobs, rng, per_scale=4):
    """Random regions of each of ``blobs`` (at least one) at every scale PIL's draft gives
    exactly, every blob at least at 1/1."""
    assert blobs
    for data in blobs:
        for denom in (1, 2, 4, 8):
            whole = whole_at_scale(data, denom)
            if whole is None:
                assert denom > 1, "the whole image at 1/1 must always be compared"
                continue
            rows, cols = whole.shape[:2]
            for _ in range(per_scale):
                h, w = rng.randint(1, rows), rng.randint(1, cols)
                top, left = rng.randint(0, rows - h), rng.randint(0, cols - w)
                region = jpeg.region.decode_region(data, denom, top, left, h, w)
                assert region.shape == (h, w, 3) and region.dtype == np.uint8
                assert np.array_equal(region, whole[top:top + h, left:left + w]), (denom, top,
                                                                                   left, h, w)


def test_regions_equal_the_whole_image_at_each_scale():
    """Exact: the C decodes a margin around the region so chroma upsampling has neighbours
    (without it, up to 35 levels at the region's edges)."""
    check_regions(generated(), random.Random(0))


def test_regions_of_real_imagenet_jpegs(sample):
    blobs = [open(f, "rb").read() for f in sorted(glob.glob(f"{sample}/train/*/*.JPEG"))]
    check_regions(blobs, random.Random(1), per_scale=2)
    for data in blobs[:20]:  # at 1/1 also the loaders' own whole decode (TorchCodec)
        assert torch.equal(torch.from_numpy(jpeg.region.decode_region(data, 1, 0, 0,
                                                                    *jpeg.region.jpeg_size(data))),
                           decode(data).permute(1, 2, 0))


def test_what_it_declines():
    good = to_jpeg(Image.effect_noise((64, 48), 64).convert("RGB"))
    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    cmyk = to_jpeg(Image.new("CMYK", (8, 8), (1, 2, 3, 4)))
    assert jpeg.region.jpeg_size(good) == (48, 64)
    for data in (png.getvalue(), cmyk, b"not an image", good[:2]):
        assert jpeg.region.jpeg_size(data) is None
    assert jpeg.region.decode_region(png.getvalue(), 1, 0, 0, 8, 8) is None
    assert jpeg.region.decode_region(good, 3, 0, 0, 8, 8) is None  # not a libjpeg-turbo scale
    assert jpeg.region.decode_region(good, 2, 0, 0, 25, 32) is None  # outside the 24 x 32 image
    assert jpeg.region.decode_region(good, 1, 40, 60, 9, 5) is None
    assert jpeg.region.decode_region(good, 1, 0, 0, 0, 5) is None


def test_region_decode_reads_down_to_the_window():
    """Rows below the region are never decoded (that is the saving): a region above a
    truncation decodes, one reaching into it is declined (libjpeg's warning is an error)."""
    data = to_jpeg(Image.effect_noise((256, 256), 64).convert("RGB"), quality=95)
    truncated = data[:len(data) // 2]
    top = jpeg.region.decode_region(truncated, 1, 0, 0, 32, 256)
    assert np.array_equal(top, jpeg.region.decode_region(data, 1, 0, 0, 32, 256))
    assert jpeg.region.decode_region(truncated, 1, 0, 0, 256, 256) is None
    assert jpeg.region.decode_region(truncated, 2, 100, 0, 28, 128) is None


def test_damaged_jpegs_never_decode_where_the_full_decode_refuses(sample_images):
    """Any libjpeg warning declines, so on 140 damaged variants of the sample's JPEGs the
    whole-image region decodes only where the loaders' full decode does, with the same pixels;
    the undamaged ones and some damaged ones (a variant libjpeg reads without a warning) do."""
    blobs = [open(f, "rb").read()
             for f in sorted(glob.glob(f"{sample_images}/train/*/*.JPEG"))[:20]]
    for data in blobs:
        assert jpeg.region.decode_region(data, 1, 0, 0, *jpeg.region.jpeg_size(data)) is not None
    declined = decoded = 0
    for data in damaged_variants(blobs):
        shape = jpeg.region.jpeg_size(data)
        region = None if shape is None else jpeg.region.decode_region(data, 1, 0, 0, *shape)
        try:
            full = decode(data)
        except (RuntimeError, OSError):
            full = None
        if region is None:
            declined += 1
            continue
        assert full is not None
        assert torch.equal(torch.from_numpy(region), full.permute(1, 2, 0))
        decoded += 1
    assert declined > 0 and decoded > 0


def outputs(transform, blobs, crop: bool, seed=3):
    jpeg.region.set_enabled(crop)
    try:
        torch.manual_seed(seed)
        return [transform(b) for b in blobs]
    finally:
        jpeg.region.set_enabled(True)


@pytest.mark.parametrize("size", [64, 160])
def test_transforms_give_the_pixels_they_gave_without_it(sample_images, size):
    """Training crops: exactly those of PIL's draft; validation within 2 levels (PIL's
    fractional box is shifted by the region's offset, and at 1/1 PIL resamples the square
    where torch resized the whole image: 2 levels at most, mean under 0.003 on the sample)."""
    blobs = [open(f, "rb").read()
             for f in sorted(glob.glob(f"{sample_images}/train/*/*.JPEG"))[:80]]
    blobs += generated()[-6:]
    for new, old in zip(outputs(TrainTransform(size), blobs, True),
                        outputs(TrainTransform(size), blobs, False)):
        assert torch.equal(new, old)
    for new, old in zip(outputs(ValTransform(size + 32, size), blobs, True),
                        outputs(ValTransform(size + 32, size), blobs, False)):
        assert (new.int() - old.int()).abs().max() <= 2


def test_scaled_windows_are_cropped_regions(sample_images, monkeypatch):
    """The scaled path decodes a region, not the whole image, where the C is built."""
    calls = []
    real = jpeg.region.decode_region
    monkeypatch.setattr(jpeg.region, "decode_region", lambda *a: calls.append(a) or real(*a))
    data = open(sorted(glob.glob(f"{sample_images}/train/*/*.JPEG"))[0], "rb").read()
    height, width = jpeg.region.jpeg_size(data)
    out = jpeg.scaled.resized_window(data, 2, (10, 20, 10 + height // 2, 20 + width // 2),
                                     (40, 40))
    assert out.shape == (3, 40, 40)
    (_, denom, top, left, h, w), = calls
    assert denom == 2 and h < -(-height // 2) and w < -(-width // 2)


def test_not_built_is_one_status_line(monkeypatch):
    monkeypatch.setattr(jpeg.region, "_LIBRARY", "/nonexistent/_jpegcrop.so")
    jpeg.region.set_enabled(True)
    try:
        assert not jpeg.region.available()
        assert jpeg.region.status() == ("crop + scale: off (decode/jpeg/_jpegcrop.so not built "
                                      "(make install builds it))")
        assert jpeg.region.decode_region(b"\xff\xd8\xff", 1, 0, 0, 1, 1) is None
        if jpeg.window.available():  # the scaled windows then go through PIL's draft
            assert decoding.crop_decoder_status().endswith(
                "(PIL draft; crop + scale: off (decode/jpeg/_jpegcrop.so not built (make install "
                "builds it)))")
    finally:
        monkeypatch.undo()
        jpeg.region.set_enabled(True)


def test_a_read_frame_is_never_read_again(monkeypatch):
    """Given the acceptance rule's frame, the cascade reads no header again: a 1- or
    3-component JPEG's, nor a CMYK JPEG's (which the C declines), at any scale."""
    from decode.acceptance import check

    cmyk = to_jpeg(Image.effect_noise((320, 240), 64).convert("CMYK"))
    blobs = [to_jpeg(Image.effect_noise((320, 240), 64).convert("RGB")), cmyk]
    frames = [check(data) for data in blobs]

    def read_again(data):
        raise AssertionError("a header read twice")

    monkeypatch.setattr(jpeg.region, "read_frame", read_again)
    monkeypatch.setattr(decoding, "read_frame", read_again)
    for data, frame in zip(blobs, frames):
        for window, size in (((0, 0, 240, 320), (60, 80)), ((8, 8, 100, 100), (90, 90))):
            kind, pixels = decoding.decode_crop(data, window, size, frame=frame)
            assert pixels.shape[0] == 3 and kind in ("scaled", "window", "whole")
    assert decoding.decode_crop(blobs[0], (0, 0, 240, 320), (60, 80), frame=frames[0])[0] \
        == "scaled"
