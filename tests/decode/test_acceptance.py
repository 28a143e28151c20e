"""The acceptance rule (``decode.acceptance``): every real photograph and every odd but valid
image is accepted, with the size the decoders give; a decompression bomb, a frame header its
file cannot hold (a one-bit height flip) and their PNG twins are refused from the header; a
premature end that leaves a plausible image is accepted (its warning is the loaders' to name).
The measured margins behind the rule: ``benchmarks/decoders/acceptance.py``."""
import glob
import io
import os
import random
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

import decode
from decode.acceptance import DAMAGED, MAX_PIXELS, TOO_LARGE, Refused, check, limit_pil
from tests.helpers.badcorpus import imagenet_sized_jpeg, refused_images
from tests.helpers.oddities import odd_files
from tools.datagen import make_image


def _save(image, fmt="JPEG", **options) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def _valid_images() -> dict[str, bytes]:
    """Generated images in the encodings that come nearest the bound: flat colour with
    optimised Huffman tables (1-bit codes: exactly at it), quality 1, grayscale, 4:4:4,
    progressive, CMYK, PNG; a 56 px and a 2,400 px image."""
    rng = random.Random(0)
    flat = make_image(2, 10, rng, (333, 257), noise=0, shapes=0)
    noisy = make_image(3, 10, rng, (500, 375), noise=8, shapes=3)
    return {"flat-optimized": _save(flat, optimize=True, quality=90),
            "flat-gray-optimized": _save(flat.convert("L"), optimize=True),
            "flat-q1": _save(flat, quality=1), "flat-444-q1": _save(flat, quality=1,
                                                                   subsampling=0),
            "flat-progressive": _save(flat, progressive=True, optimize=True),
            "flat-cmyk": _save(flat.convert("CMYK")), "flat-png": _save(flat, "PNG"),
            "noisy-q95": _save(noisy, quality=95), "tiny-56": _save(noisy.resize((56, 42))),
            "large-2400": _save(noisy.resize((2400, 1800)), quality=5, optimize=True)}


def test_valid_images_are_accepted_with_the_decoders_size():
    for name, data in {**_valid_images(), **odd_files()}.items():
        frame = check(data)
        assert frame is not None and frame.min_bytes <= frame.available, name
        assert (frame.height, frame.width) == tuple(decode.decode(data).shape[-2:]), name


def test_every_real_photograph_is_accepted_far_from_the_bound(sample):
    """The real sample's files hold at least 8x the bound (median 25x, measured)."""
    ratios = []
    for path in sorted(glob.glob(os.path.join(sample, "train", "*", "*.JPEG"))):
        data = open(path, "rb").read()
        frame = check(data)
        with Image.open(path) as image:
            assert (frame.width, frame.height) == image.size, path
        ratios.append(frame.available / frame.min_bytes)
    assert len(ratios) == 250 and min(ratios) > 4, min(ratios)


def test_a_bomb_and_a_flipped_height_are_refused_and_a_premature_end_is_not():
    for name, (original, damaged, reason) in refused_images().items():
        assert check(original).pixels == 500 * 375
        if reason is None:
            assert check(damaged).height == 415  # plausible: decoded, its warning named
            continue
        with pytest.raises(Refused, match=reason):
            check(damaged)
    bomb = refused_images()["bomb"][1]
    with pytest.raises(Refused, match=TOO_LARGE) as info:
        check(bomb)
    assert info.value.rule == "pixel limit" and f"{MAX_PIXELS:,}" in str(info.value)
    with pytest.raises(Refused, match=DAMAGED) as info:  # no pixel limit: still no room
        check(bomb, max_pixels=0)
    assert info.value.rule == "frame fits the file"


def test_the_limit_is_inclusive_and_zero_lifts_it():
    data = imagenet_sized_jpeg()
    assert check(data, max_pixels=500 * 375).pixels == 500 * 375
    with pytest.raises(Refused, match="500x375 = 187,500 pixels, over the 187,499"):
        check(data, max_pixels=500 * 375 - 1)
    assert check(data, max_pixels=0) is not None


def _png_sized(data: bytes, width: int, height: int) -> bytes:
    """A PNG with its IHDR's size edited and its CRC fixed (a well-formed header that lies)."""
    body = bytearray(data)
    struct.pack_into(">II", body, 16, width, height)
    struct.pack_into(">I", body, 29, zlib.crc32(bytes(body[12:29])))
    return bytes(body)


def test_png_bombs_and_lying_png_headers_are_refused():
    png = _save(Image.fromarray(np.full((64, 64, 3), 90, np.uint8)), "PNG")
    assert check(png).pixels == 64 * 64
    with pytest.raises(Refused, match=TOO_LARGE):
        check(_png_sized(png, 100_000, 100_000))
    with pytest.raises(Refused, match=DAMAGED):  # 100 M pixels in a few hundred bytes
        check(_png_sized(png, 10_000, 10_000))


def test_a_png_chunk_declaring_more_than_the_file_holds_is_refused():
    """A flipped length bit makes a 160 KB PNG's IDAT claim 512 MiB, which some decoders allocate
    before reading; a PNG truncated inside a chunk reads the same."""
    png = _save(Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), np.uint8)),
                "PNG")
    idat = png.index(b"IDAT") - 4
    lying = bytearray(png)
    lying[idat] ^= 0x20  # the length's top byte: +512 MiB
    with pytest.raises(Refused, match=DAMAGED + r".*needs at least 536,8"):
        check(bytes(lying))
    with pytest.raises(Refused, match=DAMAGED):
        check(png[:len(png) // 2])
    assert check(png[:-12]).pixels == 64 * 64  # only IEND missing: every chunk whole


def test_other_formats_get_the_pixel_limit_from_their_header():
    gif = _save(Image.new("P", (40, 30)), "GIF")
    assert (check(gif).height, check(gif).width) == (30, 40)
    big = bytearray(gif)
    struct.pack_into("<HH", big, 6, 60000, 60000)  # the logical screen
    struct.pack_into("<HH", big, big.index(b",") + 5, 60000, 60000)  # the image descriptor
    with pytest.raises(Refused, match=TOO_LARGE):
        check(bytes(big))
    assert check(b"not an image") is None and check(b"") is None


def test_raw_records_are_sized_from_their_header():
    raw = decode.raw.encode_raw(decode.decode(imagenet_sized_jpeg()))
    assert check(raw).pixels == 500 * 375
    with pytest.raises(Refused, match=TOO_LARGE):
        check(raw, max_pixels=1000)


def test_limit_pil_makes_pil_agree():
    before = Image.MAX_IMAGE_PIXELS
    try:
        limit_pil(0)
        assert Image.MAX_IMAGE_PIXELS is None
        limit_pil(MAX_PIXELS)
        assert Image.MAX_IMAGE_PIXELS == MAX_PIXELS
    finally:
        Image.MAX_IMAGE_PIXELS = before
