"""The one place that picks the image decoders for the loaders, the image checks and benchmarks.

Whole images: TorchCodec's CPU decoders (``torchcodec.decoders``, >= 0.16: JPEG through its own
libjpeg-turbo, PNG, WebP, GIF, AVIF; images need no FFmpeg, the wheel bundles these libraries)
where it imports and decodes a probe JPEG, else torchvision.io's (deprecated since torchvision
0.29, kept for environments without TorchCodec: NGC images, older torch), else PIL.
``IMAGENET_FAST_DECODER=torchcodec|torchvision|PIL`` forces one. Measured on the real sample,
one thread (``benchmarks/profile_decoders.py``, docs/performance.md): TorchCodec 0.983 and
torchvision 0.978 ms CPU per JPEG (median of 9 interleaved rounds; which is ahead changes from
run to run), PIL 1.241 ms, all to identical pixels; TorchCodec is the default because
torchvision's decoders are deprecated and will be removed.

Pixels are as stored: torchvision, PIL, DALI (``adjust_orientation=False``) and the crop-window
decoder (``decode.jpeg_window``) ignore EXIF orientation, TorchCodec always applies it. So the
APP1 (EXIF/XMP) segments of a JPEG and the eXIf chunks of a PNG are cut from the bytes handed to
TorchCodec (decoding ignores both, so pixels do not change); WebP, AVIF and HEIC files with an
EXIF orientation still come out oriented under TorchCodec (ImageNet has none).

Crop windows of JPEGs (RandomResizedCrop) are decoded by ``decode.jpeg_window`` and
``decode.jpeg_scaled``; the cascade over all of them is the ``decode`` package's. The converters'
checks use :func:`decode_jpeg_luma`, the same library's luma-only decode, which refuses the same
bytes.
"""
from __future__ import annotations

import io
import os
import warnings
from dataclasses import dataclass
from importlib import metadata
from typing import Callable

import torch

ENV_VAR = "IMAGENET_FAST_DECODER"
_JPEG_MAGIC = b"\xff\xd8\xff"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Markers without a length field (ITU-T T.81 B.1.1.3): RST0-7, SOI, EOI, TEM.
_STANDALONE = frozenset(range(0xD0, 0xD8)) | {0x01, 0xD8}
# torchvision 0.29 warns on every call of its decoders (torchvision/io/image.py).
_TORCHVISION_DEPRECATION = ("The image decoding and encoding capabilities of TorchVision are "
                            "deprecated")


@dataclass(frozen=True)
class _Backend:
    """A decoder library: ``jpeg`` / ``image`` map a 1-D uint8 tensor of encoded bytes to RGB,
    ``luma`` a JPEG's to its luma plane (see :func:`decode_jpeg_luma`); ``prepare`` maps the
    encoded bytes to those handed over."""

    key: str  # "torchcodec", "torchvision" or "PIL"
    name: str  # with its version, for the log
    jpeg: Callable[[torch.Tensor], torch.Tensor]
    image: Callable[[torch.Tensor], torch.Tensor]
    luma: Callable[[torch.Tensor], torch.Tensor]
    prepare: Callable[[bytes], bytes] = lambda data: data


def _torchcodec() -> _Backend:
    from torchcodec import decoders

    def image(t: torch.Tensor) -> torch.Tensor:
        try:
            return decoders.decode_image(t, mode="RGB")
        except ValueError as exc:  # "Unsupported or unrecognized image format"
            raise RuntimeError(str(exc)) from None

    return _Backend("torchcodec", f"TorchCodec {_version('torchcodec')}",
                    lambda t: decoders.decode_jpeg(t, mode="RGB"), image,
                    lambda t: decoders.decode_jpeg(t, mode="GRAY"), _without_exif)


def _torchvision() -> _Backend:
    from torchvision.io import ImageReadMode, decode_image, decode_jpeg

    def quiet(decode, mode=ImageReadMode.RGB):
        def call(t: torch.Tensor) -> torch.Tensor:
            # torchvision 0.29 warns on every call; here it is the chosen fallback, and the
            # warning would repeat for every image (scoped: other warnings still show).
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", _TORCHVISION_DEPRECATION, DeprecationWarning)
                return decode(t, mode=mode)
        return call

    any_image = quiet(decode_image)

    def image(t: torch.Tensor) -> torch.Tensor:
        # torchvision 0.29's PNG decoder kills the process (SIGSEGV) when libpng reports an
        # error (a bad CRC, a corrupt IDAT: found by tests/decode/test_fuzz.py): the chunks'
        # CRCs are checked here and PIL decodes the PNG first, raising instead (PIL does not
        # check IDAT's CRC). The pixels stay torchvision's.
        data = bytes(t.numpy())
        if data[:8] == _PNG_MAGIC:
            _check_png_chunks(data)
            _pil_decode(t)
        return any_image(t)

    return _Backend("torchvision", f"torchvision {_version('torchvision')}", quiet(decode_jpeg),
                    image, quiet(decode_jpeg, ImageReadMode.GRAY))


def _check_png_chunks(data: bytes) -> None:
    """Raise ``RuntimeError`` (one line) unless every chunk of the PNG ``data`` up to IEND is
    whole and its CRC-32 (ISO 3309, over type and data) matches, as libpng requires."""
    import zlib

    pos = 8
    while pos + 12 <= len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        end = pos + 12 + length
        kind = data[pos + 4:pos + 8]
        if end > len(data):
            raise RuntimeError(f"PNG chunk {kind!r}: truncated")
        if zlib.crc32(data[pos + 4:end - 4]) != int.from_bytes(data[end - 4:end], "big"):
            raise RuntimeError(f"PNG chunk {kind!r}: CRC error")
        if kind == b"IEND":
            return
        pos = end
    raise RuntimeError("PNG: no IEND chunk (truncated)")


def _pil_decode(t: torch.Tensor, luma: bool = False) -> torch.Tensor:
    """PIL's decode of the encoded bytes in ``t``: RGB (or with ``luma`` the luma plane) uint8
    ``(C, H, W)``. Raises ``RuntimeError`` (one line) for bytes PIL does not decode."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(t.numpy().tobytes())) as img:
            if luma and img.format == "JPEG" and img.mode != "L":
                img.draft("L", img.size)  # libjpeg's grayscale output, full size
            out = img.convert("L" if luma else "RGB")
    except pil_errors() as exc:
        # "cannot identify image file <_io.BytesIO object at 0x...>": no address in logs
        raise RuntimeError(f"PIL: {str(exc).split(' <_io.BytesIO')[0]}") from None
    channels = 1 if luma else 3
    return torch.frombuffer(bytearray(out.tobytes()), dtype=torch.uint8).view(
        out.height, out.width, channels).permute(2, 0, 1)


def pil_errors() -> tuple[type[BaseException], ...]:
    """What PIL raises for bytes it does not decode: ``OSError`` (``UnidentifiedImageError``,
    truncated data), ``SyntaxError`` (a broken PNG chunk), ``ValueError``, ``EOFError``,
    ``IndexError``, ``struct.error`` and its ``DecompressionBombError`` (found on damaged
    images by tests/decode/test_fuzz.py)."""
    import struct

    from PIL import Image

    return (OSError, SyntaxError, ValueError, EOFError, IndexError, struct.error,
            Image.DecompressionBombError)


def _pil() -> _Backend:
    simd = _version("Pillow-SIMD")
    name = f"Pillow-SIMD {simd}" if simd != "?" else f"Pillow {_version('Pillow')}"
    return _Backend("PIL", name, _pil_decode, _pil_decode, lambda t: _pil_decode(t, luma=True))


_FACTORIES = {"torchcodec": _torchcodec, "torchvision": _torchvision, "PIL": _pil}
_backend: _Backend | None = None
_skipped: dict[str, str] = {}  # key -> why it was not chosen


def _version(dist: str) -> str:
    try:
        return metadata.version(dist).split("+")[0]  # "0.17.0+cu130" -> "0.17.0"
    except metadata.PackageNotFoundError:
        return "?"


def _load(key: str) -> _Backend:
    """Import backend ``key`` and decode an 8 x 8 JPEG made by PIL with it; raises whatever
    stops it (ImportError, OSError for a wheel built for another torch, RuntimeError)."""
    from PIL import Image

    backend = _FACTORIES[key]()
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 100, 50)).save(buffer, "JPEG")
    out = backend.jpeg(_tensor(buffer.getvalue()))
    if tuple(out.shape) != (3, 8, 8) or out.dtype != torch.uint8:
        raise RuntimeError(f"probe JPEG decoded to {tuple(out.shape)} {out.dtype}")
    return backend


def _current() -> _Backend | None:
    """The chosen backend: ``$IMAGENET_FAST_DECODER`` if set and usable, else the first of
    TorchCodec, torchvision, PIL that loads (chosen once per process)."""
    global _backend
    if _backend is None:
        forced = os.environ.get(ENV_VAR, "").strip()
        order = list(_FACTORIES)
        if forced in _FACTORIES:
            order.insert(0, order.pop(order.index(forced)))
        elif forced:
            _skipped[forced] = f"unknown {ENV_VAR} (choose from {', '.join(_FACTORIES)})"
        for key in order:
            try:
                _backend = _load(key)
                break
            except Exception as exc:  # noqa: BLE001 - any failure means: not usable here
                _skipped[key] = _one_line(exc) if str(exc).strip() else type(exc).__name__
    return _backend


def backends() -> list[str]:
    """Keys of the decoder libraries usable in this process, e.g. ``["torchcodec",
    "torchvision", "PIL"]`` (each loaded and probed; for tests and benchmarks)."""
    usable = []
    for key in _FACTORIES:
        try:
            _load(key)
            usable.append(key)
        except Exception:  # noqa: BLE001 - not usable here, whatever the reason
            pass
    return usable


def use(key: str) -> str:
    """Switch this process to backend ``key`` (``"torchcodec"``, ``"torchvision"``, ``"PIL"``);
    returns the previous key. Raises ``ValueError`` if unknown, ``RuntimeError`` if not usable
    here. DataLoader workers started later by fork inherit it; spawned ones do not."""
    global _backend
    if key not in _FACTORIES:
        raise ValueError(f"unknown decoder {key!r} (choose from {', '.join(_FACTORIES)})")
    previous = _current().key if _current() is not None else ""
    try:
        _backend = _load(key)
    except Exception as exc:  # noqa: BLE001
        raise RuntimeError(f"decoder {key} is not usable here: {_one_line(exc)}") from None
    return previous


def decoder_key() -> str:
    """``"torchcodec"``, ``"torchvision"`` or ``"PIL"``: the whole-image decoder in use."""
    backend = _current()
    return backend.key if backend is not None else "none"


def decoder_name() -> str:
    """One phrase for the start-up log: the whole-image decoder, and why any preferred to it
    was passed over, e.g. ``"TorchCodec 0.17.0"`` or ``"torchvision 0.29.2 (torchcodec: No
    module named 'torchcodec')"``."""
    backend = _current()
    passed = [f"{key}: {why}" for key, why in _skipped.items()
              if backend is None or key != backend.key]
    text = backend.name if backend is not None else "none"
    return f"{text} ({'; '.join(passed)})" if passed else text


def _tensor(data) -> torch.Tensor:
    if isinstance(data, torch.Tensor):
        return data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only buffer: decoders only read it
        return torch.frombuffer(data, dtype=torch.uint8)


def _as_bytes(data) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, torch.Tensor):
        return data.numpy().tobytes()
    return bytes(data)


def _uint8_frame(image: torch.Tensor) -> torch.Tensor:
    """uint8 ``(C, H, W)`` (3 channels, or 1 for luma) from a decoder's output: the first
    frame of an animation, 16-bit samples scaled to 8 bits (``round(v / 257)``, as TorchCodec
    does)."""
    if image.dim() == 4:
        image = image[0]
    if image.dtype != torch.uint8:
        image = (image.to(torch.float32) / 257).round_().clamp_(0, 255).to(torch.uint8)
    return image


def _decode(data, kind: str) -> torch.Tensor:
    """``backend.<kind>`` (``"jpeg"``, ``"image"`` or ``"luma"``) of ``data``, uint8."""
    backend = _current()
    if backend is None:
        raise RuntimeError(f"no image decoder usable here ({'; '.join(_skipped.values())})")
    buffer = _as_bytes(data)
    try:
        out = getattr(backend, kind)(_tensor(backend.prepare(buffer)))
    except (RuntimeError, ValueError) as exc:
        raise RuntimeError(_one_line(exc)) from None
    return _uint8_frame(out)


def decode_jpeg(data) -> torch.Tensor:
    """A JPEG (``bytes``-like or 1-D uint8 tensor) to RGB uint8 ``(3, H, W)`` (often a
    channels-last view); grayscale and CMYK converted, EXIF orientation not applied. Raises
    ``RuntimeError`` (one line) if the bytes are not a JPEG that decodes completely."""
    return _decode(data, "jpeg")


def decode_jpeg_luma(data) -> torch.Tensor:
    """The luma (Y) plane of a JPEG (``bytes``-like or 1-D uint8 tensor): uint8 ``(1, H, W)``.
    Raises ``RuntimeError`` (one line) for exactly the bytes :func:`decode_jpeg` refuses.

    For checking, not for pixels: libjpeg-turbo, asked for grayscale output, still reads every
    marker and entropy-decodes every block of every component (its only error paths), but skips
    the chroma components' inverse DCT, chroma upsampling and colour conversion (``jdcolor.c``:
    ``component_needed = FALSE``), which cannot fail. So it refuses the same bytes as the RGB
    decode at about 18% less CPU per ImageNet JPEG (0.761 vs 0.934 ms, one thread,
    ``benchmarks/profile_decoders.py``; docs/performance.md, *Converters*);
    ``tests/decode/test_libraries.py`` compares both on damaged real JPEGs for every library."""
    return _decode(data, "luma")


def decode_image(data) -> torch.Tensor:
    """Any format the chosen library reads (JPEG, PNG, GIF, WebP; TorchCodec also AVIF) to RGB
    uint8 ``(3, H, W)``: alpha dropped, 16-bit samples scaled to 8 bits, the first frame of an
    animation. Raises ``RuntimeError`` (one line) if it cannot decode the bytes."""
    return _decode(data, "image")


def _one_line(exc: BaseException) -> str:
    """The first line of ``exc`` without the ``function, file.cpp:line,`` prefix of torch ops."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    parts = text.split(", ", 2)
    return parts[2] if len(parts) == 3 and ".cpp:" in parts[1] else text


def _without_exif(data: bytes) -> bytes:
    """``data`` without the metadata TorchCodec reads an orientation from (APP1 segments of a
    JPEG before its first scan, eXIf chunks of a PNG); other bytes, and bytes without such
    metadata, are returned as they are (no copy)."""
    # Walking the segments (a few before the first scan) costs ~5 us; `b"\xff\xe1" in data`
    # would scan the entropy-coded data too (80 us per ImageNet JPEG, 8% of a decode).
    if data[:3] == _JPEG_MAGIC:
        return _cut(data, _jpeg_app1_spans(data))
    if data[:8] == _PNG_MAGIC:
        return _cut(data, _png_exif_spans(data))
    return data


def _cut(data: bytes, spans: list[tuple[int, int]]) -> bytes:
    if not spans:
        return data
    pieces, start = [], 0
    for begin, end in spans:
        pieces.append(data[start:begin])
        start = end
    pieces.append(data[start:])
    return b"".join(pieces)


def _jpeg_app1_spans(data: bytes) -> list[tuple[int, int]]:
    """``[begin, end)`` byte spans of the APP1 marker segments before the first SOS, walking the
    marker segments as libjpeg does (T.81 B.1.1; bytes between segments skipped)."""
    spans, pos, size = [], 2, len(data)
    while pos + 4 <= size:
        if data[pos] != 0xFF:
            pos = data.find(b"\xff", pos)
            if pos < 0:
                break
            continue
        marker = data[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        if marker in (0xDA, 0xD9):  # the first scan, or the end
            break
        length = int.from_bytes(data[pos + 2:pos + 4], "big")
        if length < 2:
            break
        if marker == 0xE1:
            spans.append((pos, min(pos + 2 + length, size)))
        pos += 2 + length
    return spans


def _png_exif_spans(data: bytes) -> list[tuple[int, int]]:
    """``[begin, end)`` byte spans of the eXIf chunks of a PNG (length, type, data, CRC)."""
    spans, pos, size = [], 8, len(data)
    while pos + 12 <= size:
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind, end = data[pos + 4:pos + 8], pos + 12 + length
        if kind == b"eXIf":
            spans.append((pos, min(end, size)))
        if kind == b"IEND":
            break
        pos = end
    return spans


def image_library() -> str:
    """Name and version of the installed PIL distribution, e.g. ``"Pillow-SIMD 9.5.0.post2"``
    (PIL is the last resort of :func:`decode.decode`, and what the converters re-encode with)."""
    for dist in ("Pillow-SIMD", "Pillow"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    import PIL

    return f"PIL {PIL.__version__}"
