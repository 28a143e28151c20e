"""Raw-pixel records (``--raw-budget``, docs/raw-share.md#what-a-raw-record-is): binary PPM
(``P6``, RGB) or PGM (``P5``, grayscale) of the Netpbm formats (netpbm.sourceforge.net), header
``P6\\n<width> <height>\\n255\\n`` then ``height x width x channels`` bytes in row order; a window
is cut from the stored bytes without a decode."""
from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np
import torch

# Netpbm's header without comments (legal, never written here: such files decode through PIL)
_HEADER = re.compile(rb"P([56])[ \t\r\n]+(\d{1,6})[ \t\r\n]+(\d{1,6})[ \t\r\n]+(\d{1,3})[ \t\r\n]")


class RawHeader(NamedTuple):
    """A raw record's size in pixels, ``channels`` (1 or 3), byte ``offset`` of its first pixel."""

    height: int
    width: int
    channels: int
    offset: int


def is_raw(data: bytes) -> bool:
    """Whether ``data`` starts like a binary PPM/PGM (``P6`` or ``P5``)."""
    return data[:2] in (b"P6", b"P5")


def raw_header(data: bytes) -> RawHeader | None:
    """The :class:`RawHeader` of a binary PPM/PGM, maxval 255, of exactly header plus pixel bytes;
    else None (a truncated record then goes to PIL, which refuses it)."""
    match = _HEADER.match(data, 0, 32)  # a header as written: 11-21 bytes
    if match is None or match[4] != b"255":
        return None
    channels = 3 if match[1] == b"6" else 1
    width, height, offset = int(match[2]), int(match[3]), match.end()
    if width < 1 or height < 1 or len(data) != offset + width * height * channels:
        return None
    return RawHeader(height, width, channels, offset)


def raw_size(data: bytes) -> tuple[int, int] | None:
    """``(height, width)`` in pixels of a raw record, None for anything else."""
    header = raw_header(data)
    return None if header is None else header[:2]


def raw_crop(data: bytes, window: tuple[int, int, int, int] | None = None,
             header: RawHeader | None = None) -> torch.Tensor:
    """The ``window`` (None: all) of a raw record, uint8 ``(3, height, width)``, a channels-last
    copy of its bytes only, grayscale repeated. ``header``: its :func:`raw_header`, if read.
    ``ValueError`` if malformed."""
    header = header or raw_header(data)
    if header is None:
        raise ValueError("not a well-formed raw (binary PPM/PGM, maxval 255) record")
    top, left, height, width = window or (0, 0, header.height, header.width)
    pixels = np.frombuffer(data, np.uint8, header.height * header.width * header.channels,
                           header.offset).reshape(header.height, header.width, header.channels)
    pixels = pixels[top:top + height, left:left + width]
    # a fresh, writable array in C order: only the window's bytes
    pixels = np.repeat(pixels, 3, axis=2) if header.channels == 1 else pixels.copy()
    return torch.from_numpy(pixels).permute(2, 0, 1)


def encode_raw(image: torch.Tensor, gray: bool = False) -> bytes:
    """uint8 ``(3, H, W)`` as binary PPM, or with ``gray`` (equal channels) PGM: an 11-17 byte
    header plus ``H x W x (1 or 3)`` bytes. Raises ``ValueError`` for other input."""
    if image.dtype != torch.uint8 or image.dim() != 3 or image.shape[0] != 3:
        raise ValueError(f"encode_raw takes uint8 (3, H, W) pixels, not {image.dtype} "
                         f"{tuple(image.shape)}")
    height, width = image.shape[1:]
    pixels = image[:1] if gray else image
    return (b"P%d\n%d %d\n255\n" % (5 if gray else 6, width, height)
            + pixels.permute(1, 2, 0).contiguous().numpy().tobytes())


def raw_bytes(height: int, width: int, channels: int = 3) -> int:
    """Bytes a raw record of that many pixels takes (header included)."""
    return len(b"P6\n%d %d\n255\n" % (width, height)) + height * width * channels
