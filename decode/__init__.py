"""Every image decoder of the project and the cascade over them: the bottom layer, importing no
other package of the project.

The cascade for a training window (:func:`decode_window`): at libjpeg-turbo's DCT scale where the
window is at least twice the output (:mod:`decode.jpeg.scaled`), else the window alone
(:mod:`decode.jpeg.window`), else the whole image (:mod:`decode.libraries`), cropped; a step that
declines returns None and the next takes the image. No decoder here applies EXIF orientation
(docs/loaders.md#orientation)."""
from __future__ import annotations

import io
import time

import torch

from . import acceptance, jpeg, messages, raw
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
    """Encoded image -> RGB uint8 ``(3, H, W)`` (often channels-last): JPEGs by libjpeg-turbo
    (:mod:`decode.libraries`, grayscale and CMYK converted), other formats by the same library,
    else PIL; a raw record is copied out. Raises ``PIL.UnidentifiedImageError`` / ``OSError`` if
    the bytes are not an image."""
    if raw.is_raw(data) and raw.raw_header(data) is not None:
        return raw.raw_image(data)
    try:
        if data[:3] == _JPEG_MAGIC:
            return decode_jpeg(data)
        return decode_image(data)
    except RuntimeError:
        return _decode_with_pil(data)


def _decode_with_pil(data: bytes) -> torch.Tensor:
    """PIL's RGB decode; its other refusals re-raised as ``OSError``, same text."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            rgb = img.convert("RGB")
    except Image.UnidentifiedImageError:  # its text names the BytesIO object, not the bytes
        raise Image.UnidentifiedImageError(messages.not_an_image(data)) from None
    except OSError:
        raise
    except pil_errors() as exc:
        raise OSError(f"{type(exc).__name__}: {exc}".split(" <_io.BytesIO")[0]) from None
    return torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8).view(
        rgb.height, rgb.width, 3).permute(2, 0, 1)


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """``(height, width)`` of a JPEG whose window :func:`decode_window` decodes, else None."""
    return jpeg.window.jpeg_size(data)


def window_size(data: bytes) -> tuple[int, int] | None:
    """``(height, width)`` of a record :func:`decode_window` cuts without a whole decode, else
    None."""
    if raw.is_raw(data):
        return raw.raw_size(data)
    return jpeg.window.jpeg_size(data)


def image_size(data: bytes) -> tuple[int, int] | None:
    """``(height, width)`` as stored of any image or raw record; None if unreadable."""
    if raw.is_raw(data):
        size = raw.raw_size(data)
        if size is not None:
            return size
    module = jpeg.window.library()
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
    """The RandomResizedCrop ``window`` = ``(top, left, height, width)`` of ``data`` resized to
    ``size``: uint8 ``(3, *size)``. ``image``: the whole decode where :func:`window_size` was None.
    ``reasons``: gets a line per decoder that declined. ``interpolation``: :func:`resize`'s
    (``"nearest"`` never DCT-scales, which averages). ``marks``: gets the decoder that took it and
    the ``perf_counter()`` its resize began. Raises what :func:`decode` raises."""
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
        factor = jpeg.scaled.scale_factor(height, width, *size)
        if factor > 1 and interpolation == "nearest":
            factor = 1
        if factor > 1:
            out = jpeg.scaled.resized_window(data, factor, (top, left, top + height,
                                                            left + width), size, interpolation)
            if out is not None:
                if marks is not None:
                    marks += ("scaled", time.perf_counter())
                return out
            _note(reasons, f"scaled 1/{factor}: declined (not an RGB or grayscale JPEG that "
                           "decodes completely)")
        else:
            _note(reasons, "scaled: off" if not jpeg.scaled.enabled() else
                  "scaled: not for nearest-neighbour resizing" if interpolation == "nearest"
                  else f"scaled: a {height}x{width} window is under twice the output")
        crop = jpeg.window.decode_window(data, top, left, height, width)
        if crop is not None:
            if marks is not None:
                marks += ("window", time.perf_counter())
            return resize(crop, size, interpolation)
        _note(reasons, "window: declined (" + (jpeg.window.status() if not jpeg.window.available()
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
    """One start-up log line: how training crops are decoded."""
    scaled = jpeg.window.available() and jpeg.scaled.enabled()
    how = ("crop + scale in one decode, decode/jpeg/_jpegcrop.so" if jpeg.region.available()
           else f"PIL draft; {jpeg.region.status()}")
    return jpeg.window.status() + (f"; windows >= 2x the output: libjpeg-turbo DCT scaling "
                                   f"({how})" if scaled else "")


def status_line() -> str:
    """The decoders of this process in one start-up log line."""
    return f"{decoder_name()}, {crop_decoder_status()}, PIL fallback {image_library()}"
