"""Decode a JPEG at the scale its output needs: libjpeg-turbo's DCT scaling, cropped where built.

libjpeg-turbo can run its inverse DCT on the 4x4, 2x2 or 1x1 low-frequency coefficients of each
8x8 block, giving the image at 1/2, 1/4 or 1/8 of its size directly (``scale_denom``): the
inverse DCT, chroma upsampling and colour conversion then touch 1/4, 1/16 or 1/64 of the pixels
(the entropy decoding of every block stays). PIL exposes it as ``Image.draft`` (its decoder keeps
libjpeg's accurate integer IDCT and fancy upsampling: ``decoderconfig`` draft flag 0); where
``make install`` built it, ``decode.jpeg_region`` decodes only the window's region at that scale
(the same pixels, without the IDCT of the rest or the rows below). PIL's
``resize`` takes a fractional source box, so the RandomResizedCrop window, or validation's
resize-then-center-crop, is resampled from the scaled image at the exact geometry of a full
decode (box in scaled pixels = box in pixels / factor; pixel ``i`` of a 1/k decode covers pixels
``k*i .. k*i+k-1``). The resampling is PIL's antialiased bilinear filter, the one
``torch.nn.functional.interpolate(antialias=True)`` (:func:`decode.resize`) reimplements.

Used only where the window is at least twice the output on both sides (:func:`scale_factor`);
below that the loaders decode just the window (``decode.jpeg_window``) or the whole image.
Measured side by side on the real sample, one thread (``benchmarks/profile_scaled_decode.py``;
``docs/ffcv-and-decode.md``): the region decode takes 13-14% less than PIL's ``draft`` per
scaled window (1.322 vs 1.512 ms at 160 px); ``draft`` beat simplejpeg's and PyTurboJPEG's
scaled decodes (which need a new dependency, and crop and resize in torch at integer pixels),
and nvImageCodec 0.9 has no scaled decode. The pixels differ from a full decode + resize by a
bounded amount (the scaled IDCT is a DCT-domain low-pass, not the bilinear filter's triangle):
on the sample, mean absolute difference under 1 level, the same on every run (no randomness, no
threads).

Callers get ``None``, and decode as before, where the bytes are not a JPEG PIL reads as RGB or
grayscale, where the decode fails or is incomplete (truncated: PIL raises), or where scaled
decoding is off (``IMAGENET_FAST_FULL_DECODE=1``, or :func:`set_enabled`).
"""
from __future__ import annotations

import io
import math
import os

import numpy as np
import torch

from . import jpeg_region
from .libraries import pil_errors

_FACTORS = (8, 4, 2)  # libjpeg-turbo's SIMD-accelerated scales 1/8, 1/4, 1/2
_enabled = os.environ.get("IMAGENET_FAST_FULL_DECODE") != "1"


def set_enabled(enabled: bool) -> None:
    """Turn scaled decoding on or off in this process (e.g. to compare both)."""
    global _enabled
    _enabled = bool(enabled)


def enabled() -> bool:
    """True if scaled decoding is on in this process."""
    return _enabled


# PIL's filter support in input pixels per output pixel, by resample name
_SUPPORT = {"bilinear": 1.0, "bicubic": 2.0}


def _pil_filter(resample: str):
    from PIL import Image

    return {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}[resample]


def scale_factor(height: int, width: int, out_height: int, out_width: int) -> int:
    """The largest of 8, 4, 2 such that a ``height x width`` window (pixels) decoded at 1/k is
    still at least ``out_height x out_width``; 1 if none (or scaled decoding is off)."""
    if not _enabled:
        return 1
    for k in _FACTORS:
        if height >= k * out_height and width >= k * out_width:
            return k
    return 1


def resized_window(data: bytes, factor: int, box: tuple[float, float, float, float],
                   size: tuple[int, int], resample: str = "bilinear") -> torch.Tensor | None:
    """The window ``box`` = ``(top, left, bottom, right)`` (pixels of the full image, may be
    fractional) of JPEG ``data`` resampled to ``size`` = ``(height, width)``: uint8
    ``(3, height, width)``, channels-last. The JPEG is decoded at ``1/factor`` (1, 2, 4 or 8)
    and the box resampled from there with PIL's antialiased bilinear filter (``resample``
    ``"bicubic"``: its bicubic one, ``--interpolation bicubic``): only the box's
    region through ``decode.jpeg_region`` where built, else the whole image through PIL's
    ``draft`` (the same pixels within 1 level). ``None`` if the bytes are not an RGB or
    grayscale JPEG that decodes completely."""
    out = region_resized(data, factor, box, size, resample)
    if out is None:
        out = draft_resized(data, factor, box, size, resample)
    return None if out is None else torch.from_numpy(out).permute(2, 0, 1)  # a writable copy


def region_resized(data: bytes, factor: int, box: tuple[float, float, float, float],
                   size: tuple[int, int], resample: str = "bilinear") -> np.ndarray | None:
    """:func:`resized_window` through ``decode.jpeg_region`` as uint8 ``(height, width, 3)``, or
    ``None`` where it is not built or declines: the box's region at 1/factor plus the
    filter's reach (PIL's support is the downscale ratio in scaled pixels, twice that for
    bicubic) on every side, so PIL resamples the same pixels as from the whole scaled image."""
    from PIL import Image

    shape = jpeg_region.jpeg_size(data)
    if shape is None:
        return None
    top, left, bottom, right = (v / factor for v in box)
    support = _SUPPORT[resample] * max((bottom - top) / size[0], (right - left) / size[1], 1.0)
    reach = math.ceil(support) + 2
    height, width = -(-shape[0] // factor), -(-shape[1] // factor)  # libjpeg rounds up
    y0, x0 = max(0, int(top) - reach), max(0, int(left) - reach)
    y1 = min(height, math.ceil(bottom) + reach)
    x1 = min(width, math.ceil(right) + reach)
    pixels = jpeg_region.decode_region(data, factor, y0, x0, y1 - y0, x1 - x0)
    if pixels is None:
        return None
    image = Image.fromarray(pixels).resize((size[1], size[0]), _pil_filter(resample),
                                           box=(left - x0, top - y0, right - x0, bottom - y0))
    return np.array(image)


def draft_resized(data: bytes, factor: int, box: tuple[float, float, float, float],
                  size: tuple[int, int], resample: str = "bilinear") -> np.ndarray | None:
    """:func:`resized_window` through PIL as uint8 ``(height, width, 3)``, or ``None``: the
    whole image decoded at 1/factor by ``draft``."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format != "JPEG" or image.mode not in ("RGB", "L"):
                return None
            width, height = image.size
            scale = 1.0
            if factor > 1:  # draft returns the box of the full image in scaled pixels
                scale = width / image.draft(None, (width // factor, height // factor))[1][2]
            top, left, bottom, right = (v / scale for v in box)
            out = image.resize((size[1], size[0]), _pil_filter(resample),
                               box=(left, top, right, bottom))
    except pil_errors():
        return None  # truncated or corrupt: the caller's decoder reports it
    if out.mode != "RGB":
        out = out.convert("RGB")
    return np.array(out)  # a writable copy
