"""Decode just the RandomResizedCrop window of a JPEG: nvImageCodec's CPU backend.

nvImageCodec (``nvidia-nvimgcodec-cu13``/``-cu12``, the wheel NVIDIA DALI installs) decodes a
region of interest with libjpeg-turbo's partial decompression: rows below the window are never
decoded and those above are skipped, so a training crop costs well under a whole decode.
Measured on the real ImageNet sample, one thread (``benchmarks/profile_decoders.py``,
docs/performance.md): 0.762 ms CPU per RandomResizedCrop window against 0.734 ms for the first
version of our C (+4%, median of 9 interleaved rounds) and 0.985 ms for a whole decode; its
pixels equal a whole decode's crop (that C's differed by up to 12 levels at the window's edges,
where libjpeg's cropped chroma upsampling lacks neighbours). Today's C,
``decode/_jpegcrop.c`` (``decode.jpeg_region``), decodes a margin around its region for exact
pixels and serves the windows at least twice the output, at libjpeg-turbo's DCT scale
(``decode.jpeg_scaled``); at 1/1 it is within 10% of this decoder, which keeps those windows.

Callers get ``None``, and decode the whole image instead, where nvImageCodec is not installed,
where the bytes are not a 1- or 3-component JPEG (CMYK, PNG inside ``.JPEG``, ...), where the
window does not decode completely (truncated or corrupt data), or where
``IMAGENET_FAST_FULL_DECODE=1`` is set. :func:`status` says which, in one line.
"""
from __future__ import annotations

import importlib
import os
import threading

import numpy as np
import torch

from ._optional import OptionalLibrary

_JPEG_MAGIC = b"\xff\xd8\xff"
# Without this, nvImageCodec prints two coloured lines to stderr for every JPEG it cannot
# decode; the loaders then decode the whole image and report the sample themselves.
os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")

_local = threading.local()  # one Decoder per thread and process (see _decoder)


def _import():
    try:
        return importlib.import_module("nvidia.nvimgcodec"), None
    except Exception as exc:  # noqa: BLE001 - ImportError, or its native libraries
        return None, f"nvImageCodec not usable ({type(exc).__name__}: {exc})"


_library = OptionalLibrary(_import)  # nvImageCodec's module, imported once per process
_load = _library.get


def _decoder():
    """``(decoder, params)`` of this thread in this process: a CPU-only nvImageCodec Decoder
    with one thread (the caller's share of the cores; DataLoader runs one per worker), fancy
    chroma upsampling (libjpeg's default, as every whole-image decoder here), EXIF orientation
    not applied, RGB out. Made after a fork in the child, never inherited."""
    key = os.getpid()
    if getattr(_local, "pid", None) != key:
        n = _library.get()
        _local.decoder = n.Decoder(device_id=n.NVIMGCODEC_DEVICE_CPU_ONLY, max_num_cpu_threads=1,
                                   backends=[n.Backend(n.BackendKind.CPU_ONLY)],
                                   options=":fancy_upsampling=1")
        _local.params = n.DecodeParams(apply_exif_orientation=False, color_spec=n.ColorSpec.SRGB,
                                       sample_format=n.SampleFormat.I_RGB)
        _local.pid = key
    return _local.decoder, _local.params


def library():
    """nvImageCodec's module where window decoding is installed and enabled in this process,
    else None (for its header parser, ``decode.image_size``)."""
    return _load()


def set_enabled(enabled: bool) -> None:
    """Turn window decoding on (if installed) or off in this process, e.g. to compare both."""
    _library.set_enabled(enabled)


def available() -> bool:
    """True if window decoding is installed and enabled in this process."""
    return _load() is not None


def status() -> str:
    """One line for the start-up log, e.g. ``"crop windows: nvImageCodec 0.9.0 (CPU,
    libjpeg-turbo partial decompression)"`` or ``"crop windows: whole JPEGs decoded
    (nvImageCodec not usable (ModuleNotFoundError: ...))"``."""
    module = _load()
    if module is None:
        return f"crop windows: whole JPEGs decoded ({_library.reason})"
    return (f"crop windows: nvImageCodec {module.__version__} (CPU, libjpeg-turbo partial "
            "decompression)")


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """``(height, width)`` in pixels of a 1- or 3-component JPEG whose window can be decoded,
    from its header; None for anything else (or if window decoding is off)."""
    module = _load()
    if module is None or data[:3] != _JPEG_MAGIC:
        return None
    try:
        stream = module.CodeStream(data)
        if stream.codec_name != "jpeg" or stream.num_channels not in (1, 3):
            return None
        return stream.height, stream.width
    except RuntimeError:  # "Failed to get image info": no valid header
        return None


def decode_window(data: bytes, top: int, left: int, height: int, width: int) -> torch.Tensor | None:
    """RGB pixels of rows ``top..top+height`` and columns ``left..left+width`` (pixels, inside
    the image) of a JPEG: uint8 ``(3, height, width)``, a channels-last view. ``None`` if window
    decoding is off or the window does not decode completely (the caller then decodes the whole
    image, which reports the error)."""
    module = _load()
    if module is None:
        return None
    try:
        decoder, params = _decoder()
        region = module.Region(top, left, top + height, left + width)
        image = decoder.decode(module.CodeStream(data).get_sub_code_stream(region=region),
                               params=params)
    except (RuntimeError, ValueError):  # bad header, or a region outside the image
        return None
    if image is None:  # libjpeg-turbo stopped on corrupt or truncated data
        return None
    pixels = torch.from_numpy(np.asarray(image.cpu()))  # (height, width, 3), shares memory
    if tuple(pixels.shape) != (height, width, 3):
        return None
    return pixels.permute(2, 0, 1)
