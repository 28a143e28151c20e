"""Every image decoder of the project and the one cascade over them: the bottom layer, imported
by ``formats/`` (image checks, re-encoding), ``loaders/`` (transforms, DALI's CPU finish) and the
tools, importing none of them.

Modules, named by what they decode (as ffcv keeps its native bindings below its loader):

* :mod:`decode.libraries`: whole images through a library (TorchCodec, else torchvision.io,
  else PIL; ``IMAGENET_FAST_DECODER`` forces one), the converters' luma-only check decode, the
  library names for logs and resume fingerprints;
* :mod:`decode.jpeg_window`: only the RandomResizedCrop window of a JPEG (nvImageCodec's CPU
  backend, libjpeg-turbo's partial decompression), and the JPEG header size;
* :mod:`decode.jpeg_scaled`: a window at least twice the output at libjpeg-turbo's DCT scale
  1/2, 1/4 or 1/8, resampled by PIL; through :mod:`decode.jpeg_region` (our C,
  ``decode/_jpegcrop.c``: the region only, built by ``make install``) or PIL's ``draft``;
* :mod:`decode.gpu`: a batch's windows in the training process (``--decode-device``):
  nvImageCodec on the GPU (hardware JPEG decoder, CUDA) or its CPU backend, torchvision's
  ``decode_jpeg(device="cuda")`` without it, the CPU cascade for what those decline;
* :mod:`decode.memory`: glibc keeping freed decode buffers (``retain_freed_memory``), handed
  back once per epoch (``release_freed_memory``);
* :mod:`decode.raw`: raw-pixel records (binary PPM/PGM, the converters' ``--raw-budget``), cut
  and resized without a decode;
* :mod:`decode.acceptance`: the one rule of what an image may be, judged from its header
  before any decoder runs (a pixel limit, a frame the file can hold), used by the converters
  and every pipeline; :mod:`decode.messages`: the native decoders' stderr lines (libjpeg's
  ``Corrupt JPEG data: ...``) caught, for the caller to name the file once.

A record is turned into pixels or a window here, whatever it holds: :func:`decode`,
:func:`decode_window`, :func:`window_size` and :func:`image_size` take raw records as well as
encoded images (one helper for every pipeline, the CPU workers', DALI's feed and a GPU one).

The cascade for a training window (:func:`decode_window`): decoded at scale where the window is
at least twice the output, else the window alone, else the whole image and cropped; each step
declines (a CMYK or progressive JPEG, a PNG named ``.JPEG``, a library not installed,
``IMAGENET_FAST_FULL_DECODE=1``) by returning nothing, and the next one takes the image. Every
decoder here keeps pixels as stored: EXIF orientation is never applied (docs/loaders.md,
*Orientation*). Measured costs: docs/ffcv-and-decode.md and docs/performance.md.
"""
from __future__ import annotations

import io
import time

import torch

from . import acceptance, jpeg_region, jpeg_scaled, jpeg_window, messages, raw
from .libraries import (backends, decode_image, decode_jpeg, decode_jpeg_luma, decoder_key,
                        decoder_name, image_library, pil_errors, use)
from .memory import release_freed_memory, retain_freed_memory
from .resample import resize

__all__ = ["acceptance", "backends", "crop_decoder_status", "decode", "decode_image", "decode_jpeg",
           "decode_jpeg_luma", "decode_window", "decoder_key", "decoder_name", "image_library",
           "image_size", "is_raw", "jpeg_size", "messages", "release_freed_memory", "resize",
           "retain_freed_memory", "status_line",
           "use", "window_size"]

is_raw = raw.is_raw

_JPEG_MAGIC = b"\xff\xd8\xff"


def decode(data: bytes) -> torch.Tensor:
    """Decode an encoded image to RGB: uint8 ``(3, H, W)`` (often a channels-last view).

    JPEGs go through libjpeg-turbo (:mod:`decode.libraries`: TorchCodec, else torchvision),
    grayscale and CMYK converted to RGB; other formats (PNG, GIF, WebP inside a ``.JPEG``)
    through the same library's ``decode_image``, and anything those refuse through PIL; a raw
    record (:mod:`decode.raw`) is copied out, not decoded. Raises
    ``PIL.UnidentifiedImageError`` / ``OSError`` if the bytes are not an image.
    """
    if raw.is_raw(data) and raw.raw_header(data) is not None:
        return raw.raw_image(data)
    try:
        if data[:3] == _JPEG_MAGIC:
            return decode_jpeg(data)
        return decode_image(data)
    except RuntimeError:
        return _decode_with_pil(data)


def _decode_with_pil(data: bytes) -> torch.Tensor:
    """PIL's RGB decode; its refusals other than ``OSError`` (a broken PNG's ``SyntaxError``,
    ...) raised as ``OSError`` with the same text, so callers catch one kind."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            rgb = img.convert("RGB")
    except OSError:
        raise
    except pil_errors() as exc:
        raise OSError(f"{type(exc).__name__}: {exc}".split(" <_io.BytesIO")[0]) from None
    return torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8).view(
        rgb.height, rgb.width, 3).permute(2, 0, 1)


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """``(height, width)`` in pixels, as stored, of a 1- or 3-component JPEG whose window
    :func:`decode_window` can decode from its header; None for anything else (CMYK, other
    formats, a bad header) and where window decoding is off: decode those whole."""
    return jpeg_window.jpeg_size(data)


def window_size(data: bytes) -> tuple[int, int] | None:
    """``(height, width)`` in pixels of a record whose training window :func:`decode_window`
    cuts without a whole decode first: a raw record (its header), else :func:`jpeg_size`; None
    for the rest (decode those whole and pass the image)."""
    if raw.is_raw(data):
        return raw.raw_size(data)
    return jpeg_window.jpeg_size(data)


def image_size(data: bytes) -> tuple[int, int] | None:
    """``(height, width)`` in pixels, as stored (EXIF orientation not applied), of any encoded
    image: nvImageCodec's header parse (about 12 us per ImageNet JPEG on one core; DALI's
    decoders parse with the same library), else PIL's (about 95 us); None if neither reads it.
    A raw record's size is read from its header (:mod:`decode.raw`)."""
    if raw.is_raw(data):
        size = raw.raw_size(data)
        if size is not None:
            return size
    module = jpeg_window.library()
    if module is not None:
        try:
            stream = module.CodeStream(data)
            return stream.height, stream.width
        except (RuntimeError, ValueError):
            pass
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.size[1], image.size[0]
    except Exception:  # noqa: BLE001 - PIL's many ways of refusing bytes: not an image
        return None


def decode_window(data: bytes, window: tuple[int, int, int, int], size: tuple[int, int],
                  image: torch.Tensor | None = None,
                  reasons: list[str] | None = None,
                  interpolation: str = "bilinear", marks: list | None = None) -> torch.Tensor:
    """The RandomResizedCrop ``window`` = ``(top, left, height, width)`` (whole pixels inside
    the stored image) of ``data`` resized to ``size`` = ``(height, width)``: uint8
    ``(3, *size)``.

    For a JPEG whose :func:`jpeg_size` was read, the cascade: a window at least twice ``size``
    on both sides at libjpeg-turbo's DCT scale (:func:`decode.jpeg_scaled.resized_window`,
    already resampled), else the window alone (:func:`decode.jpeg_window.decode_window`), else
    the whole image (:func:`decode`), cropped; then :func:`resize`. Pass ``image``, the whole
    decode, where the header was not read: it is cropped at once. ``reasons``, if given,
    collects one line per decoder that declined. ``interpolation``: the resize's filter
    (:func:`resize`; ``"nearest"`` never decodes at a DCT scale, which averages). A raw record
    (:mod:`decode.raw`) is cut out of its stored pixels and resized, no decode. ``marks``, if
    given, gets two items appended: the decoder that took the window (``"scaled"``, whose
    resample is part of its one call, ``"window"``, ``"whole"`` or ``"raw"``) and the
    ``time.perf_counter()`` at which its decode (a raw record's cut) ended and the resize
    began (``loaders.timing.stages``; the pixels are the same with or without). Raises what
    :func:`decode` raises for bytes that are not an image."""
    top, left, height, width = window
    if image is None and raw.is_raw(data):
        header = raw.raw_header(data)
        if header is not None:
            if marks is None:
                return raw.raw_window(data, window, size, header, interpolation)
            crop = raw.raw_crop(data, window, header)  # raw_window is this crop, resized
            marks += ("raw", time.perf_counter())
            return resize(crop, size, interpolation)
    if image is None:
        factor = jpeg_scaled.scale_factor(height, width, *size)
        if factor > 1 and interpolation == "nearest":
            factor = 1
        if factor > 1:
            out = jpeg_scaled.resized_window(data, factor, (top, left, top + height,
                                                            left + width), size, interpolation)
            if out is not None:
                if marks is not None:
                    marks += ("scaled", time.perf_counter())
                return out
            _note(reasons, f"scaled 1/{factor}: declined (not an RGB or grayscale JPEG that "
                           "decodes completely)")
        else:
            _note(reasons, "scaled: off" if not jpeg_scaled.enabled() else
                  "scaled: not for nearest-neighbour resizing" if interpolation == "nearest"
                  else f"scaled: a {height}x{width} window is under twice the output")
        crop = jpeg_window.decode_window(data, top, left, height, width)
        if crop is not None:
            if marks is not None:
                marks += ("window", time.perf_counter())
            return resize(crop, size, interpolation)
        _note(reasons, "window: declined (" + (jpeg_window.status() if not jpeg_window.available()
                                               else "the window did not decode completely") + ")")
        image = decode(data)
    else:
        _note(reasons, "header: not a 1- or 3-component JPEG nvImageCodec reads (or window "
                       "decoding off): decoded whole")
    if marks is not None:
        marks += ("whole", time.perf_counter())
    return resize(image[:, top:top + height, left:left + width], size, interpolation)


def _note(reasons: list[str] | None, line: str) -> None:
    if reasons is not None:
        reasons.append(line)


def crop_decoder_status() -> str:
    """One line for the start-up log on how training crops are decoded (``jpeg_window``, and
    ``jpeg_scaled`` for windows at least twice the output)."""
    scaled = jpeg_window.available() and jpeg_scaled.enabled()
    how = ("crop + scale in one decode, decode/_jpegcrop.so" if jpeg_region.available()
           else f"PIL draft; {jpeg_region.status()}")
    return jpeg_window.status() + (f"; windows >= 2x the output: libjpeg-turbo DCT scaling "
                                   f"({how})" if scaled else "")


def status_line() -> str:
    """The decoders of this process in one line for the start-up log: the whole-image library
    (and why any preferred one was passed over), the crop decoders, PIL's distribution, e.g.
    ``"TorchCodec 0.17.0, crop windows: nvImageCodec 0.9.0 (...); ..., PIL fallback
    Pillow-SIMD 9.5.0.post2"``."""
    return f"{decoder_name()}, {crop_decoder_status()}, PIL fallback {image_library()}"
