"""The RandomResizedCrop window of a JPEG, a whole decode's crop's pixels, by nvImageCodec's CPU
backend (libjpeg-turbo's partial decompression; docs/performance.md#image-decoders)."""
from __future__ import annotations

import os
import threading

import numpy as np
import torch

from ..libraries import NVIMGCODEC

_local = threading.local()  # one Decoder per thread and process (see _decoder)
# nvImageCodec's module where window decoding is on in this process, else None
library = NVIMGCODEC.get
set_enabled = NVIMGCODEC.set_enabled  # window decoding on (if installed) or off in this process
available = NVIMGCODEC.available


def make_decoder(n, device_id: int, threads: int, backends: list) -> tuple:
    """``(decoder, params)`` of nvImageCodec's module ``n`` on ``device_id`` with ``backends``
    and ``threads`` CPU threads: fancy upsampling, RGB, no EXIF orientation (pixels as stored)."""
    decoder = n.Decoder(device_id=device_id, max_num_cpu_threads=max(1, threads),
                        backends=backends, options=":fancy_upsampling=1")
    params = n.DecodeParams(apply_exif_orientation=False, color_spec=n.ColorSpec.SRGB,
                            sample_format=n.SampleFormat.I_RGB)
    return decoder, params


def _decoder():
    """``(decoder, params)`` of this thread and process (:func:`make_decoder`): CPU-only, one
    thread (one per DataLoader worker); made anew after a fork."""
    if getattr(_local, "pid", None) != os.getpid():
        n = library()
        _local.pair = make_decoder(n, n.NVIMGCODEC_DEVICE_CPU_ONLY, 1,
                                   [n.Backend(n.BackendKind.CPU_ONLY)])
        _local.pid = os.getpid()
    return _local.pair


def status() -> str:
    """One start-up log line: ``"crop windows: nvImageCodec 0.9.0 (...)"`` or why not."""
    module = library()
    if module is None:
        return f"crop windows: whole JPEGs decoded ({NVIMGCODEC.reason})"
    return (f"crop windows: nvImageCodec {module.__version__} (CPU, libjpeg-turbo partial "
            "decompression)")


def decode_window(data: bytes, top: int, left: int, height: int, width: int) -> torch.Tensor | None:
    """uint8 RGB ``(3, height, width)`` (a channels-last view) at ``top``, ``left`` of a JPEG; None
    if off or incomplete (the caller's whole decode reports the error)."""
    module = library()
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
    return pixels.permute(2, 0, 1) if tuple(pixels.shape) == (height, width, 3) else None
