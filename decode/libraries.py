"""The whole-image decoder library of the process, chosen once (docs/loaders.md#image-decoders):
TorchCodec (>= 0.16) where it decodes a probe JPEG, else torchvision.io, else PIL (identical
pixels); ``IMAGENET_FAST_DECODER`` forces one. TorchCodec always applies EXIF orientation, so it
gets JPEGs without APP1 and PNGs without eXIf (WebP, AVIF, HEIC come out oriented)."""
from __future__ import annotations

import importlib
import io
import os
import struct
import warnings
import zlib
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable

import PIL
import torch
from PIL import Image

from .headers import JPEG_MAGIC, PNG_MAGIC, jpeg_segments, png_chunks, probe_jpeg
from .messages import not_an_image

ENV_VAR = "IMAGENET_FAST_DECODER"
# else nvImageCodec prints two lines per JPEG it declines; the loaders report such samples
os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")
# What PIL raises for bytes it does not decode (all seen in tests/decode/test_fuzz.py)
PIL_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, struct.error,
              Image.DecompressionBombError)


@dataclass(frozen=True)
class _Backend:
    """A decoder library: ``key``, ``name`` with its version, ``decode(bytes, kind)`` with kind
    ``"jpeg"``, ``"image"`` or ``"luma"`` (a JPEG's grayscale)."""

    key: str
    name: str
    decode: Callable[[bytes, str], torch.Tensor]


def _torchcodec() -> _Backend:
    from torchcodec import decoders

    def call(data: bytes, kind: str) -> torch.Tensor:
        decode = decoders.decode_image if kind == "image" else decoders.decode_jpeg
        return decode(_tensor(_without_exif(data)), mode="GRAY" if kind == "luma" else "RGB")
    return _Backend("torchcodec", f"TorchCodec {_version('torchcodec')}", call)


def _torchvision() -> _Backend:
    from torchvision.io import ImageReadMode, decode_image, decode_jpeg

    def call(data: bytes, kind: str) -> torch.Tensor:
        if kind == "image" and data[:8] == PNG_MAGIC:
            # its PNG decoder dies (SIGSEGV) on libpng errors: PIL raises instead
            _check_png_chunks(data)
            _pil(data, kind)
        with warnings.catch_warnings():  # without 0.29's warning on every image
            warnings.filterwarnings("ignore", "The image decoding", DeprecationWarning)
            return (decode_image if kind == "image" else decode_jpeg)(
                _tensor(data), mode=ImageReadMode.GRAY if kind == "luma" else ImageReadMode.RGB)
    return _Backend("torchvision", f"torchvision {_version('torchvision')}", call)


def _check_png_chunks(data: bytes) -> None:
    """Raise ``RuntimeError`` unless every PNG chunk up to IEND is whole with a right CRC-32."""
    for kind, pos, end in png_chunks(data):
        if end > len(data):
            raise RuntimeError(f"PNG chunk {kind!r}: truncated")
        if zlib.crc32(data[pos + 4:end - 4]) != int.from_bytes(data[end - 4:end], "big"):
            raise RuntimeError(f"PNG chunk {kind!r}: CRC error")
        if kind == b"IEND":
            return
    raise RuntimeError("PNG: no IEND chunk (truncated)")


def pil_decode(data: bytes, luma: bool = False) -> torch.Tensor:
    """PIL's uint8 RGB ``(3, H, W)`` (``luma``: ``(1, H, W)``). Raises one line naming no object:
    ``PIL.UnidentifiedImageError`` (:func:`decode.messages.not_an_image`), else ``OSError``."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            if luma and img.format == "JPEG" and img.mode != "L":
                img.draft("L", img.size)  # libjpeg's grayscale output, full size
            out = img.convert("L" if luma else "RGB")
    except Image.UnidentifiedImageError:  # its text names the BytesIO object, not the bytes
        raise Image.UnidentifiedImageError(not_an_image(data)) from None
    except OSError:
        raise
    except PIL_ERRORS as exc:
        raise OSError(f"{type(exc).__name__}: {exc}".split(" <_io.BytesIO")[0]) from None
    return torch.frombuffer(bytearray(out.tobytes()), dtype=torch.uint8).view(
        out.height, out.width, 1 if luma else 3).permute(2, 0, 1)


def _pil(data: bytes, kind: str) -> torch.Tensor:
    try:
        return pil_decode(data, kind == "luma")
    except OSError as exc:
        raise RuntimeError(f"PIL: {exc}") from None


class OptionalLibrary:
    """A library the window decoders use where present: ``get()``, it or None (``reason``: why),
    by ``load() -> (library, None) | (None, why)`` once per process, never under
    ``IMAGENET_FAST_FULL_DECODE=1``; ``set_enabled`` loads it again or turns it off."""

    def __init__(self, load: Callable[[], tuple[Any, str | None]]):
        self._load, self._loaded, self._library = load, False, None
        self.reason: str | None = None

    def get(self):
        if not self._loaded:
            self._loaded = True
            self._library, self.reason = (
                (None, "IMAGENET_FAST_FULL_DECODE=1")
                if os.environ.get("IMAGENET_FAST_FULL_DECODE") == "1" else self._load())
        return self._library

    def available(self) -> bool:
        return self.get() is not None

    def set_enabled(self, enabled: bool) -> None:
        self._loaded, self._library, self.reason = not enabled, None, "turned off in this process"
        self.get()


def _import_nvimgcodec():
    try:
        return importlib.import_module("nvidia.nvimgcodec"), None
    except Exception as exc:  # noqa: BLE001 - ImportError, or its native libraries
        return None, f"nvImageCodec not usable ({type(exc).__name__}: {exc})"


# nvImageCodec's module, imported once per process: the window decoders' and the header parse's
NVIMGCODEC = OptionalLibrary(_import_nvimgcodec)
_FACTORIES = {"torchcodec": _torchcodec, "torchvision": _torchvision,
              "PIL": lambda: _Backend("PIL", image_library(), _pil)}
_backend: _Backend | None = None
_skipped: dict[str, str] = {}  # key -> why it was not chosen


def _version(dist: str) -> str:
    """``dist``'s version without a local part ("0.17.0+cu130" -> "0.17.0"), "?" if absent."""
    try:
        return metadata.version(dist).split("+")[0]
    except metadata.PackageNotFoundError:
        return "?"


def _load(key: str) -> tuple[_Backend | None, str]:
    """``(backend, "")`` once it decoded a probe JPEG, else ``(None, what stopped it)``."""
    try:
        backend = _FACTORIES[key]()
        out = backend.decode(probe_jpeg(), "jpeg")
        if tuple(out.shape) != (3, 48, 64) or out.dtype != torch.uint8:
            raise RuntimeError(f"probe JPEG decoded to {tuple(out.shape)} {out.dtype}")
    except Exception as exc:  # noqa: BLE001 - any failure means: not usable here
        return None, _one_line(exc)
    return backend, ""


def _current() -> _Backend | None:
    """The backend, chosen on first call: ``$IMAGENET_FAST_DECODER``'s, else the first usable."""
    global _backend
    if _backend is None:
        forced = os.environ.get(ENV_VAR, "").strip()
        if forced and forced not in _FACTORIES:
            _skipped[forced] = f"unknown {ENV_VAR} (choose from {', '.join(_FACTORIES)})"
        for key in sorted(_FACTORIES, key=lambda key: key != forced):  # the forced one first
            _backend, why = _load(key)
            if _backend is not None:
                break
            _skipped[key] = why
    return _backend


def backends() -> list[str]:
    """Keys of the decoder libraries usable in this process, each probed."""
    return [key for key in _FACTORIES if _load(key)[0] is not None]


def use(key: str) -> str:
    """Switch this process to backend ``key`` and return the previous key (forked workers inherit
    it). Raises ``ValueError`` if unknown, ``RuntimeError`` if not usable."""
    global _backend
    if key not in _FACTORIES:
        raise ValueError(f"unknown decoder {key!r} (choose from {', '.join(_FACTORIES)})")
    previous = getattr(_current(), "key", "")
    backend, why = _load(key)
    if backend is None:
        raise RuntimeError(f"decoder {key} is not usable here: {why}")
    _backend = backend
    return previous


def decoder_key() -> str:
    """``"torchcodec"``, ``"torchvision"``, ``"PIL"`` or ``"none"``: the decoder in use."""
    return getattr(_current(), "key", "none")


def decoder_name() -> str:
    """The whole-image decoder for the log, with why preferred ones were passed over."""
    key, name = getattr(_current(), "key", None), getattr(_current(), "name", "none")
    passed = [f"{other}: {why}" for other, why in _skipped.items() if other != key]
    return f"{name} ({'; '.join(passed)})" if passed else name


def _tensor(data: bytes) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only buffer: decoders only read it
        return torch.frombuffer(data, dtype=torch.uint8)


def _decode(data, kind: str) -> torch.Tensor:
    """The ``kind`` decode of ``data``, uint8 ``(C, H, W)``; raises ``RuntimeError`` (one line)."""
    backend = _current()
    if backend is None:
        raise RuntimeError(f"no image decoder usable here ({'; '.join(_skipped.values())})")
    buffer = data.numpy().tobytes() if isinstance(data, torch.Tensor) else bytes(data)
    try:
        out = backend.decode(buffer, kind)
    except (RuntimeError, ValueError) as exc:
        raise RuntimeError(_one_line(exc)) from None
    if out.dim() == 4:  # the first frame
        out = out[0]
    if out.dtype != torch.uint8:  # 16-bit scaled by round(v / 257), as TorchCodec does
        out = (out.to(torch.float32) / 257).round_().clamp_(0, 255).to(torch.uint8)
    return out


def decode_jpeg(data) -> torch.Tensor:
    """A JPEG (bytes-like or 1-D uint8 tensor) to RGB uint8 ``(3, H, W)``, grayscale and CMYK
    converted. Raises ``RuntimeError`` (one line) unless it decodes completely."""
    return _decode(data, "jpeg")


def decode_jpeg_luma(data) -> torch.Tensor:
    """A JPEG's luma plane, uint8 ``(1, H, W)``, in ~18% less CPU; raises ``RuntimeError`` for
    exactly what :func:`decode_jpeg` refuses (docs/formats.md#how-completely-images-are-checked)."""
    return _decode(data, "luma")


def decode_image(data) -> torch.Tensor:
    """JPEG, PNG, GIF, WebP (TorchCodec: AVIF too) to RGB uint8 ``(3, H, W)``: alpha dropped,
    16-bit scaled to 8, first frame. Raises ``RuntimeError`` (one line)."""
    return _decode(data, "image")


def _one_line(exc: BaseException) -> str:
    """The first line of ``exc`` without torch ops' ``function, file.cpp:line,`` prefix."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    parts = text.split(", ", 2)
    return parts[2] if len(parts) == 3 and ".cpp:" in parts[1] else text


def _without_exif(data: bytes) -> bytes:
    """``data`` without a JPEG's APP1 segments or a PNG's eXIf chunks (the walk: ~5 us)."""
    if data[:3] == JPEG_MAGIC:
        spans = [(pos, end) for marker, pos, end in jpeg_segments(data) if marker == 0xE1]
    elif data[:8] == PNG_MAGIC:
        spans = [(pos, end) for kind, pos, end in png_chunks(data) if kind == b"eXIf"]
    else:
        return data
    kept = zip([0] + [end for _, end in spans], [begin for begin, _ in spans] + [len(data)])
    return b"".join(data[start:stop] for start, stop in kept)


def image_library() -> str:
    """The installed PIL distribution and version, e.g. ``"Pillow-SIMD 9.5.0.post2"``."""
    return next((f"{dist} {_version(dist)}" for dist in ("Pillow-SIMD", "Pillow")
                 if _version(dist) != "?"), f"PIL {PIL.__version__}")
