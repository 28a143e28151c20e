"""Raw-pixel records (decode/raw.py): a binary PPM/PGM that decode.decode, decode_window,
window_size and image_size read without a decode, giving exactly the pixels (and windows) of the
JPEG they were made from; malformed ones are not read as pixels."""
import glob
import io

import numpy as np
import pytest
import torch
from PIL import Image

import decode
from decode import raw
from loaders.transforms import TrainTransform, ValTransform, resize_center_crop


def _jpeg(pixels: np.ndarray, mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels, mode).save(out, format="JPEG", quality=90)
    return out.getvalue()


@pytest.fixture(scope="module")
def colour_jpeg():
    rng = np.random.default_rng(0)
    return _jpeg(rng.integers(0, 256, (75, 120, 3), dtype=np.uint8))


def test_a_raw_record_is_a_ppm_holding_the_jpegs_decoded_pixels(colour_jpeg):
    image = decode.decode(colour_jpeg)
    record = raw.encode_raw(image)
    assert record.startswith(b"P6\n120 75\n255\n") and len(record) == raw.raw_bytes(75, 120)
    assert raw.raw_header(record) == (75, 120, 3, len(b"P6\n120 75\n255\n"))
    assert torch.equal(decode.decode(record), image)
    # a standard format: PIL reads the same pixels
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(record))),
                          image.permute(1, 2, 0).numpy())
    assert decode.image_size(record) == decode.window_size(record) == (75, 120)
    assert decode.jpeg.region.jpeg_size(record) is None  # not a JPEG: nothing JPEG-only is asked of it


def test_a_window_is_cut_from_the_pixels_as_from_the_whole_decode(colour_jpeg):
    image = decode.decode(colour_jpeg)
    record = raw.encode_raw(image)
    for window, size in (((3, 7, 40, 50), (32, 32)), ((0, 0, 75, 120), (64, 48))):
        top, left, h, w = window
        expected = decode.resize(image[:, top:top + h, left:left + w], size)
        assert torch.equal(decode.decode_window(record, window, size), expected)


def test_grayscale_is_stored_as_pgm_and_read_as_rgb():
    gray = _jpeg(np.random.default_rng(1).integers(0, 256, (40, 30), dtype=np.uint8), "L")
    image = decode.decode(gray)
    record = raw.encode_raw(image, gray=True)
    assert record.startswith(b"P5\n30 40\n255\n") and len(record) == raw.raw_bytes(40, 30, 1)
    assert torch.equal(decode.decode(record), image)
    assert torch.equal(decode.decode_window(record, (5, 5, 20, 20), (16, 16)),
                       decode.resize(image[:, 5:25, 5:25], (16, 16)))


def test_malformed_records_are_not_read_as_pixels(colour_jpeg):
    record = raw.encode_raw(decode.decode(colour_jpeg))
    for bad in (record[:-1], record + b"\0", b"P6\n120 75\n65535\n" + record[15:],
                b"P6\n0 75\n255\n", b"P7\n1 1\n255\n\0\0\0"):
        assert raw.raw_header(bad) is None
    with pytest.raises(ValueError):
        raw.raw_crop(record[:-1])
    with pytest.raises((OSError, RuntimeError)):  # what the loaders take for a bad sample
        decode.decode(record[:100])  # truncated: PIL refuses it too
    with pytest.raises(ValueError):
        raw.encode_raw(torch.zeros(1, 4, 4, dtype=torch.uint8))


def test_the_loaders_transforms_give_the_same_crops_from_either_kind(sample_images,
                                                                    one_torch_thread):
    """On the sample's JPEGs: the training crop of a raw record equals the JPEG's wherever the
    JPEG path decodes the window at full scale (windows under twice the output), and validation
    equals the whole-decode path."""
    for path in sorted(glob.glob(f"{sample_images}/train/*/*.JPEG"))[:12]:
        data = open(path, "rb").read()
        record = raw.encode_raw(decode.decode(data))
        train = TrainTransform(400)  # windows under 2x the output: no DCT scaling
        torch.manual_seed(3)
        from_jpeg = train(data)
        torch.manual_seed(3)
        assert torch.equal(train(record), from_jpeg), path
        val = ValTransform(256, 224)
        assert torch.equal(val(record), resize_center_crop(decode.decode(data), 256, 224))
