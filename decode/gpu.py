"""Batches of JPEG windows decoded in the training process: nvImageCodec on the GPU (its
hardware JPEG decoder where the GPU has one, its CUDA decoder otherwise), or the same code on
nvImageCodec's CPU backend (a machine without a GPU, and the tests), or torchvision's
``decode_jpeg(device="cuda")`` where nvImageCodec is not installed.

:class:`WindowDecoder` takes a batch of encoded images and one region each (a
RandomResizedCrop window, or validation's central crop) and returns each region resized to the
output size, antialiased as the CPU loaders resize (:func:`decode.resize`). nvImageCodec
decodes only the region (``CodeStream.get_sub_code_stream(region=...)``), the whole batch in
one call (``Decoder.decode(list, params, cuda_stream)``). A raw-pixel record (``decode.raw``,
the converters' ``--raw-budget``) is not decoded: its region is cut on the host and copied to
the device. A region a decoder declines (a CMYK
or unsupported progressive JPEG, a PNG named ``.JPEG``, corrupt data) is decoded on the CPU
with the CPU loaders' whole-image decoder (:func:`decode.decode`) and counted; one that nothing
decodes is reported back to the caller with the exception (the loaders' bad-sample rules).

The hardware decoder's share of each batch is nvImageCodec's ``load_hint`` of the
``HW_GPU_ONLY`` backend, as DALI's ``hw_decoder_load`` (DALI passes its value to the same
library). Pixels are as stored (EXIF orientation not applied, ``decode.jpeg_window``'s
parameters: fancy chroma upsampling, RGB out).
"""
from __future__ import annotations

import io
import time
import warnings
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from . import jpeg_window, raw
from .messages import capture, run_captured
from .resample import resize_in_frame, resize_window

# --decode-device choices of the batch decoder: on the GPU, or nvImageCodec's CPU backend.
KINDS = ("cuda", "cpu-nvimgcodec")
# DALI 2.4's default hw_decoder_load (fn.decoders.image); loaders.pipelines.dali.environment keeps
# the per-GPU figures NVIDIA published.
DEFAULT_HW_LOAD = 0.65
# What decoders raise for bytes that are not a readable image (as loaders.pipelines.bad_samples).
DECODE_ERRORS = (OSError, RuntimeError, ValueError, KeyError)


@dataclass
class DecodedWindows:
    """One batch's outcome: ``images`` ``(N, 3, H, W)`` on the decoder's device (uint8 on the
    CPU, float32 0-255 on CUDA: resized from the decoded uint8 without rounding), in the
    order given; ``fallback``: positions decoded on the CPU because the batch decoder declined
    them; ``failed``: ``(position, exception)`` of those nothing decoded (their rows are
    zeros); ``warnings``: ``(position, lines)`` of those decoded while a native decoder printed
    a warning about their data (libjpeg's ``Corrupt JPEG data: ...``, caught:
    :mod:`decode.messages`)."""

    images: torch.Tensor
    fallback: list[int] = field(default_factory=list)
    failed: list[tuple[int, BaseException]] = field(default_factory=list)
    warnings: list[tuple[int, list[str]]] = field(default_factory=list)


class WindowDecoder:
    """Decodes a batch's regions and resizes each to ``size`` px on ``device``.

    ``kind``: ``"cuda"`` (nvImageCodec's ``HW_GPU_ONLY`` backend with ``hw_load`` of each
    batch, default :data:`DEFAULT_HW_LOAD`, and its ``GPU_ONLY`` CUDA backend for the rest
    and where the GPU has no hardware decoder; torchvision's ``decode_jpeg(device="cuda")``
    without nvImageCodec) or ``"cpu-nvimgcodec"`` (nvImageCodec's ``CPU_ONLY`` backend with
    ``threads`` threads; ``device`` must be the CPU). ``library``: nvImageCodec's module to use
    (default: :func:`decode.jpeg_window.library`; None forces torchvision on CUDA).

    Raises ``ValueError`` for an unknown kind and ``RuntimeError`` for the CPU kind without
    nvImageCodec (one line: why it is not usable).
    """

    def __init__(self, kind: str, device: torch.device, hw_load: float | None = None,
                 threads: int = 1, library: object = "default"):
        if kind not in KINDS:
            raise ValueError(f"decode device {kind!r}: one of {', '.join(KINDS)}")
        self.kind, self.device = kind, torch.device(device)
        self.hw_load = DEFAULT_HW_LOAD if hw_load is None else hw_load
        self.n = jpeg_window.library() if library == "default" else library
        if self.n is None and kind != "cuda":
            raise RuntimeError(f"--decode-device {kind} needs nvImageCodec: "
                               f"{jpeg_window.status()}")
        self._decoder = self._params = None
        self.on_device = 0  # windows the batch decoder returned in device memory (GPU proof)
        if self.n is not None:
            self._decoder, self._params = self._make(threads)

    def _make(self, threads: int):
        n = self.n
        if self.kind == "cuda":
            backends = [n.Backend(n.BackendKind.HW_GPU_ONLY, load_hint=self.hw_load),
                        n.Backend(n.BackendKind.GPU_ONLY, load_hint=1.0)]
            decoder = n.Decoder(device_id=self.device.index or 0, backends=backends,
                                max_num_cpu_threads=max(1, threads),
                                options=":fancy_upsampling=1")
        else:
            decoder = n.Decoder(device_id=n.NVIMGCODEC_DEVICE_CPU_ONLY,
                                max_num_cpu_threads=max(1, threads),
                                backends=[n.Backend(n.BackendKind.CPU_ONLY)],
                                options=":fancy_upsampling=1")
        params = n.DecodeParams(apply_exif_orientation=False, color_spec=n.ColorSpec.SRGB,
                                sample_format=n.SampleFormat.I_RGB)
        return decoder, params

    def status(self) -> str:
        """One line for the run's first lines: which decoder and backends decode, e.g.
        ``"batch windows: nvImageCodec 0.9.0 on cuda:0 (hardware JPEG decoder where present,
        load 0.65, then CUDA)"``."""
        if self.n is None:
            return (f"batch windows: torchvision decode_jpeg on {self.device} (whole JPEGs, "
                    "then the window)")
        return status_line(self.kind, self.device, self.hw_load)

    def decode(self, datas: Sequence, regions: Sequence[tuple[int, int, int, int]],
               size: tuple[int, int], stream: int = 0,
               frames: Sequence | None = None, seconds: dict | None = None) -> DecodedWindows:
        """``regions[i]`` = ``(top, left, height, width)`` in whole pixels of ``datas[i]``'s
        stored image (encoded bytes, or a uint8 NumPy array of them), resized to ``size`` =
        ``(height, width)``; see :class:`DecodedWindows`. ``stream``: the CUDA stream handle
        the GPU work is ordered on (``torch.cuda.Stream.cuda_stream``; 0: the default).
        ``frames[i]``, if given, resamples region ``i`` as part of a whole-image resize and
        crop instead (:func:`resize_in_frame`: validation's resize-then-crop pixels).
        ``seconds``, if given, gets the host's wall seconds of the call less the resizes
        (``"decode"``) and of the resizes (``"resize"``); on CUDA the kernels they launch run
        later on ``stream``."""
        started = time.perf_counter() if seconds is not None else 0.0
        resized = 0.0
        count = len(datas)
        dtype = torch.float32 if self.device.type == "cuda" else torch.uint8
        out = DecodedWindows(torch.zeros((count, 3, *size), dtype=dtype, device=self.device))
        # raw-pixel records (decode.raw, --raw-budget stores): cut on the host, no decode
        is_raw = [raw.is_raw(bytes(d[:2])) for d in datas]
        crops = [self._raw(d, r) if kind else None for d, r, kind in zip(datas, regions, is_raw)]
        rest = [i for i, kind in enumerate(is_raw) if not kind]
        if rest:
            decoded, warned = (self._nvimgcodec if self.n is not None else self._torchvision)(
                [datas[i] for i in rest], [regions[i] for i in rest], *((stream,) if self.n
                                                                       is not None else ()))
            out.warnings += [(rest[i], lines) for i, lines in warned]
            for i, crop in zip(rest, decoded):
                crops[i] = crop
        for i, crop in enumerate(crops):
            if crop is None:
                out.fallback.append(i)
                try:
                    crop, lines = run_captured(lambda: self._on_cpu(datas[i], regions[i]))
                except DECODE_ERRORS as exc:
                    out.failed.append((i, exc))
                    continue
                if lines:
                    out.warnings.append((i, lines))
            resize_started = time.perf_counter() if seconds is not None else 0.0
            if frames is not None:
                out.images[i] = resize_in_frame(crop, regions[i], frames[i], size, dtype)
            else:
                out.images[i] = resize_window(crop, size, dtype)
            if seconds is not None:
                resized += time.perf_counter() - resize_started
        if seconds is not None:
            seconds.update(decode=time.perf_counter() - started - resized, resize=resized)
        return out

    def _raw(self, data, region) -> torch.Tensor | None:
        """A raw record's region, ``(3, h, w)`` uint8 on the device; None where the record is
        malformed or the region leaves it (the CPU fallback then says why)."""
        blob = bytes(data)
        header = raw.raw_header(blob)
        if header is None or region[0] + region[2] > header.height \
                or region[1] + region[3] > header.width:
            return None
        return to_device(raw.raw_crop(blob, region, header), self.device)

    def _nvimgcodec(self, datas, regions, stream: int):
        """Each region decoded by the batch decoder, ``(3, h, w)`` uint8 on the device, or None
        where it declined (or the header did not parse); and ``(position, lines)`` of those
        a native decoder warned about (:meth:`_warned`)."""
        n, streams, where = self.n, [], []
        for i, (data, (top, left, height, width)) in enumerate(zip(datas, regions)):
            try:
                whole = n.CodeStream(data)
                # the CPU loaders' rule (decode.jpeg_size): 1- or 3-component JPEGs only; CMYK
                # and other formats go to the CPU fallback
                if whole.codec_name != "jpeg" or whole.num_channels not in (1, 3):
                    continue
                region = n.Region(top, left, top + height, left + width)
                streams.append(whole.get_sub_code_stream(region=region))
                where.append(i)
            except (RuntimeError, ValueError):  # not an image nvImageCodec parses
                pass
        crops: list[torch.Tensor | None] = [None] * len(datas)
        if not streams:
            return crops, []
        with capture() as caught:
            images = self._decoder.decode(streams, params=self._params, cuda_stream=stream)
        for i, image in zip(where, images):
            if image is not None:
                crops[i] = self._tensor(image, regions[i])
        return crops, self._warned(streams, where, stream) if caught.lines else []

    def _warned(self, streams, where: list[int], stream: int) -> list[tuple[int, list[str]]]:
        """``(position, lines)`` of the images of a batch whose decode made a native decoder
        print: each decoded once more on its own (only after a batch that printed)."""
        found = []
        for i, code_stream in zip(where, streams):
            with capture() as caught:
                self._decoder.decode([code_stream], params=self._params, cuda_stream=stream)
            if caught.lines:
                found.append((i, caught.lines))
        return found

    def _tensor(self, image, region) -> torch.Tensor | None:
        if self.device.type == "cuda":
            pixels = torch.from_dlpack(image)  # (h, w, 3) on the GPU, no copy
            self.on_device += pixels.is_cuda
        else:
            pixels = torch.from_numpy(np.asarray(image.cpu()))
        if tuple(pixels.shape) != (region[2], region[3], 3):
            return None  # decoded only in part
        return pixels.permute(2, 0, 1)

    def _torchvision(self, datas, regions):
        """torchvision's nvJPEG decode of whole JPEGs on the GPU, then each window; None for
        what it refuses and for what is not a 1- or 3-component JPEG by PIL's reading of its
        headers (CMYK, PNG, ...: the CPU loaders' rule, as for nvImageCodec), which the caller
        decodes on the CPU; no warnings (nvJPEG prints none), as :meth:`_nvimgcodec`."""
        from torchvision.io import ImageReadMode
        from torchvision.io import decode_jpeg as tv_decode_jpeg

        usable = [i for i, d in enumerate(datas) if _plain_jpeg(d)]
        crops: list[torch.Tensor | None] = [None] * len(datas)
        if not usable:
            return crops, []
        datas, regions = [datas[i] for i in usable], [regions[i] for i in usable]
        tensors = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas]
        with warnings.catch_warnings():  # torchvision 0.29 warns on every call
            warnings.filterwarnings("ignore", "The image decoding", DeprecationWarning)
            try:
                wholes = tv_decode_jpeg(tensors, mode=ImageReadMode.RGB, device=self.device)
            except RuntimeError:  # one refused: each on its own
                wholes = []
                for tensor in tensors:
                    try:
                        wholes.append(tv_decode_jpeg(tensor, mode=ImageReadMode.RGB,
                                                     device=self.device))
                    except RuntimeError:
                        wholes.append(None)
        self.on_device += sum(whole is not None and whole.is_cuda for whole in wholes)
        for i, whole, region in zip(usable, wholes, regions):
            crops[i] = None if whole is None else _crop(whole, region)
        return crops, []

    def _on_cpu(self, data, region) -> torch.Tensor:
        """The CPU loaders' whole-image decode (:func:`decode.decode`'s cascade), cropped, on
        the device. Raises what it raises for bytes that are not an image."""
        from . import decode as whole_decode

        image = whole_decode(bytes(data))
        crop = _crop(image, region)
        if tuple(crop.shape[-2:]) != tuple(region[2:]):
            raise ValueError(f"window {tuple(region)} outside the {tuple(image.shape[-2:])} image")
        return to_device(crop, self.device)


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """CPU ``tensor`` on ``device``, same shape, dtype and values. On CUDA copied into
    page-locked memory (keeping its strides where dense: one host copy) and from there to the
    device without blocking, ordered on the current stream: a copy from pageable memory blocks
    the host until it is done (CUDA stages it), once per batch or raw record in the decode
    thread. Torch's page-locked allocator keeps the host block until that copy has run."""
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    pinned = torch.empty_like(tensor, pin_memory=True)
    pinned.copy_(tensor)
    return pinned.to(device, non_blocking=True)


def _plain_jpeg(data) -> bool:
    """Whether ``data`` is a JPEG PIL reads as grayscale or RGB (headers only, about 20 us)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(bytes(data))) as image:
            return image.format == "JPEG" and image.mode in ("L", "RGB")
    except Exception:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError...
        return False


def _crop(image: torch.Tensor, region) -> torch.Tensor:
    top, left, height, width = region
    return image[:, top:top + height, left:left + width]


@dataclass(frozen=True)
class CudaChoice:
    """Which GPU decoder decodes windows into device memory on ``device``: ``library``
    ``"nvimgcodec"``, ``"torchvision"`` or None (none does: every window would go to the CPU
    fallback); ``problems``: why each decoder tried before did not, one phrase each."""

    device: str
    library: str | None
    problems: tuple[str, ...] = ()

    def line(self, hw_load: float | None = None) -> str:
        """The run's ``batch windows:`` line for this choice (its first lines)."""
        device = torch.device(self.device)
        if self.library == "nvimgcodec":
            return status_line("cuda", device, hw_load)
        why = "; ".join(self.problems)
        if self.library == "torchvision":
            return (f"batch windows: torchvision decode_jpeg on {device} (whole JPEGs, then "
                    f"the window; {why})")
        return f"batch windows: no GPU decoder decodes on {device} ({why}): every window on the CPU"


_CHOICES: dict[tuple[str, float | None], CudaChoice] = {}


def probe_jpeg() -> bytes:
    """A 64 x 48 baseline 4:2:0 JPEG (what nvJPEG's CUDA and hardware decoders both take)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 100, 50)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def device_decode_problem(decoder: "WindowDecoder") -> str | None:
    """Why ``decoder`` does not decode a window of :func:`probe_jpeg` into GPU memory, in one
    phrase, or None when it does (its batch decoder returned device memory, no CPU fallback).
    A decode that raises is reported, not raised."""
    before = decoder.on_device
    try:
        out = decoder.decode([probe_jpeg()], [(8, 8, 32, 48)], (16, 16))
    except Exception as exc:  # noqa: BLE001 - CUDA, nvJPEG and torchvision errors alike
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    if out.fallback:
        return "declined a baseline JPEG (libnvjpeg not found?)"
    if decoder.on_device == before:
        return "decoded into host memory, not the GPU's"
    return None


def probe_cuda(device: torch.device, hw_load: float | None = None) -> CudaChoice:
    """The first of nvImageCodec (where installed) and torchvision's ``decode_jpeg`` that
    decodes a probe window into ``device``'s memory (:func:`device_decode_problem`), once per
    process for each (device, ``hw_load``): the run's first line and its loaders agree. nvJPEG
    comes from the ``nvidia-nvjpeg`` wheel (:func:`nvjpeg_pip_package`); without it both
    decline. Never raises for a decoder that cannot be made or run: its problem is listed."""
    key = (str(device), hw_load)
    if key in _CHOICES:
        return _CHOICES[key]
    problems = []
    candidates = [("nvimgcodec", "default")] if jpeg_window.library() is not None else []
    if not candidates:
        problems.append(f"nvImageCodec: {jpeg_window.status()}")
    for name, library in candidates + [("torchvision", None)]:
        label = "nvImageCodec" if name == "nvimgcodec" else "torchvision decode_jpeg"
        if torch.device(device).type != "cuda" or not torch.cuda.is_available():
            problems.append(f"{label}: no CUDA device")
            continue
        try:
            problem = device_decode_problem(WindowDecoder("cuda", device, hw_load,
                                                          library=library))
        except Exception as exc:  # noqa: BLE001 - the decoder could not be made here
            problem = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if problem is None:
            _CHOICES[key] = CudaChoice(str(device), name, tuple(problems))
            return _CHOICES[key]
        problems.append(f"{label}: {problem}")
    _CHOICES[key] = CudaChoice(str(device), None, tuple(problems))
    return _CHOICES[key]


def nvjpeg_pip_package(cuda_version: str | None) -> str:
    """The pip wheel that brings ``libnvjpeg`` for torch's CUDA ``cuda_version`` ("13.0" ->
    ``nvidia-nvjpeg``, "12.8" -> ``nvidia-nvjpeg-cu12``; None -> CUDA 13's). nvImageCodec's
    wheel declares it only as an optional extra and torch's CUDA wheels do not carry it, so
    without it every nvImageCodec GPU decode (and DALI's mixed decode) declines. CUDA 13's
    wheel has no suffix: ``nvidia-nvjpeg-cu13`` is a deprecated placeholder on PyPI."""
    major = (cuda_version or "13").split(".")[0]
    return "nvidia-nvjpeg" if int(major) >= 13 else f"nvidia-nvjpeg-cu{major}"


def status_line(kind: str, device: torch.device, hw_load: float | None = None) -> str:
    """What :meth:`WindowDecoder.status` will say for ``kind`` on ``device``, without making a
    decoder (the run's first line is printed before the loaders are built)."""
    library = jpeg_window.library()
    if library is None:
        if kind != "cuda":
            return f"batch windows: not usable ({jpeg_window.status()})"
        return (f"batch windows: torchvision decode_jpeg on {device} (whole JPEGs, then the "
                f"window; {jpeg_window.status()})")
    load = DEFAULT_HW_LOAD if hw_load is None else hw_load
    how = ("nvImageCodec CPU backend, libjpeg-turbo" if kind != "cuda" else
           f"hardware JPEG decoder where present, load {load:g}, then CUDA")
    where = device if kind == "cuda" else "cpu"
    return f"batch windows: nvImageCodec {library.__version__} on {where} ({how})"
