"""What an encoded image may be, judged from its header before any pixel is decoded: the one rule
of the converters, the loaders and validation (docs/loaders.md#which-images-are-refused).

Refused: more than ``max_pixels`` pixels (``--max-image-pixels``), or a frame the file is too short
to hold (:attr:`Frame.min_bytes`: a JPEG's minimum Huffman codes per 8x8 block, ITU-T T.81 F.1.2; a
PNG's deflate ratio, RFC 1951), i.e. a corrupt size field. Arithmetic-coded and hierarchical JPEGs
and other formats get the pixel limit only."""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass

from PIL import Image

from . import raw
from .headers import PNG_MAGIC, SOS, is_jpeg, jpeg_segments, png_chunks
from .libraries import NVIMGCODEC

# PIL's decompression-bomb error threshold: 2 x PIL.Image.MAX_IMAGE_PIXELS (1024**3 // 4 // 3).
MAX_PIXELS = 178_956_970
# The reasons' first words, shared by the loaders' skip lines and the converters' skipped.tsv.
TOO_LARGE = "too large to decode safely"
DAMAGED = "damaged header"
# RFC 1951: at best a length-258 match costs 2 bits (1-bit literal/length and distance codes).
_DEFLATE_MAX_RATIO = 1032
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
# Frame markers without a bound here: lossless, hierarchical, arithmetic-coded.
_OTHER_SOF = frozenset({0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
# The kinds whose frame the decoders here take as read (DCT, Huffman-coded)
_KINDS = {0xC0: "baseline JPEG", 0xC1: "extended sequential JPEG", 0xC2: "progressive JPEG"}


class Refused(ValueError):
    """Refused before decoding: ``str(exc)``, one line, starts with :data:`TOO_LARGE` or
    :data:`DAMAGED`; ``rule``: ``"pixel limit"`` or ``"frame fits the file"``."""

    def __init__(self, reason: str, rule: str):
        super().__init__(reason)
        self.rule = rule


@dataclass(frozen=True)
class Frame:
    """A header's ``kind`` (e.g. ``"baseline JPEG"``), ``height`` and ``width`` in pixels,
    ``min_bytes`` of coded data a complete image needs and ``available`` after the header,
    ``components`` as stored (1 grayscale, 3 YCbCr/RGB, 4 CMYK); 0: unknown."""

    kind: str
    height: int
    width: int
    min_bytes: int = 0
    available: int = 0
    components: int = 0

    @property
    def pixels(self) -> int:
        return self.height * self.width

    @property
    def plain_jpeg(self) -> bool:
        """A DCT, Huffman-coded JPEG of 1 or 3 components and a size (:mod:`decode.jpeg`'s)."""
        return self.kind in _KINDS.values() and self.components in (1, 3) and self.pixels > 0


def check(data: bytes, max_pixels: int = MAX_PIXELS) -> Frame | None:
    """The :class:`Frame` of ``data`` (None: no parser here reads it), ~5-15 us per JPEG. Raises
    :class:`Refused` above ``max_pixels`` (0: no limit) or for a frame the file cannot hold."""
    frame = read_frame(data)
    if frame is None:
        return None
    if max_pixels and frame.pixels > max_pixels:
        raise Refused(f"{TOO_LARGE}: its header claims {frame.width}x{frame.height} = "
                      f"{frame.pixels:,} pixels, over the {max_pixels:,} of "
                      "--max-image-pixels", "pixel limit")
    if frame.min_bytes > frame.available:
        raise Refused(f"{DAMAGED}: a {frame.width}x{frame.height} {frame.kind} needs at least "
                      f"{frame.min_bytes:,} bytes of coded data, the file has "
                      f"{frame.available:,} after its header (a corrupt size field)",
                      "frame fits the file")
    return frame


def read_frame(data: bytes) -> Frame | None:
    """The :class:`Frame` of ``data``: JPEG and PNG with the bound, a raw record, else
    nvImageCodec's or PIL's parse (size only); None if none reads it."""
    if is_jpeg(data) and (frame := _jpeg_frame(data)) is not None:
        return frame
    if data[:8] == PNG_MAGIC:
        return _png_frame(data)
    if (size := raw.raw_size(data)) is not None:
        return Frame("raw", *size)
    return _library_frame(data)


def _jpeg_frame(data: bytes) -> Frame | None:
    """The frame from the markers before the first SOS, walked as libjpeg does, with its bound
    from the first scan header and the Huffman tables; or None."""
    sof = scan = None
    size = len(data)
    tables: dict[int, int] = {}  # DHT's class/id byte (0x0N DC, 0x1N AC) -> shortest code bits
    for marker, pos, end in jpeg_segments(data):
        if marker == 0xC4:  # each Huffman table of a DHT segment (T.81 B.2.4.2)
            at = pos + 4
            while at + 17 <= min(end, size):
                counts = data[at + 1:at + 17]
                tables[data[at]] = 17 - len(counts.lstrip(b"\x00")) if any(counts) else 16
                at += 17 + sum(counts)
        elif marker == SOS:  # always the last segment
            scan, available = data[pos + 4:end], size - end
        elif marker in _KINDS or marker in _OTHER_SOF:
            if sof is not None or end - pos < 10:
                return None
            sof, body = marker, data[pos + 4:end]
    if sof is None or scan is None:
        return None
    height, width = struct.unpack_from(">HH", body, 1)
    kind = _KINDS.get(sof, "unusual JPEG")
    count = min(body[5], (len(body) - 6) // 3)
    if sof in _OTHER_SOF or not count or not height or not width:
        return Frame(kind, height, width, 0, available, count)
    sampling = body[7:6 + 3 * count:3]
    hmax, vmax = max(s >> 4 for s in sampling) or 1, max(s & 15 for s in sampling) or 1
    # component id -> the first scan's DC/AC table byte
    selectors = {scan[1 + 2 * i]: scan[2 + 2 * i]
                 for i in range(min(scan[0], (len(scan) - 1) // 2) if scan else 0)}
    progressive = sof == 0xC2
    if progressive and (len(scan) <= 1 + 2 * len(selectors) or scan[1 + 2 * len(selectors)]):
        return Frame(kind, height, width, 0, available, count)  # the first scan: not DC
    bits = 0
    for i, factors in enumerate(sampling):
        h, v = factors >> 4, factors & 15
        # blocks of the component: a non-interleaved scan's count, never above an interleaved one
        blocks = -(-(-(-width * h // hmax)) // 8) * -(-(-(-height * v // vmax)) // 8)
        selector = selectors.get(body[6 + 3 * i])
        if progressive:  # a DC scan codes each of its components' blocks: one DC code each
            bits += 0 if selector is None else blocks * tables.get(selector >> 4, 1)
        else:  # every block: a DC code and an AC code (EOB at least)
            bits += blocks * (2 if selector is None else tables.get(selector >> 4, 1)
                              + tables.get(0x10 | (selector & 15), 1))
    return Frame(kind, height, width, bits // 8, available, count)


def _png_frame(data: bytes) -> Frame | None:
    """A PNG's IHDR size and the bound of its deflate-coded rows (filter byte + samples), raised
    to what its chunks declare: a length field past the file's end (a decoder may allocate it)."""
    chunks = list(png_chunks(data))
    if len(data) < 33 or not chunks or chunks[0][0] != b"IHDR":
        return None
    width, height, depth, colour = struct.unpack_from(">IIBB", data, chunks[0][1] + 8)
    declared = chunks[-1][2] - 33 if chunks[-1][2] > len(data) else 0
    channels = _PNG_CHANNELS.get(colour)
    if channels is None or not depth:
        return Frame("PNG", height, width, declared, len(data) - 33)
    row = 1 + -(-width * depth * channels // 8)
    return Frame("PNG", height, width, max(declared, height * row // _DEFLATE_MAX_RATIO),
                 len(data) - 33, channels)


def _library_frame(data: bytes) -> Frame | None:
    """Size only, from nvImageCodec's header parse where installed, else PIL's."""
    module = NVIMGCODEC.get()
    if module is not None:
        try:
            stream = module.CodeStream(data)
            return Frame(stream.codec_name, stream.height, stream.width,
                         components=stream.num_channels)
        except (RuntimeError, ValueError):
            pass
    try:
        with Image.open(io.BytesIO(data)) as image:
            return Frame(image.format or "image", image.size[1], image.size[0])
    except Image.DecompressionBombError:
        raise Refused(f"{TOO_LARGE}: PIL's header parse refused it as a decompression bomb",
                      "pixel limit") from None
    except Exception:  # noqa: BLE001 - PIL's many ways of refusing bytes: not an image
        return None


def limit_pil(max_pixels: int) -> None:
    """Set PIL's decompression-bomb limit to ``max_pixels`` (0: none), process-wide."""
    Image.MAX_IMAGE_PIXELS = max_pixels or None
