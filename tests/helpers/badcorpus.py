"""A small image folder with every kind of awkward input ``folder2lmdb.py`` must handle.

:func:`make_bad_corpus` writes it and returns what a conversion must produce: the kept files
(relative path -> label) in record order, which of them are re-encoded, and the skipped files
with a fragment of their reason. :func:`refused_images` are the files the acceptance rule
(``decode.acceptance``) refuses from their header, made from an ImageNet-sized JPEG: a
65,000 x 65,000 decompression bomb and a one-bit height flip, and one it keeps although its
data ends early (a plausible premature end): in the corpus, and for every loader's tests.
"""
from __future__ import annotations

import io
import os
import random
from dataclasses import dataclass, field

import numpy as np
from PIL import Image


# A 1x1 lossless WebP: Pillow-SIMD is often built without a WebP encoder.
WEBP_1X1 = bytes.fromhex("524946461a000000574542505650384c0d0000002f00000010071011118888fe0700")


@dataclass
class Corpus:
    root: str
    classes: list[str]
    kept: dict[str, int] = field(default_factory=dict)       # rel path -> label, in order
    reencoded: set[str] = field(default_factory=set)
    skipped: dict[str, str] = field(default_factory=dict)    # rel path -> reason fragment


def _pixels(rng: random.Random, width: int, height: int, channels: int = 3) -> np.ndarray:
    nprng = np.random.default_rng(rng.getrandbits(32))
    shape = (height, width, channels) if channels > 1 else (height, width)
    return nprng.integers(0, 256, size=shape, dtype=np.uint8)


def _jpeg(image: Image.Image, **kwargs) -> bytes:
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90, **kwargs)
    return out.getvalue()


def _encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **kwargs)
    return out.getvalue()


def imagenet_sized_jpeg(seed: int = 0) -> bytes:
    """A 500 x 375 baseline JPEG of a generated image with noise and shapes, about 33 KB:
    the size and bytes per pixel of an ImageNet photograph (the real sample's median is
    500 x 375)."""
    from tools.datagen import make_image

    image = make_image(1, 4, random.Random(seed), (500, 375), noise=8, shapes=3)
    return _jpeg(image)


def _sof(data: bytes) -> int:
    """Offset of the first frame header's height field."""
    return data.index(b"\xff\xc0") + 5


def refused_images(seed: int = 0) -> dict[str, tuple[bytes, bytes, str]]:
    """``{name: (original, damaged, reason fragment)}``: ImageNet-sized JPEGs
    (:func:`imagenet_sized_jpeg`, a seed each) with their frame header edited, each its
    original's length:
    ``bomb`` claims 65,000 x 65,000 pixels (refused: "too large to decode safely"),
    ``flipped_height`` has the height's high bit flipped, 375 -> 33,143 rows (refused:
    "damaged header"), ``premature_end`` claims 40 rows more than its data holds (kept:
    libjpeg's "premature end of data segment", named as a warning); the reason fragment is
    None for a kept one."""
    out = {}
    for k, (name, reason) in enumerate((("bomb", "too large to decode safely"),
                                        ("flipped_height", "damaged header"),
                                        ("premature_end", None))):
        original = imagenet_sized_jpeg(3 * seed + k)  # each its own: told apart by its bytes
        at, damaged = _sof(original), bytearray(original)
        if name == "bomb":
            damaged[at:at + 4] = (65000).to_bytes(2, "big") * 2
        elif name == "flipped_height":
            damaged[at] ^= 0x80
        else:
            damaged[at:at + 2] = (375 + 40).to_bytes(2, "big")
        out[name] = (original, bytes(damaged), reason)
    return out


def make_bad_corpus(root: str, seed: int = 0, size: int = 48, extra_per_class: int = 0) -> Corpus:
    """Write the corpus under ``root``; ``extra_per_class`` plain JPEGs (``size`` pixels)
    per non-empty class make it slower to convert (for interruption tests)."""
    rng = random.Random(seed)
    rgb = Image.fromarray(_pixels(rng, size, size), "RGB")
    classes = ["n01", "n02 empty", "n03"]
    corpus = Corpus(root, classes)
    files: dict[str, tuple[int, bytes, str | None, str | None]] = {}  # rel -> label, data, re, skip

    def add(rel, label, data, reencoded=False, skip=None):
        files[rel] = (label, data, reencoded, skip)

    a = "n01"
    add(f"{a}/baseline.JPEG", 0, _jpeg(rgb))
    add(f"{a}/gray.JPEG", 0, _jpeg(Image.fromarray(_pixels(rng, size, size, 1), "L")))
    add(f"{a}/progressive.JPEG", 0, _jpeg(rgb, progressive=True), True)
    add(f"{a}/cmyk.JPEG", 0, _jpeg(rgb.convert("CMYK")), True)
    add(f"{a}/png_inside.JPEG", 0, _encode(rgb, "PNG"), True)
    add(f"{a}/gif_inside.JPEG", 0, _encode(rgb.convert("P"), "GIF"), True)
    add(f"{a}/webp_inside.JPEG", 0, WEBP_1X1, True)
    rgba = Image.fromarray(_pixels(rng, size, size, 4), "RGBA")
    add(f"{a}/rgba.png", 0, _encode(rgba, "PNG"), True)
    palette = rgb.convert("P")
    add(f"{a}/palette_transparent.gif", 0, _encode(palette, "GIF", transparency=0), True)
    add(f"{a}/png16.png", 0, _encode(Image.fromarray(  # a 2-D uint16 array is mode I;16
        _pixels(rng, size, size, 1).astype(np.uint16) * 257), "PNG"), True)
    add(f"{a}/one_pixel.JPEG", 0, _jpeg(Image.new("RGB", (1, 1), (200, 10, 10))))
    add(f"{a}/tall_1x2000.JPEG", 0, _jpeg(Image.fromarray(_pixels(rng, 1, 2000), "RGB")))
    add(f"{a}/wide_2000x1.png", 0, _encode(Image.fromarray(_pixels(rng, 2000, 1), "RGB"), "PNG"),
        True)
    add(f"{a}/name with spaces.JPEG", 0, _jpeg(rgb))
    add(f"{a}/quotes 'single' \"double\".JPEG", 0, _jpeg(rgb))
    add(f"{a}/ünïcødé-名前.JPEG", 0, _jpeg(rgb))
    add(f"{a}/sub/nested.JPEG", 0, _jpeg(rgb))
    full = _jpeg(rgb)
    add(f"{a}/zero_bytes.JPEG", 0, b"", skip="empty file")
    add(f"{a}/truncated.JPEG", 0, full[:len(full) * 2 // 3], skip="truncated")
    add(f"{a}/truncated_progressive.JPEG", 0,
        _jpeg(rgb, progressive=True)[:len(full) // 2], skip="truncated")
    add(f"{a}/text.JPEG", 0, b"just some text\n" * 20,
        skip="not an image: starts with 6A 75 73 74, text")
    add(f"{a}/error_page.JPEG", 0, b"<!DOCTYPE html><html><body>404 Not Found</body></html>\n",
        skip="not an image: starts with 3C 21 44 4F, an HTML page")
    add(f"{a}/random.JPEG", 0, bytes(rng.getrandbits(8) for _ in range(3000)),
        skip="not an image: starts with")
    for name, (_, damaged, reason) in refused_images(seed).items():
        add(f"{a}/{name}.JPEG", 0, damaged, skip=reason)
    add("n03/a.JPEG", 2, _jpeg(rgb))
    add("n03/b_rgb_coded.JPEG", 2, _jpeg(rgb, keep_rgb=True), True)
    for i in range(extra_per_class):
        for cls, label in (("n01", 0), ("n03", 2)):
            img = Image.fromarray(_pixels(rng, size, size), "RGB")
            add(f"{cls}/extra_{i:04d}.JPEG", label, _jpeg(img))
    _write(root, files, full)
    return _listed(corpus, files)


def _write(root: str, files: dict, full: bytes) -> None:
    """The files of the corpus, an empty class and the entries the converter must ignore."""
    for rel, (_, data, _, _) in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    os.makedirs(os.path.join(root, "n02 empty"), exist_ok=True)
    # Ignored: hidden files and folders, files outside class folders.
    for rel in ("n01/.DS_Store", "n03/._a.JPEG", ".hidden_class/x.JPEG", "n01/.cache/y.JPEG",
                "stray.JPEG", "n03/.hidden.JPEG"):
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(full)


def _listed(corpus: Corpus, files: dict) -> Corpus:
    """``corpus`` with what the converter keeps, re-encodes and skips, in ImageFolder's record
    order (class, then directories sorted, then names sorted)."""
    for rel in sorted(files, key=os.path.split):
        label, _, reencoded, skip = files[rel]
        if skip:
            corpus.skipped[rel] = skip
        else:
            corpus.kept[rel] = label
            if reencoded:
                corpus.reencoded.add(rel)
    return corpus


def damaged_variants(blobs: list[bytes], seed: int = 0) -> list[bytes]:
    """Damaged copies of each JPEG: two cuts, byte flips in the headers and in the entropy-coded
    data, a zeroed run and a marker inserted into the entropy-coded data."""
    import random

    rng, out = random.Random(seed), []
    for good in blobs:
        sos = good.index(b"\xff\xda")

        def flipped(count, low, high):
            data = bytearray(good)
            for _ in range(count):
                data[rng.randrange(low, high)] = rng.randrange(256)
            return bytes(data)

        at = rng.randrange(sos + 20, len(good) - 400)
        out += [good[:rng.randrange(sos + 20, len(good))], good[:len(good) - rng.randrange(1, 64)],
                flipped(2, 2, sos + 20), flipped(1, sos + 20, len(good) - 2),
                flipped(16, sos + 20, len(good) - 2), good[:at] + bytes(300) + good[at + 300:],
                good[:at] + bytes([0xFF, rng.choice([0xC0, 0xC4, 0xDA, 0xE1, 0xD9])]) + good[at:]]
    return out
