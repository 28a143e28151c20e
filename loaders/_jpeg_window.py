"""Decode just the RandomResizedCrop window of a JPEG (``loaders/_jpegcrop.c`` via ctypes).

Measured on the real ImageNet sample (``benchmarks/profile_transforms.py``): decoding only the
window costs well under a full decode, and its pixels equal a full decode's crop up to the
chroma upsampling at the window's edges (mean difference ~0.003 of 255). The C library is
built by ``make install``; where it is missing (no compiler or libjpeg headers), where the bytes
are not a JPEG libjpeg-turbo turns into RGB (CMYK, PNG inside ``.JPEG``, ...), or where
``IMAGENET_FAST_FULL_DECODE=1`` is set, callers get ``None`` and decode the whole image instead.
"""
from __future__ import annotations

import ctypes
import os

import torch

_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_jpegcrop.so")
_JPEG_MAGIC = b"\xff\xd8\xff"
_MCU = 32  # widest iMCU (4:1:0 sampling is 32 px) by which jpeg_crop_scanline widens a window
_ABI_VERSION = 2  # jc_version() of the _jpegcrop.c this module calls
_lib = None
_loaded = False


def _load():
    """The C library, loaded once per process (DataLoader workers load their own)."""
    global _lib, _loaded
    if not _loaded:
        _loaded = True
        if os.environ.get("IMAGENET_FAST_FULL_DECODE") != "1" and os.path.isfile(_LIBRARY):
            try:
                lib = ctypes.CDLL(_LIBRARY)
                lib.jc_header.restype = lib.jc_decode_window.restype = ctypes.c_int
                # A build from an older _jpegcrop.c (no `make install` since) is not called.
                _lib = lib if lib.jc_version() == _ABI_VERSION else None
            except (OSError, AttributeError):
                _lib = None
    return _lib


def set_enabled(enabled: bool) -> None:
    """Turn window decoding on (if built) or off in this process, e.g. to compare both."""
    global _lib, _loaded
    _loaded, _lib = False, None
    if enabled:
        _load()
    else:
        _loaded = True


def available() -> bool:
    """True if window decoding is built and enabled in this process."""
    return _load() is not None


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """``(height, width)`` of a 1- or 3-component JPEG the library can window-decode, else None."""
    lib = _load()
    if lib is None or data[:3] != _JPEG_MAGIC:
        return None
    width, height, components = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if lib.jc_header(data, len(data), ctypes.byref(width), ctypes.byref(height),
                     ctypes.byref(components)) != 0 or components.value not in (1, 3):
        return None
    return height.value, width.value


def decode_window(data: bytes, top: int, left: int, height: int, width: int) -> torch.Tensor | None:
    """RGB pixels of rows ``top..top+height`` and columns ``left..left+width`` of a JPEG:
    uint8 ``(3, height, width)`` (a channels-last view). ``None`` if the library is missing or
    libjpeg-turbo reports an error (the caller then decodes the whole image)."""
    lib = _load()
    if lib is None:
        return None
    capacity = height * (width + 2 * _MCU) * 3
    out = torch.empty(capacity, dtype=torch.uint8)
    status = lib.jc_decode_window(data, len(data), left, top, width, height,
                                  ctypes.c_void_p(out.data_ptr()), ctypes.c_ulong(capacity))
    if status != 0:
        return None
    return out[:height * width * 3].view(height, width, 3).permute(2, 0, 1)
