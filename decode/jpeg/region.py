"""One region of a JPEG at libjpeg-turbo's DCT scale 1/1-1/8, the whole image's pixels at that
scale, by our C, ``_jpegcrop.c``, through ctypes (docs/ffcv-and-decode.md, "Crop and scale in one
decode"): None where not built or off, or when libjpeg reports an error or corrupt data."""
from __future__ import annotations

import ctypes
import os

import numpy as np

from ..acceptance import Frame, Refused, read_frame
from ..headers import JPEG_MAGIC, is_jpeg
from ..libraries import OptionalLibrary

_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_jpegcrop.so")
_VERSION = 4  # jc_version() of the C this module calls


def _open():
    try:
        lib = ctypes.CDLL(_LIBRARY)
    except OSError:
        return None, "decode/jpeg/_jpegcrop.so not built (make install builds it)"
    if lib.jc_version() != _VERSION:
        return None, "decode/jpeg/_jpegcrop.so is stale (make install rebuilds it)"
    lib.jc_decode.argtypes = [ctypes.c_char_p, ctypes.c_ulong, *[ctypes.c_int] * 5, ctypes.c_void_p]
    return lib, None


_library = OptionalLibrary(_open)  # the C library, loaded once per process
set_enabled = _library.set_enabled  # the C decoder on (if built) or off in this process
available = _library.available


def status() -> str:
    """One start-up log line: ``"crop + scale: libjpeg-turbo (...)"`` or ``"...: off (why)"``."""
    if not available():
        return f"crop + scale: off ({_library.reason})"
    return "crop + scale: libjpeg-turbo (decode/jpeg/_jpegcrop.so)"


def jpeg_size(data: bytes, frame: Frame | None = None) -> tuple[int, int] | None:
    """``(height, width)`` of a 1- or 3-component JPEG where the C is on, from ``frame`` (its
    header, if read: then never read again) or its header; else None."""
    if not available() or not is_jpeg(data):
        return None
    try:
        frame = frame or read_frame(data)
    except Refused:
        return None
    usable = frame and frame.kind.endswith("JPEG") and frame.components in (1, 3) and frame.pixels
    return (frame.height, frame.width) if usable else None


def decode_region(data: bytes, denom: int, top: int, left: int, height: int,
                  width: int) -> np.ndarray | None:
    """uint8 RGB ``(height, width, 3)`` at ``top``, ``left`` of the JPEG decoded at ``1/denom`` (1,
    2, 4, 8: the ``ceil(H/denom) x ceil(W/denom)`` image); None if off, outside or damaged."""
    lib = _library.get()
    if lib is None or data[:3] != JPEG_MAGIC or height < 1 or width < 1:
        return None
    out = np.empty((height, width, 3), np.uint8)
    if lib.jc_decode(data, len(data), denom, left, top, width, height, out.ctypes.data) != 0:
        return None
    return out
