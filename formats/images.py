"""By their content (:func:`check_file`), which of the files a converter lists
(:mod:`formats.sources`) it stores as they are, which it re-encodes, and which it skips.

Every record must be readable by every decoder the loaders use: PIL (Pillow / Pillow-SIMD),
the libjpeg-turbo decoder of ``decode.libraries`` (TorchCodec, or torchvision) and DALI's
``decoders.image`` (nvJPEG on a GPU, whose hardware decoder takes only baseline JPEGs). A
file's *content* decides, never its name:

* **verbatim** (bytes unchanged): a *baseline RGB-decodable JPEG*, i.e. bytes that start with
  SOI (``FF D8``) whose first frame header is SOF0 (baseline DCT) or SOF1 (extended sequential
  DCT, Huffman-coded) with 8-bit samples and either 1 component (grayscale) or 3 components
  coded as YCbCr (not RGB: no Adobe APP14 marker with ``transform=0`` and component ids other
  than ``'R','G','B'``), whose headers PIL reads and that the libjpeg-turbo of
  ``decode.libraries`` decodes completely (see *check* below). Rules from ITU-T T.81 (JPEG)
  table B.1 and libjpeg's colour-space heuristic (``jdapimin.c``).
* **re-encoded** to a baseline RGB JPEG (PIL, quality :data:`REENCODE_QUALITY`): every other
  image that PIL decodes completely (or ``decode.libraries``, for formats this PIL build
  lacks, such as WebP in a Pillow-SIMD built without libwebp): progressive (SOF2), lossless or
  hierarchical, arithmetic-coded (SOF9-SOF15), 4-component (CMYK/YCCK) or RGB-coded JPEGs, and
  every other format (PNG, GIF, WebP, BMP, TIFF, ...) whatever the file's extension. Pixels are
  taken as PIL decodes them: the first frame of an animation, alpha dropped (as
  ``decode_image(mode=RGB)`` does), 16-bit samples scaled to 8 bits, EXIF orientation not
  applied (no decoder here applies it). With a cap (``--max-side``, :mod:`formats.cap`), a
  baseline JPEG larger than the cap is re-encoded too, scaled down to it, and every
  re-encoding is scaled down to it and uses its ``--quality``.
* **not an image** (skipped): empty files, files the acceptance rule refuses from their header
  before anything is decoded (``decode.acceptance``, the loaders' own rule: more pixels than
  ``--max-image-pixels``, "too large to decode safely", or a frame the file is too short to
  hold, "damaged header"), files neither PIL nor ``decode.libraries`` can identify (text,
  HTML, random bytes) and images that do not decode completely (a truncated JPEG that PIL
  would only load with ``ImageFile.LOAD_TRUNCATED_IMAGES``, or that libjpeg-turbo calls
  incomplete). An image that decodes while libjpeg warns about its data (``Corrupt JPEG data:
  ...``, caught: ``decode.messages``) is kept, as the loaders keep it, and :attr:`Checked.
  warning` says so for the converter to name it once.

How completely a verbatim JPEG is decoded is the *check* (:data:`CHECKS`):

* ``"full"`` (the default): decoded completely once, by the libjpeg-turbo of
  ``decode.libraries`` (what the loaders use: TorchCodec, else torchvision), after PIL has
  read its headers (``Image.open``: format, size, decompression-bomb limit). The decode is
  ``decode_jpeg_luma``: every marker read and every block of every component entropy-decoded,
  as the loaders' RGB ``decode_jpeg`` does, so it refuses exactly the same bytes (its docstring
  says why; ``tests/decode/test_libraries.py`` compares both), but without the chroma inverse DCT,
  upsampling and colour conversion, which cannot fail (18% less CPU). PIL's own complete
  decode of the same libjpeg-turbo stream used to run as well and doubled the cost; on 659
  damaged variants of real ImageNet JPEGs (truncations, byte flips, zeroed runs) it never
  rejected a file that ``decode_jpeg`` accepted, while ``decode_jpeg`` rejected 3 that PIL
  accepted (see ``tests/formats/test_folder2lmdb_check.py``). Every other image is decoded completely
  by PIL, which its re-encoding needs anyway.
* ``"header"``: a verbatim JPEG whose markers parse and whose last bytes are EOI (``FF D9``)
  is stored without decoding its entropy-coded data; one without the EOI at its end (the mark
  of a truncated file, or trailing bytes) is decoded completely as under ``"full"``. It
  misses damage inside the compressed data (flipped bytes, a stray marker), which a loader
  then meets as a decode error.

:data:`RULES_VERSION` is part of the converter's resume fingerprint: bump it when these rules
or the re-encoding settings change, so that an interrupted conversion is not resumed under
different rules.
"""
from __future__ import annotations

import dataclasses
import io
import struct
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from decode.acceptance import MAX_PIXELS, Refused, check as accept
from decode.messages import run_captured
from formats.sources import Source, read_source

REENCODE_QUALITY = 95
# Files per task of check_files: a thread-pool Future per file (its Condition, lock and GIL
# hand-offs) cost the converter about 3% of its rate on 2 cores (8,000 real JPEGs, fresh
# processes alternating, chunks of 2, 8 and 32 files against one per file).
TASK_FILES = 8
RULES_VERSION = 3  # 3: decode.acceptance first; 2: one complete decode of a verbatim JPEG
CHECKS = ("full", "header")  # how completely a verbatim JPEG is decoded (module docstring)

_SOI = b"\xff\xd8"
_EOI = b"\xff\xd9"
# Frame markers SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC), which share the range.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_VERBATIM_SOF = {0xC0: "baseline", 0xC1: "extended sequential"}
_SOF_NAMES = {0xC2: "progressive", 0xC3: "lossless", 0xC5: "hierarchical", 0xC6: "hierarchical",
              0xC7: "hierarchical", 0xC9: "arithmetic-coded", 0xCA: "arithmetic-coded",
              0xCB: "arithmetic-coded", 0xCD: "arithmetic-coded", 0xCE: "arithmetic-coded",
              0xCF: "arithmetic-coded"}
_STANDALONE = frozenset(range(0xD0, 0xD8)) | {0x01}  # RSTn and TEM carry no length field


class NotAnImage(Exception):
    """The bytes are not a completely decodable image; ``str(exc)`` is the one-line reason."""


@dataclass(frozen=True)
class JpegHeader:
    """What the JPEG markers before the first scan say (ITU-T T.81 B.2.2)."""

    sof: int                       # frame marker, 0xC0 = SOF0 ...
    precision: int                 # bits per sample
    component_ids: tuple[int, ...]
    adobe_transform: int | None    # APP14 "Adobe" colour transform flag, None if absent


def parse_jpeg_header(data: bytes) -> JpegHeader | None:
    """The frame header of JPEG ``data``, or None if ``data`` is not a JPEG or has no frame
    header before its first scan (truncated or malformed). Reads only the marker segments."""
    if not data.startswith(_SOI):
        return None
    pos, adobe = 2, None
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte before a marker
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        (length,) = struct.unpack_from(">H", data, pos + 2)
        segment = data[pos + 4:pos + 2 + length]
        if length < 2 or len(segment) != length - 2:
            return None
        if marker == 0xEE and segment.startswith(b"Adobe") and len(segment) >= 12:
            adobe = segment[11]
        elif marker in _SOF_MARKERS:
            if len(segment) < 6:
                return None
            precision, count = segment[0], segment[5]
            ids = tuple(segment[6 + 3 * i] for i in range(count) if 6 + 3 * i < len(segment))
            return JpegHeader(marker, precision, ids, adobe)
        elif marker in (0xDA, 0xD9):  # a scan or the end before any frame header
            return None
        pos += 2 + length
    return None


def reencode_reason(data: bytes) -> str | None:
    """None if ``data`` is a baseline RGB-decodable JPEG by its headers (see the module
    docstring; whether it decodes completely is checked separately), else why it must be
    re-encoded, e.g. ``"progressive JPEG"``, ``"CMYK JPEG"`` or ``"not a JPEG"``."""
    header = parse_jpeg_header(data)
    if header is None:
        return "not a JPEG"
    if header.sof not in _VERBATIM_SOF:
        return f"{_SOF_NAMES.get(header.sof, 'unusual')} JPEG"
    if header.precision != 8:
        return f"{header.precision}-bit JPEG"
    if len(header.component_ids) == 1:
        return None
    if len(header.component_ids) == 3:
        if header.adobe_transform == 0 or header.component_ids == (82, 71, 66):
            return "RGB-coded JPEG"
        return None
    if len(header.component_ids) == 4:
        return "CMYK JPEG" if header.adobe_transform in (None, 0) else "YCCK JPEG"
    return f"{len(header.component_ids)}-component JPEG"


@dataclass(frozen=True)
class Checked:
    """A file accepted for the database: the bytes to store and, if re-encoded, why; with a
    raw-pixel share (:mod:`formats.raw_share`), ``raw``: its raw record where it is a candidate
    (else None), and ``pixels``: its stored size in pixels (0 where not looked at);
    ``warning``: what libjpeg printed about its data while it was checked, if anything (kept,
    as the loaders keep it)."""

    data: bytes
    reencoded: str | None = None
    raw: bytes | None = None
    pixels: int = 0
    warning: str | None = None


def check_image(data: bytes, check: str = "full", cap=None,
                max_pixels: int = MAX_PIXELS) -> Checked:
    """Decide what to store for a file's bytes (rules and ``check`` in the module docstring;
    ``cap``: a :class:`formats.cap.Cap`, None for none; ``max_pixels``: the acceptance rule's
    pixel limit, ``--max-image-pixels``, 0 for none).

    Returns the bytes unchanged for a baseline RGB-decodable JPEG within the cap (unless
    ``cap.every``: ``--reencode-all``), else a deterministic RGB JPEG re-encoding
    (:func:`reencode`), scaled down to the cap. Raises
    :class:`NotAnImage` with the reason if the bytes are not a completely decodable image
    (under ``check="header"``: if their headers or a complete decode say so), ValueError for a
    ``check`` not in :data:`CHECKS`. Decoding is CPU work that releases the GIL (PIL and
    libjpeg-turbo), so callers run this in threads.
    """
    if check not in CHECKS:
        raise ValueError(f"check must be one of {', '.join(CHECKS)}, not {check!r}")
    if not data:
        raise NotAnImage("empty file")
    try:
        accept(data, max_pixels)  # the loaders' rule, from the header: nothing decoded yet
    except Refused as exc:
        raise NotAnImage(str(exc)) from None
    checked, lines = run_captured(lambda: _checked(data, check, cap))
    return dataclasses.replace(checked, warning="; ".join(lines)) if lines else checked


def _checked(data: bytes, check: str, cap) -> Checked:
    """:func:`check_image` once the acceptance rule passed ``data``."""
    reason = reencode_reason(data)
    if reason is None:
        size = _identify(data)  # PIL must read it too; the headers tell, its decode is libjpeg's
        if cap is not None and cap.exceeds(size):
            return Checked(reencode(data, cap), f"larger than --max-side {cap.max_side}")
        if cap is not None and cap.every:
            return Checked(reencode(data, cap), "--reencode-all")
        if check == "full" or not data.endswith(_EOI):
            _library_decode(data)  # libjpeg-turbo must read it all (it is what loaders use)
        return Checked(data)
    return Checked(reencode(data, cap), reencoded=reason)


def _identify(data: bytes) -> tuple[int, int]:
    """PIL reads the headers of ``data`` (format, size, decompression-bomb limit) without
    decoding the pixels: about 20 us against 1 ms for a complete decode. Returns the size
    (width, height). Raises NotAnImage."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.size
    except Image.DecompressionBombError as exc:
        raise NotAnImage(f"too large to decode safely ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError...
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise NotAnImage(f"not a decodable image: {message}") from None


def reencode(data: bytes, cap=None) -> bytes:
    """The baseline RGB JPEG (quality :data:`REENCODE_QUALITY`, or ``cap.quality``; scaled
    down to ``cap``, a :class:`formats.cap.Cap`) that ``check_image`` stores for a file it
    re-encodes: same library, same bytes. Raises :class:`NotAnImage`."""
    image = _decode(data)
    if cap is None:
        return _encode_rgb(image)
    return _encode_rgb(cap.apply(image), cap.quality)


def _decode(data: bytes):
    """``data`` decoded completely to a PIL image: by PIL, or by ``decode.libraries`` for the
    formats this PIL build cannot read (Pillow-SIMD is often built without WebP). Raises
    NotAnImage."""
    from PIL import Image, ImageFile

    # A truncated file must fail rather than load grey-padded: LOAD_TRUNCATED_IMAGES is a
    # process-wide switch that some code sets; refuse to decide under it.
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise RuntimeError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set; truncated images "
                           "would pass as valid")
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
        return image
    except Image.UnidentifiedImageError:
        pass  # maybe a format only decode.libraries reads; below
    except Image.DecompressionBombError as exc:
        raise NotAnImage(f"too large to decode safely ({exc})") from None
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError, struct.error...
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise NotAnImage(f"not a decodable image: {message}") from None
    from decode.libraries import decode_image, decoder_key

    try:
        pixels = decode_image(data)
    except RuntimeError:
        raise NotAnImage(f"not an image format PIL or {decoder_key()} knows") from None
    return Image.fromarray(pixels.permute(1, 2, 0).contiguous().numpy(), "RGB")


def _library_decode(data: bytes) -> None:
    from decode.libraries import decode_jpeg_luma

    try:
        decode_jpeg_luma(data)  # refuses exactly what decode_jpeg refuses, 18% cheaper
    except RuntimeError as exc:  # one line already (decode.libraries)
        raise NotAnImage(f"not a decodable image: libjpeg-turbo: {exc}") from None


def _encode_rgb(image, quality: int = REENCODE_QUALITY) -> bytes:
    import numpy as np
    from PIL import Image

    if image.mode == "I" or image.mode.startswith("I;16"):
        # 16-bit samples (PNG): convert("RGB") would clip them; scale to 8 bits.
        pixels = np.asarray(image.convert("I"), dtype=np.int64) >> 8
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "L")
    elif image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")  # the palette-transparency path PIL asks for
    out = io.BytesIO()
    image.convert("RGB").save(out, format="JPEG", quality=quality, optimize=False,
                              progressive=False)
    return out.getvalue()


def check_file(source: str | Source, check: str = "full", cap=None,
               max_pixels: int = MAX_PIXELS) -> Checked | str:
    """:func:`check_image` of the file at ``source`` (a path, or a :class:`Source`, whose bytes
    may lie inside an archive) under ``check``, ``cap`` and ``max_pixels``; instead of raising,
    the reason (str) why the file is skipped (unreadable or not an image)."""
    try:
        if isinstance(source, Source):
            data = read_source(source)
        else:
            with open(source, "rb") as f:
                data = f.read()
    except OSError as exc:
        return f"cannot read: {exc.strerror or exc}"
    try:
        return check_image(data, check, cap, max_pixels)
    except NotAnImage as exc:
        return str(exc)


def check_files(paths: Sequence[str | Source], workers: int, check: str = "full",
                ahead: int = 128, cap=None, post=None,
                max_pixels: int = MAX_PIXELS) -> Iterator[Checked | str]:
    """:func:`check_file` of each of ``paths`` under ``check``, ``cap`` and ``max_pixels``,
    yielded in the order of ``paths``, computed by ``workers`` threads in tasks of
    :data:`TASK_FILES` files, at most ``ahead`` files ahead of the consumer (each holds its
    bytes until consumed); ``post``, if given, maps each :class:`Checked` in the same threads
    (the raw share's decode). Closing the generator cancels what has not started and waits for
    what has."""
    def task(first: int) -> list[Checked | str]:
        found = [check_file(path, check, cap, max_pixels)
                 for path in paths[first:first + TASK_FILES]]
        if post is None:
            return found
        return [c if isinstance(c, str) else post(c) for c in found]

    pool, window, following = ThreadPoolExecutor(max(1, workers)), deque(), 0
    try:
        while following < len(paths) or window:
            while following < len(paths) and len(window) * TASK_FILES < max(ahead, TASK_FILES):
                window.append(pool.submit(task, following))
                following += TASK_FILES
            yield from window.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
