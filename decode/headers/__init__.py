"""The headers of encoded images, walked in one place for the acceptance rule, the size queries and
the EXIF cut: JPEG's markers (:func:`jpeg_segments`) and PNG's chunks; the decoders' probe JPEG."""
from __future__ import annotations

import functools
import io
from typing import Iterator

from PIL import Image

# SOI and the first marker's 0xFF (ITU-T T.81 B.1.1.2); the PNG signature (RFC 2083 3.1)
JPEG_MAGIC = b"\xff\xd8\xff"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SOS, EOI = 0xDA, 0xD9
# Markers without a length field (T.81 B.1.1.3): RST0-7, SOI, TEM; FF 00 outside a scan is
# skipped as libjpeg's next_marker skips it
_STANDALONE = frozenset(range(0xD0, 0xD9)) | {0x00, 0x01}


def is_jpeg(data: bytes) -> bool:
    """Whether ``data`` starts with a JPEG's SOI marker (``FF D8``)."""
    return data[:2] == JPEG_MAGIC[:2]


def jpeg_segments(data: bytes) -> Iterator[tuple[int, int, int]]:
    """``(marker, begin, end)`` of each segment with a length field after SOI, up to and including
    the first SOS (``begin``: its ``FF``; ``end``: ``begin + 2 + length``, maybe past the data),
    walked as libjpeg's ``next_marker``: bytes between segments skipped to the next ``FF``, fill
    bytes and length-less markers passed over; it ends at EOI, a length under 2 or the data's end.
    ``data`` must start with SOI (:func:`is_jpeg`)."""
    pos, size = 2, len(data)
    while pos + 4 <= size:
        if data[pos] != 0xFF:  # libjpeg skips to the next 0xFF ("extraneous bytes")
            pos = data.find(b"\xff", pos)
            if pos < 0:
                return
            continue
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        length = (data[pos + 2] << 8) | data[pos + 3]
        if marker == EOI or length < 2:
            return
        end = pos + 2 + length
        yield marker, pos, end
        if marker == SOS:
            return
        pos = end


def png_chunks(data: bytes) -> Iterator[tuple[bytes, int, int]]:
    """``(type, begin, end)`` of each chunk of a PNG (length, type, data, CRC; ``end`` maybe past
    the data) up to and including IEND. ``data`` must start with :data:`PNG_MAGIC`."""
    pos, size = 8, len(data)
    while pos + 12 <= size:
        kind, end = data[pos + 4:pos + 8], pos + 12 + int.from_bytes(data[pos:pos + 4], "big")
        yield kind, pos, end
        if kind == b"IEND":
            return
        pos = end


@functools.lru_cache(maxsize=1)
def probe_jpeg() -> bytes:
    """A 64 x 48 baseline 4:2:0 JPEG (PIL, quality 90): what every decoder here, nvJPEG's CUDA and
    hardware decoders included, is tried on before it is chosen."""
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 100, 50)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()
