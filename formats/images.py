"""Which files a converter stores as they are, re-encodes or skips, by content, never by name, so
that PIL, libjpeg-turbo and DALI's nvJPEG all read every record
(docs/formats.md#kept-re-encoded-skipped).

* **verbatim**: a baseline RGB-decodable JPEG: first frame header SOF0 or SOF1, 8-bit, 1 component
  or 3 coded as YCbCr (ITU-T T.81 table B.1; libjpeg's heuristic, ``jdapimin.c``), that PIL's
  header read and a complete libjpeg-turbo decode accept (:data:`CHECKS`).
* **re-encoded** (PIL, baseline JPEG at :data:`REENCODE_QUALITY`, first frame, alpha dropped,
  16-bit scaled to 8, no EXIF orientation): every other image that decodes completely, and with a
  cap (:mod:`formats.cap`) larger JPEGs.
* **skipped**: empty files, files :mod:`decode.acceptance` refuses, non-images, and images that do
  not decode completely; one libjpeg merely warns about is kept (:attr:`Checked.warning`).

:data:`RULES_VERSION` is part of the resume fingerprint: bump it when these rules or the
re-encoding settings change."""
from __future__ import annotations

import dataclasses
import io
import re
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFile

from decode import libraries
from decode.acceptance import MAX_PIXELS, Refused, check as accept
from decode.headers import EOI, is_jpeg, jpeg_segments
from decode.messages import not_an_image, run_captured
from formats.sources import Source, read_source

REENCODE_QUALITY = 95
# Files per check_files task: a Future per file cost ~3% of the converter's rate (2 cores).
TASK_FILES = 8
RULES_VERSION = 4
CHECKS = ("full", "header")  # how completely a verbatim JPEG is decoded (module docstring)

_EOI = bytes((0xFF, EOI))
# Frame markers SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC), which share the range.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_SOF_NAMES = {0xC2: "progressive", 0xC3: "lossless",
              **dict.fromkeys((0xC5, 0xC6, 0xC7), "hierarchical"),
              **dict.fromkeys((0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF), "arithmetic-coded")}
# What may stand between two segments of a verbatim JPEG: fill bytes, RSTn and TEM (no length
# field). Bytes libjpeg skips with a warning ("extraneous bytes") make the header unparsed here.
_GAP = re.compile(rb"(?:\xff+[\xd0-\xd7\x01])*\xff*")


class NotAnImage(Exception):
    """The bytes are not a completely decodable image; ``str(exc)`` is the one-line reason."""


def reencode_reason(data: bytes) -> str | None:
    """Why ``data`` must be re-encoded (e.g. ``"CMYK JPEG"``), or None if verbatim: from its first
    frame header (ITU-T T.81 B.2.2) and APP14 "Adobe" colour transform flag, every segment whole
    and nothing but :data:`_GAP` between them."""
    if not is_jpeg(data):
        return "not a JPEG"
    at, adobe = 2, None
    for marker, begin, end in jpeg_segments(data):
        if end > len(data) or not _GAP.fullmatch(data, at, begin):
            return "not a JPEG"
        segment, at = data[begin + 4:end], end
        if marker == 0xEE and segment.startswith(b"Adobe") and len(segment) >= 12:
            adobe = segment[11]
        elif marker in _SOF_MARKERS:
            break
    else:  # a scan, the end or a broken segment before any frame header
        return "not a JPEG"
    if len(segment) < 6:
        return "not a JPEG"
    ids = tuple(segment[6 + 3 * i] for i in range(segment[5]) if 6 + 3 * i < len(segment))
    if marker not in (0xC0, 0xC1):  # baseline, extended sequential
        return f"{_SOF_NAMES.get(marker, 'unusual')} JPEG"
    if segment[0] != 8:
        return f"{segment[0]}-bit JPEG"
    if len(ids) == 3 and (adobe == 0 or ids == (82, 71, 66)):  # Adobe's or 'R', 'G', 'B'
        return "RGB-coded JPEG"
    if len(ids) == 4:
        return "CMYK JPEG" if adobe in (None, 0) else "YCCK JPEG"
    return None if len(ids) in (1, 3) else f"{len(ids)}-component JPEG"


@dataclass(frozen=True)
class Checked:
    """An accepted file: ``data`` to store, ``reencoded`` (why, or None), ``raw`` (its raw record
    if a candidate), ``pixels`` (0: not looked at), ``warning`` (libjpeg's lines, if any)."""

    data: bytes
    reencoded: str | None = None
    raw: bytes | None = None
    pixels: int = 0
    warning: str | None = None


def check_image(data: bytes, check: str = "full", cap=None,
                max_pixels: int = MAX_PIXELS) -> Checked:
    """The :class:`Checked` of a file's bytes under the module's rules, ``check``, ``cap`` (a
    :class:`formats.cap.Cap` or None) and ``max_pixels`` (0: none). Raises :class:`NotAnImage`
    with the reason, ``ValueError`` for an unknown ``check``. Releases the GIL in the decodes."""
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
    reason = reencode_reason(data)
    if reason is None:
        try:  # PIL must read its header too (~20 us); the decode checked is libjpeg's
            with Image.open(io.BytesIO(data)) as image:
                size = image.size
        except Exception as exc:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError...
            raise _pil_refusal(exc) from None
        if cap is not None and cap.exceeds(size):
            return Checked(reencode(data, cap), f"larger than --max-side {cap.max_side}")
        if cap is not None and cap.every:
            return Checked(reencode(data, cap), "--reencode-all")
        if check == "full" or not data.endswith(_EOI):
            try:  # libjpeg-turbo must read it all (the loaders' decoder); refuses exactly what
                libraries.decode_jpeg_luma(data)  # decode_jpeg refuses, 18% cheaper
            except RuntimeError as exc:  # one line already (decode.libraries)
                raise NotAnImage(f"not a decodable image: libjpeg-turbo: {exc}") from None
        return Checked(data)
    return Checked(reencode(data, cap), reencoded=reason)


def _pil_refusal(exc: Exception) -> NotAnImage:
    """PIL's refusal as one line: a decompression bomb, else PIL's first line without the object
    ``UnidentifiedImageError`` names (``<_io.BytesIO object at 0x...>``)."""
    if isinstance(exc, Image.DecompressionBombError):
        return NotAnImage(f"too large to decode safely ({exc})")
    message = str(exc).splitlines()[0].split(" <_io.BytesIO")[0] if str(exc) else \
        type(exc).__name__
    return NotAnImage(f"not a decodable image: {message}")


def reencode(data: bytes, cap=None) -> bytes:
    """The baseline RGB JPEG stored for a re-encoded file: at :data:`REENCODE_QUALITY`, or scaled
    to ``cap`` at its quality. Raises :class:`NotAnImage`."""
    image = _decode(data) if cap is None else cap.apply(_decode(data))
    if image.mode == "I" or image.mode.startswith("I;16"):
        # 16-bit samples (PNG): convert("RGB") would clip them; scale to 8 bits.
        pixels = np.asarray(image.convert("I"), dtype=np.int64) >> 8
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "L")
    elif image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")  # the palette-transparency path PIL asks for
    out = io.BytesIO()
    image.convert("RGB").save(out, format="JPEG", optimize=False, progressive=False,
                              quality=REENCODE_QUALITY if cap is None else cap.quality)
    return out.getvalue()


def _decode(data: bytes):
    """``data`` decoded completely to a PIL image, by PIL or (formats this PIL build lacks, as
    Pillow-SIMD WebP) :mod:`decode.libraries`. Raises :class:`NotAnImage`."""
    # Under the process-wide LOAD_TRUNCATED_IMAGES a truncated file would load grey-padded.
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise RuntimeError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set; truncated images "
                           "would pass as valid")
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
        return image
    except Image.UnidentifiedImageError:
        pass  # maybe a format only decode.libraries reads; below
    except Exception as exc:  # noqa: BLE001 - PIL raises OSError, SyntaxError, struct.error...
        raise _pil_refusal(exc) from None
    try:
        pixels = libraries.decode_image(data)
    except RuntimeError:
        raise NotAnImage(f"{not_an_image(data)} (neither PIL nor {libraries.decoder_key()} "
                         "reads it)") from None
    return Image.fromarray(pixels.permute(1, 2, 0).contiguous().numpy(), "RGB")


def check_file(source: str | Source, check: str = "full", cap=None,
               max_pixels: int = MAX_PIXELS) -> Checked | str:
    """:func:`check_image` of a path or :class:`Source`, or why it is skipped (str)."""
    try:
        data = read_source(source if isinstance(source, Source) else Source(source, source, -1))
    except OSError as exc:
        return f"cannot read: {exc.strerror or exc}"
    try:
        return check_image(data, check, cap, max_pixels)
    except NotAnImage as exc:
        return str(exc)


def check_files(paths: Sequence[str | Source], workers: int, check: str = "full",
                ahead: int = 128, cap=None, post=None,
                max_pixels: int = MAX_PIXELS) -> Iterator[Checked | str]:
    """:func:`check_file` of each of ``paths`` in order, by ``workers`` threads in tasks of
    :data:`TASK_FILES`, at most ``ahead`` files ahead, ``post`` mapping each :class:`Checked`.
    Closing it cancels what has not started."""
    def task(first: int) -> list[Checked | str]:
        found = [check_file(path, check, cap, max_pixels)
                 for path in paths[first:first + TASK_FILES]]
        return [c if post is None or isinstance(c, str) else post(c) for c in found]

    pool, window, following = ThreadPoolExecutor(max(1, workers)), deque(), 0
    try:
        while following < len(paths) or window:
            while following < len(paths) and len(window) * TASK_FILES < max(ahead, TASK_FILES):
                window.append(pool.submit(task, following))
                following += TASK_FILES
            yield from window.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
