"""Real JPEGs with what full ImageNet holds and the 250-image sample lacks: every EXIF
orientation (1-8), CMYK, grayscale, a PNG named ``.JPEG``, 56-px and 2,400-px images, 1:3 and
3:1 aspect ratios, each of the odd ones also carrying an orientation tag.

:func:`write_odd_folder` writes them in ImageNet layout (``train/`` and ``val/``, two classes);
the pictures come from the real sample's JPEGs where it is given, else from the stand-in's
generated pictures (:func:`tests.helpers.standin.picture`: gradients in two directions with
shapes, so a window turned by 90 degrees never looks like the stored one, and little noise, so
a re-encoding changes them about as much as a photograph).
"""
from __future__ import annotations

import glob
import io
import os

import numpy as np
from PIL import Image

from tests.helpers.standin import picture

ORIENTATION_TAG = 0x0112  # EXIF (TIFF) tag 274
# name -> (PIL mode, (width, height) or None for the picture's own size, orientation, format)
ODD = {
    "cmyk": ("CMYK", None, 6, "JPEG"),
    "gray": ("L", None, 5, "JPEG"),
    "tall_1x3": ("RGB", (120, 360), 6, "JPEG"),
    "wide_3x1": ("RGB", (360, 120), 8, "JPEG"),
    "png_named_jpeg": ("RGB", None, 6, "PNG"),
    "small_56": ("RGB", (56, 42), 7, "JPEG"),
    "large_2400": ("RGB", (2400, 1800), 6, "JPEG"),
    "progressive": ("RGB", None, 3, "JPEG"),
}


def _pictures(sample: str | None, count: int, seed: int) -> list[Image.Image]:
    """``count`` RGB pictures: the real sample's first JPEGs of sorted name, else generated."""
    paths = sorted(glob.glob(os.path.join(sample, "train", "*", "*.JPEG")))[:count] if sample else []
    if len(paths) == count:
        return [Image.open(p).convert("RGB") for p in paths]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        height, width = int(rng.integers(180, 360)), int(rng.integers(180, 480))
        out.append(picture(rng, width, height))
    return out


def encode(image: Image.Image, fmt: str, orientation: int | None, **options) -> bytes:
    """``image`` encoded as ``fmt`` with an EXIF orientation tag (JPEG: APP1; PNG: eXIf)."""
    if orientation is not None:
        exif = Image.Exif()
        exif[ORIENTATION_TAG] = orientation
        options["exif"] = exif.tobytes()
    buffer = io.BytesIO()
    image.save(buffer, fmt, **({"quality": 90} if fmt == "JPEG" else {}), **options)
    return buffer.getvalue()


def odd_files(sample: str | None = None, seed: int = 0) -> dict[str, bytes]:
    """File name -> encoded bytes: ``orientation_1`` .. ``orientation_8`` (pictures as they
    are, each tagged) and the :data:`ODD` cases, all named ``*.JPEG``."""
    pictures = _pictures(sample, 8 + len(ODD), seed)
    files = {f"orientation_{k}.JPEG": encode(pictures[k - 1], "JPEG", k) for k in range(1, 9)}
    for picture, (name, (mode, size, orientation, fmt)) in zip(pictures[8:], ODD.items()):
        image = picture.resize(size, Image.BILINEAR) if size else picture
        options = {"progressive": True} if name == "progressive" else {}
        files[f"{name}.JPEG"] = encode(image.convert(mode), fmt, orientation, **options)
    return files


def write_odd_folder(root: str, sample: str | None = None) -> dict[str, list[str]]:
    """ImageNet-layout ``root/{train,val}/{n0,n1}/*.JPEG`` with every :func:`odd_files` case in
    both splits (classes alternate; val's pictures from another seed where generated). Returns
    split -> the relative paths written."""
    written = {}
    for split, seed in (("train", 0), ("val", 1)):
        written[split] = []
        for number, (name, data) in enumerate(sorted(odd_files(sample, seed).items())):
            rel = os.path.join(f"n{number % 2}", name)
            os.makedirs(os.path.join(root, split, f"n{number % 2}"), exist_ok=True)
            with open(os.path.join(root, split, rel), "wb") as f:
                f.write(data)
            written[split].append(rel)
    return written


def stored_pixels(data: bytes) -> np.ndarray:
    """The pixels as stored (PIL, no EXIF orientation applied): uint8 ``(H, W, 3)``."""
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))
