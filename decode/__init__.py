"""Every image decoder of the project (the bottom layer) and the cascade for a training window,
:func:`decode_crop`. No decoder here applies EXIF orientation (docs/loaders.md#orientation)."""
from __future__ import annotations

import torch
import torch.nn.functional as nnf

from . import acceptance, headers, jpeg, messages, raw
from .acceptance import Frame, Refused, read_frame
from .libraries import decode_image, decode_jpeg, decoder_name, image_library, pil_decode
from .memory import release_freed_memory, retain_freed_memory
from .raw import is_raw

# What the decoders raise for bytes that are not a readable image: torchvision (RuntimeError),
# PIL (OSError incl. UnidentifiedImageError, ValueError), the LMDB codec (ValueError, KeyError)
DECODE_ERRORS = (OSError, RuntimeError, ValueError, KeyError)


def decode(data: bytes) -> torch.Tensor:
    """Encoded image -> RGB uint8 ``(3, H, W)`` (often channels-last) by :mod:`decode.libraries`
    (grayscale and CMYK converted), else PIL; a raw record copied out. Raises
    ``PIL.UnidentifiedImageError`` / ``OSError`` if the bytes are not an image."""
    header = raw.raw_header(data)
    if header is not None:
        return raw.raw_crop(data, None, header)
    try:
        return (decode_jpeg if data[:3] == headers.JPEG_MAGIC else decode_image)(data)
    except RuntimeError:
        return pil_decode(data)


def image_size(data: bytes, frame: Frame | None = None) -> tuple[int, int] | None:
    """``(height, width)`` as stored of any image or raw record, from its header
    (:func:`decode.acceptance.read_frame`, or ``frame``, what it read); None if unreadable."""
    try:
        frame = frame or read_frame(data)
    except Refused:  # PIL's bomb refusal: a size all the same, but not one to decode
        return None
    return None if frame is None else (frame.height, frame.width)


def window_size(data: bytes, frame: Frame | None = None) -> tuple[int, int] | None:
    """``(height, width)`` of a record :func:`decode_crop` cuts without a whole decode (a raw
    record, or a 1- or 3-component JPEG where window decoding is on), else None."""
    if not jpeg.window.available() or not headers.is_jpeg(data):
        return raw.raw_size(data)  # None but for a raw record
    frame = frame or read_frame(data)
    return (frame.height, frame.width) if frame is not None and frame.plain_jpeg else None


def decode_crop(data: bytes, window: tuple[int, int, int, int], size: tuple[int, int],
                image: torch.Tensor | None = None, interpolation: str = "bilinear",
                frame: Frame | None = None) -> tuple[str, torch.Tensor]:
    """``(decoder, pixels)``: the RandomResizedCrop ``window`` = ``(top, left, height, width)``
    of ``data``, uint8 ``(3, h, w)``, by the first decoder of the cascade that takes it:
    ``"scaled"`` (resized to ``size``), else ``"window"``, ``"raw"`` or ``"whole"`` (for
    :func:`resize`). ``image``: the whole decode where :func:`window_size` was None; ``frame``:
    ``data``'s :class:`Frame`, if read (then never read again). ``"nearest"`` never DCT-scales
    (which averages). Raises what :func:`decode` raises."""
    top, left, height, width = window
    if image is None:
        header = raw.raw_header(data)
        if header is not None:
            return "raw", raw.raw_crop(data, window, header)
        factor = jpeg.scaled.scale_factor(height, width, *size)
        if factor > 1 and interpolation != "nearest":
            shape = None if frame is None else jpeg.region.jpeg_size(data, frame) or ()
            out = jpeg.scaled.resized_window(data, factor, (top, left, top + height, left + width),
                                             size, interpolation, shape)
            if out is not None:
                return "scaled", out
        # our C's region at full scale where nvImageCodec's window would be: its pixels in ~8%
        # less time (its progressive windows differ from ours in the last level: those keep its)
        ours = (frame and frame.plain_jpeg and frame.kind != "progressive JPEG"
                and jpeg.window.available())
        pixels = jpeg.region.decode_region(data, 1, *window) if ours else None
        crop = (jpeg.window.decode_window(data, *window) if pixels is None
                else torch.from_numpy(pixels).permute(2, 0, 1))
        if crop is not None:
            return "window", crop
        image = decode(data)
    return "whole", image[:, top:top + height, left:left + width]


def resize(image: torch.Tensor, size: tuple[int, int], interpolation: str = "bilinear",
           dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """The one resize of decoded windows (the JPEG and raw-record paths, :mod:`decode.gpu`):
    uint8 ``(3, h, w)`` -> ``(3, *size)`` of ``dtype``: bilinear or bicubic antialiased, as
    PIL's resize under torchvision, or nearest; uint8 channels-last (``interpolate``'s uint8
    kernels), float32 unrounded (CUDA's kernels take floats)."""
    batch = image.unsqueeze(0)
    if dtype == torch.uint8:
        batch = batch.contiguous(memory_format=torch.channels_last)
    else:
        batch = batch.to(dtype)
    return nnf.interpolate(batch, size=size, mode=interpolation,
                           antialias=interpolation != "nearest")[0]


def decode_window(data: bytes, window: tuple[int, int, int, int], size: tuple[int, int],
                  image: torch.Tensor | None = None, interpolation: str = "bilinear",
                  frame: Frame | None = None) -> torch.Tensor:
    """:func:`decode_crop`'s pixels resized: uint8 ``(3, *size)``. Raises as :func:`decode`."""
    kind, pixels = decode_crop(data, window, size, image, interpolation, frame)
    return pixels if kind == "scaled" else resize(pixels, size, interpolation)


def crop_decoder_status() -> str:
    """One start-up log line: how training crops are decoded."""
    status = jpeg.window.status()
    if jpeg.window.available() and jpeg.scaled.enabled():
        how = ("crop + scale in one decode, decode/jpeg/_jpegcrop.so" if jpeg.region.available()
               else f"PIL draft; {jpeg.region.status()}")
        status += f"; windows >= 2x the output: libjpeg-turbo DCT scaling ({how})"
    return status


def status_line() -> str:
    """The decoders of this process in one start-up log line."""
    return f"{decoder_name()}, {crop_decoder_status()}, PIL fallback {image_library()}"
