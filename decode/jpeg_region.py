"""Decode one region of a JPEG at libjpeg-turbo's DCT scale 1/1, 1/2, 1/4 or 1/8: our C.

``decode/_jpegcrop.c``, built by ``make install`` into ``decode/_jpegcrop.so`` (it needs a C
compiler and the libjpeg-turbo headers: Debian's ``libjpeg-dev``, which Pillow-SIMD's build
needs too), called through ctypes. It is the only decoder here that both crops and scales:
libjpeg-turbo's partial decompression (``jpeg_crop_scanline``, ``jpeg_skip_scanlines``) at
``scale_denom`` k. A RandomResizedCrop window at least twice the output then costs the entropy
decoding of the rows down to its last one plus the inverse DCT, upsampling and colour
conversion of the window alone, at 1/k^2 of its pixels: 13-14% less than PIL's ``draft`` of
the whole image on the real sample (``decode.jpeg_scaled`` uses it for those windows only;
nvImageCodec keeps the others, within 10% of this). Measured side by side:
docs/ffcv-and-decode.md ("Crop and scale in one decode").

Pixels: those of the whole image decoded at the same scale (the C decodes a few pixels more on
each side and drops them, so libjpeg's chroma upsampling has its neighbours), i.e. at 1/1 those
of a whole decode with libjpeg-turbo's accurate integer IDCT.

Callers get ``None``, and take the library path (PIL's ``draft``, or a whole decode), where
the library is not built (a wheel-only install), where ``IMAGENET_FAST_FULL_DECODE=1`` is set,
where the bytes are not a 1- or 3-component JPEG, or where libjpeg reports any error or
corrupt-data warning (a warning is printed to stderr first, as libjpeg prints it, for
:mod:`decode.messages` to catch): the loaders' whole-image decoder then refuses the file or not
exactly as before. :func:`status` says which, in one line.
"""
from __future__ import annotations

import ctypes
import os

import numpy as np

from ._optional import OptionalLibrary

_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_jpegcrop.so")
_VERSION = 4  # jc_version() of the C this module calls
_JPEG_MAGIC = b"\xff\xd8\xff"
_c_int_p = ctypes.POINTER(ctypes.c_int)


def _open():
    try:
        lib = ctypes.CDLL(_LIBRARY)
    except OSError:
        return None, "decode/_jpegcrop.so not built (make install builds it)"
    if lib.jc_version() != _VERSION:
        return None, "decode/_jpegcrop.so is stale (make install rebuilds it)"
    lib.jc_header.argtypes = [ctypes.c_char_p, ctypes.c_ulong, _c_int_p, _c_int_p, _c_int_p]
    lib.jc_decode.argtypes = [ctypes.c_char_p, ctypes.c_ulong, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    return lib, None


_library = OptionalLibrary(_open)  # the C library, loaded once per process
_load = _library.get


def set_enabled(enabled: bool) -> None:
    """Turn the C decoder on (if built) or off in this process, e.g. to compare both."""
    _library.set_enabled(enabled)


def available() -> bool:
    """True if the C decoder is built and enabled in this process."""
    return _load() is not None


def status() -> str:
    """One line for the start-up log: ``"crop + scale: libjpeg-turbo (decode/_jpegcrop.so)"``
    or ``"crop + scale: off (decode/_jpegcrop.so not built (make install builds it))"``."""
    if _load() is None:
        return f"crop + scale: off ({_library.reason})"
    return "crop + scale: libjpeg-turbo (decode/_jpegcrop.so)"


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """``(height, width)`` in pixels of a 1- or 3-component JPEG from its header; None for
    anything else, a header libjpeg warns about, or if the C decoder is off."""
    lib = _load()
    if lib is None or data[:3] != _JPEG_MAGIC:
        return None
    width, height, components = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if lib.jc_header(data, len(data), width, height, components) != 0:
        return None
    if components.value not in (1, 3):
        return None
    return height.value, width.value


def decode_region(data: bytes, denom: int, top: int, left: int, height: int,
                  width: int) -> np.ndarray | None:
    """RGB pixels of rows ``top..top+height`` and columns ``left..left+width`` of the JPEG
    decoded at ``1/denom`` (``denom`` in 1, 2, 4, 8; the scaled image is
    ``ceil(H/denom) x ceil(W/denom)`` and coordinates are its pixels): uint8
    ``(height, width, 3)``. ``None`` if the C decoder is off, the region is not inside the
    scaled image, or libjpeg reports an error or a corrupt-data warning."""
    lib = _load()
    if lib is None or data[:3] != _JPEG_MAGIC or height < 1 or width < 1:
        return None
    out = np.empty((height, width, 3), np.uint8)
    if lib.jc_decode(data, len(data), denom, left, top, width, height, out.ctypes.data) != 0:
        return None
    return out
