"""What an encoded image may be, judged from its header before any pixel is decoded: the one
acceptance rule of every path (the converters' checks, the DataLoader workers, the batch
decoder's workers, DALI's feed, validation).

Two rules, both read from the header alone (:func:`check`, a few microseconds per JPEG):

* **Pixel limit**: ``height x width`` at most ``max_pixels`` (``--max-image-pixels``; 0 lifts
  it). The default, :data:`MAX_PIXELS` = 178,956,970, is the number PIL refuses above
  (``DecompressionBombError`` past twice ``PIL.Image.MAX_IMAGE_PIXELS``), which the converters
  have always enforced through PIL; none of ImageNet's training images comes near it.
* **The frame fits the file**: the entropy-coded data a complete image of the header's size
  needs has a lower bound (:func:`read_frame`, :attr:`Frame.min_bytes`): a baseline or
  extended JPEG codes every 8x8 block of every component with at least one DC and one AC
  Huffman code, each at least as long as the shortest code of the tables the header defines
  (ITU-T T.81 F.1.2); a progressive one every block at least once in a DC scan (1 bit or
  more); a PNG's deflate stream cannot shrink its rows by more than 1032:1 (RFC 1951: a
  length-258 match in 2 bits at best). A file shorter than that bound cannot hold the image its
  header claims: its size field is corrupt (the one-bit height flip of a 37 KB photograph
  claiming 33,143 rows needs 199 KB) and every decoder would fill the missing rows with grey.
  No complete file is ever below its bound; measured figures and why no margin is added:
  docs/loaders.md, *Which images are refused*.

A file that passes but whose data still ends early (a premature end, a bad Huffman code) is
decoded as the libraries decode it and named once as a warning (:mod:`decode.messages`).
Arithmetic-coded and hierarchical JPEGs, and formats other than JPEG and PNG, get the pixel
limit only (an arithmetic coder codes a flat block in well under a bit).
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass

from . import raw

__all__ = ["MAX_PIXELS", "DAMAGED", "Frame", "Refused", "TOO_LARGE", "check", "limit_pil",
           "read_frame"]

# PIL's decompression-bomb error threshold: 2 x PIL.Image.MAX_IMAGE_PIXELS (89,478,485, i.e.
# 1024**3 // 4 // 3), what folder2lmdb.py and folder2shards.py refused through PIL.
MAX_PIXELS = 178_956_970
# The reasons' first words, shared by the loaders' skip lines and the converters' skipped.tsv.
TOO_LARGE = "too large to decode safely"
DAMAGED = "damaged header"
# RFC 1951: at best a length-258 match costs 2 bits (1-bit literal/length and distance codes).
_DEFLATE_MAX_RATIO = 1032
_JPEG_MAGIC = b"\xff\xd8"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_PROGRESSIVE = frozenset({0xC2})
# Frame markers without a bound here: lossless, hierarchical, arithmetic-coded.
_OTHER_SOF = frozenset({0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_FRAMES = frozenset({0xC0, 0xC1, 0xC2}) | _OTHER_SOF
_KINDS = {0xC0: "baseline JPEG", 0xC1: "extended sequential JPEG", 0xC2: "progressive JPEG"}
# RSTn, SOI, TEM: no length field; FF 00 outside a scan is skipped as libjpeg skips it
_STANDALONE = frozenset(range(0xD0, 0xD9)) | {0x00, 0x01}
_LENGTH, _SIZE = struct.Struct(">H"), struct.Struct(">HH")


class Refused(ValueError):
    """The image is refused before decoding; ``str(exc)`` is the one-line reason, starting with
    :data:`TOO_LARGE` or :data:`DAMAGED`; ``rule`` is ``"pixel limit"`` or ``"frame fits the
    file"``."""

    def __init__(self, reason: str, rule: str):
        super().__init__(reason)
        self.rule = rule


@dataclass(frozen=True)
class Frame:
    """What a header says: ``kind`` (e.g. ``"baseline JPEG"``, ``"PNG"``, ``"raw"``, or PIL's
    format name), ``height`` and ``width`` in pixels, and ``min_bytes``, a lower bound on the
    bytes of coded data after the header a complete image of that size needs (0: no bound
    known); ``available``: the bytes of the file after the header (where the coded data must
    lie)."""

    kind: str
    height: int
    width: int
    min_bytes: int = 0
    available: int = 0

    @property
    def pixels(self) -> int:
        return self.height * self.width


def check(data: bytes, max_pixels: int = MAX_PIXELS) -> Frame | None:
    """Refuse ``data`` if its header claims more than ``max_pixels`` pixels (0: no limit) or a
    frame the file is too short to hold; returns the :class:`Frame` read (None where no header
    parser here reads it: the decoders then decide). Raises :class:`Refused` with the reason.
    Costs a header parse: about 5-15 us for an ImageNet JPEG on one core, no pixel decoded."""
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
    """The :class:`Frame` of ``data``'s header: JPEG and PNG parsed here (with the coded-data
    bound), a raw record (:mod:`decode.raw`) from its header, other formats from nvImageCodec's
    or PIL's header parse (size only); None if none of them reads it."""
    if data[:2] == _JPEG_MAGIC:
        frame = _jpeg_frame(data)
        if frame is not None:
            return frame
    elif data[:8] == _PNG_MAGIC:
        return _png_frame(data)
    elif raw.is_raw(data):
        size = raw.raw_size(data)
        if size is not None:
            return Frame("raw", *size)
    return _library_frame(data)


def _jpeg_frame(data: bytes) -> Frame | None:
    """Walk the marker segments to the first SOS as libjpeg does (bytes between segments
    skipped); None without a frame header before it."""
    sof = None
    tables: dict[int, int] = {}  # DHT's class/id byte -> shortest code length in bits
    pos, size, unpack = 2, len(data), _LENGTH.unpack_from
    while pos + 4 <= size:
        if data[pos] != 0xFF:  # libjpeg skips to the next 0xFF ("extraneous bytes")
            pos = data.find(b"\xff", pos)
            if pos < 0:
                return None
            continue
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        if marker == 0xD9:
            return None
        (length,) = unpack(data, pos + 2)
        if length < 2:
            return None
        end = pos + 2 + length
        if marker == 0xC4:
            _read_tables(data, pos + 4, min(end, size), tables)
        elif marker == 0xDA:
            return None if sof is None else _bound(sof, data[pos + 4:end], tables, size - end)
        elif marker in _FRAMES:
            if sof is not None or length < 8:
                return None
            sof = (marker, data[pos + 4:end])
        pos = end
    return None


def _read_tables(data: bytes, at: int, end: int, tables: dict) -> None:
    """Shortest code length of each Huffman table of the DHT segment ``data[at:end]`` (T.81
    B.2.4.2): the first of its 16 code-length counts that is not zero."""
    while at + 17 <= end:
        counts = data[at + 1:at + 17]
        tables[data[at]] = 17 - len(counts.lstrip(b"\x00")) if any(counts) else 16
        at += 17 + sum(counts)


def _bound(sof: tuple[int, bytes], scan: bytes, tables: dict, available: int) -> Frame:
    """The frame of SOF ``sof`` = ``(marker, segment body)`` and the coded-data bound, given the
    first scan header ``scan`` and the Huffman tables defined before it (``tables``: by DHT's
    class/id byte, 0x0N DC table N, 0x1N AC table N)."""
    marker, body = sof
    height, width = _SIZE.unpack_from(body, 1)
    kind = _KINDS.get(marker, "unusual JPEG")
    count = min(body[5], (len(body) - 6) // 3)
    if marker in _OTHER_SOF or not count or not height or not width:
        return Frame(kind, height, width, 0, available)
    sampling = body[7:6 + 3 * count:3]
    hmax, vmax = max(s >> 4 for s in sampling) or 1, max(s & 15 for s in sampling) or 1
    selectors = {}  # component id -> the first scan's DC/AC table byte
    for i in range(min(scan[0], (len(scan) - 1) // 2) if scan else 0):
        selectors[scan[1 + 2 * i]] = scan[2 + 2 * i]
    progressive = marker in _PROGRESSIVE
    if progressive and (len(scan) <= 1 + 2 * len(selectors) or scan[1 + 2 * len(selectors)]):
        return Frame(kind, height, width, 0, available)  # the first scan is not a DC scan
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
    return Frame(kind, height, width, bits // 8, available)


def _png_frame(data: bytes) -> Frame | None:
    """A PNG's IHDR size and the bound of its deflate-coded rows (filter byte + samples)."""
    if len(data) < 33 or data[12:16] != b"IHDR":
        return None
    width, height, depth, colour = struct.unpack_from(">IIBB", data, 16)
    channels = _PNG_CHANNELS.get(colour)
    if channels is None or not depth:
        return Frame("PNG", height, width, 0, len(data) - 33)
    row = 1 + -(-width * depth * channels // 8)
    return Frame("PNG", height, width, height * row // _DEFLATE_MAX_RATIO, len(data) - 33)


def _library_frame(data: bytes) -> Frame | None:
    """Size only, from nvImageCodec's header parse where installed, else PIL's."""
    from . import jpeg_window

    module = jpeg_window.library()
    if module is not None:
        try:
            stream = module.CodeStream(data)
            return Frame(stream.codec_name, stream.height, stream.width)
        except (RuntimeError, ValueError):
            pass
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            return Frame(image.format or "image", image.size[1], image.size[0])
    except Image.DecompressionBombError:
        raise Refused(f"{TOO_LARGE}: PIL's header parse refused it as a decompression bomb",
                      "pixel limit") from None
    except Exception:  # noqa: BLE001 - PIL's many ways of refusing bytes: not an image
        return None


def limit_pil(max_pixels: int) -> None:
    """Make PIL's own decompression-bomb limit agree with ``max_pixels`` (0: none), so that PIL,
    the decoders' last resort, never refuses or warns about an image :func:`check` accepted
    (PIL warns above ``Image.MAX_IMAGE_PIXELS`` and raises above twice it). Process-wide:
    workers forked later inherit it."""
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = max_pixels or None
