"""Decode a JPEG window at libjpeg-turbo's DCT scale 1/2, 1/4 or 1/8 where the window is at least
twice the output (docs/ffcv-and-decode.md#2-decoded-at-the-crops-scale): by
:mod:`decode.jpeg.region` where built, else PIL's ``draft``, then resampled at a full decode's
geometry by PIL's antialiased filter: within 1 level of a full decode's pixels on average,
deterministic. None for anything but a complete RGB or grayscale JPEG, or when off."""
from __future__ import annotations

import io
import math

import numpy as np
import torch
from PIL import Image

from . import region
from ..libraries import PIL_ERRORS, OptionalLibrary

_FACTORS = (8, 4, 2)  # libjpeg-turbo's SIMD-accelerated scales 1/8, 1/4, 1/2
_SUPPORT = {"bilinear": 1.0, "bicubic": 2.0}  # PIL's filter reach, input pixels per output pixel
# on unless IMAGENET_FAST_FULL_DECODE=1 or turned off in this process
_switch = OptionalLibrary(lambda: (True, None))
set_enabled = _switch.set_enabled
enabled = _switch.available


def scale_factor(height: int, width: int, out_height: int, out_width: int) -> int:
    """Largest k of 8, 4, 2 keeping the window at 1/k at least the output; else 1."""
    if not enabled():
        return 1
    return next((k for k in _FACTORS if height >= k * out_height and width >= k * out_width), 1)


def resized_window(data: bytes, factor: int, box: tuple[float, float, float, float],
                   size: tuple[int, int], resample: str = "bilinear",
                   shape: tuple[int, int] | None = None) -> torch.Tensor | None:
    """The window ``box`` = ``(top, left, bottom, right)`` (full-image pixels, may be fractional)
    of JPEG ``data`` at ``size``: uint8 ``(3, h, w)``, channels-last, decoded at ``1/factor`` and
    resampled by PIL's ``resample`` filter (:func:`region_resized`, else :func:`draft_resized`).
    ``shape``: :func:`decode.jpeg.region.jpeg_size`'s answer if known (``()`` for None). None
    unless an RGB or grayscale JPEG decodes completely."""
    out = region_resized(data, factor, box, size, resample, shape)
    if out is None:
        out = draft_resized(data, factor, box, size, resample)
    return None if out is None else torch.from_numpy(out).permute(2, 0, 1)  # a writable copy


def region_resized(data: bytes, factor: int, box: tuple[float, float, float, float],
                   size: tuple[int, int], resample: str = "bilinear",
                   shape: tuple[int, int] | None = None) -> np.ndarray | None:
    """:func:`resized_window` through :mod:`decode.jpeg.region`: uint8 ``(h, w, 3)``, or None; the
    box decoded with the filter's reach (PIL's support), the whole scaled image's pixels."""
    shape = region.jpeg_size(data) if shape is None else shape
    if not shape:
        return None
    top, left, bottom, right = (v / factor for v in box)
    support = _SUPPORT[resample] * max((bottom - top) / size[0], (right - left) / size[1], 1.0)
    reach = math.ceil(support) + 2
    height, width = -(-shape[0] // factor), -(-shape[1] // factor)  # libjpeg rounds up
    y0, x0 = max(0, int(top) - reach), max(0, int(left) - reach)
    y1 = min(height, math.ceil(bottom) + reach)
    x1 = min(width, math.ceil(right) + reach)
    pixels = region.decode_region(data, factor, y0, x0, y1 - y0, x1 - x0)
    if pixels is None:
        return None
    image = Image.fromarray(pixels).resize((size[1], size[0]), Image.Resampling[resample.upper()],
                                           box=(left - x0, top - y0, right - x0, bottom - y0))
    return np.array(image)


def draft_resized(data: bytes, factor: int, box: tuple[float, float, float, float],
                  size: tuple[int, int], resample: str = "bilinear") -> np.ndarray | None:
    """:func:`resized_window` through PIL's ``draft``: uint8 ``(h, w, 3)`` or None."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format != "JPEG" or image.mode not in ("RGB", "L"):
                return None
            width, height = image.size
            # draft returns the box of the full image in scaled pixels (factor 1: unscaled)
            scale = width / image.draft(None, (width // factor, height // factor))[1][2]
            top, left, bottom, right = (v / scale for v in box)
            out = image.resize((size[1], size[0]), Image.Resampling[resample.upper()],
                               box=(left, top, right, bottom))
    except PIL_ERRORS:
        return None  # truncated or corrupt: the caller's decoder reports it
    if out.mode != "RGB":
        out = out.convert("RGB")
    return np.array(out)  # a writable copy
