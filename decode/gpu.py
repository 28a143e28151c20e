"""Batches of JPEG windows decoded in the training process (``--decode-device``,
docs/loaders.md#batch-decoding-on-the-gpu---decode-device): nvImageCodec (each region only) on
the GPU or its CPU backend, else torchvision's ``decode_jpeg(device="cuda")``; raw records cut
on the host, the rest by :func:`decode.decode`. Pixels as stored, fancy upsampling, RGB."""
from __future__ import annotations

import functools
import time
import warnings
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from . import DECODE_ERRORS, decode as whole_decode, jpeg, raw, resize
from .acceptance import read_frame
from .headers import probe_jpeg
from .messages import capture, run_captured

KINDS = ("cuda", "cpu-nvimgcodec")  # --decode-device choices of the batch decoder
DEFAULT_HW_LOAD = 0.65  # DALI 2.4's default hw_decoder_load (fn.decoders.image)


@dataclass
class DecodedWindows:
    """One batch's ``images``, ``(N, 3, H, W)`` on the decoder's device in the order given (uint8
    on the CPU, unrounded float32 0-255 on CUDA); ``fallback``: positions decoded on the CPU;
    ``failed``: ``(position, exception)``, rows of zeros; ``warnings``: ``(position, lines)`` a
    native decoder printed (:mod:`decode.messages`)."""

    images: torch.Tensor
    fallback: list[int] = field(default_factory=list)
    failed: list[tuple[int, BaseException]] = field(default_factory=list)
    warnings: list[tuple[int, list[str]]] = field(default_factory=list)


class WindowDecoder:
    """A batch's regions decoded and resized on ``device``: ``kind`` ``"cuda"`` (nvImageCodec's
    hardware decoder at ``hw_load``, then CUDA; ``library`` None: torchvision's) or
    ``"cpu-nvimgcodec"`` (``threads`` threads). Raises ``ValueError`` for an unknown kind,
    ``RuntimeError`` for the CPU kind without nvImageCodec."""

    def __init__(self, kind: str, device: torch.device, hw_load: float | None = None,
                 threads: int = 1, library: object = "default"):
        if kind not in KINDS:
            raise ValueError(f"decode device {kind!r}: one of {', '.join(KINDS)}")
        self.kind, self.device = kind, torch.device(device)
        self.hw_load = DEFAULT_HW_LOAD if hw_load is None else hw_load
        self.n = jpeg.window.library() if library == "default" else library
        if self.n is None and kind != "cuda":
            raise RuntimeError(f"--decode-device {kind} needs nvImageCodec: "
                               f"{jpeg.window.status()}")
        self.on_device = 0  # windows the batch decoder returned in device memory (GPU proof)
        n, cuda = self.n, kind == "cuda"
        if n is not None:
            self._decoder, self._params = jpeg.window.make_decoder(
                n, (self.device.index or 0) if cuda else n.NVIMGCODEC_DEVICE_CPU_ONLY, threads,
                [n.Backend(n.BackendKind.HW_GPU_ONLY, load_hint=self.hw_load),
                 n.Backend(n.BackendKind.GPU_ONLY, load_hint=1.0)] if cuda
                else [n.Backend(n.BackendKind.CPU_ONLY)])

    def status(self) -> str:
        """One start-up line, e.g. ``"batch windows: nvImageCodec 0.9.0 on cuda:0 (hardware JPEG
        decoder where present, load 0.65, then CUDA)"``."""
        return status_line(self.kind, self.device, self.hw_load, "" if self.n is None else None)

    def decode(self, datas: Sequence, regions: Sequence[tuple[int, int, int, int]],
               size: tuple[int, int], stream: int = 0,
               frames: Sequence | None = None, seconds: dict | None = None) -> DecodedWindows:
        """``regions[i]`` = ``(top, left, height, width)`` in pixels of ``datas[i]`` (encoded bytes
        or a uint8 NumPy array), resized to ``size``: a :class:`DecodedWindows`. ``stream``: the
        CUDA stream handle to order GPU work on (0: default). ``frames[i]``: region ``i``
        resampled as part of a whole-image resize and crop (:func:`resize_in_frame`).
        ``seconds`` gets the host's wall seconds of the decode and of the resizes."""
        started, resized = time.perf_counter(), 0.0
        dtype = torch.float32 if self.device.type == "cuda" else torch.uint8
        out = DecodedWindows(torch.zeros((len(datas), 3, *size), dtype=dtype, device=self.device))
        crops = [self._raw(d, r) for d, r in zip(datas, regions)]
        rest = [i for i, d in enumerate(datas) if not raw.is_raw(bytes(d[:2]))]
        if rest and self.n is not None:
            out.warnings += self._nvimgcodec(datas, regions, rest, crops, stream)
        elif rest:
            self._torchvision(datas, regions, rest, crops)
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
            resize_started = time.perf_counter()
            out.images[i] = (resize(crop, size, "bilinear", dtype) if frames is None
                             else resize_in_frame(crop, regions[i], frames[i], size, dtype))
            resized += time.perf_counter() - resize_started
        if seconds is not None:
            seconds.update(decode=time.perf_counter() - started - resized, resize=resized)
        return out

    def _raw(self, data, region) -> torch.Tensor | None:
        """A raw record's region, uint8 ``(3, h, w)`` on the device, or None (anything else)."""
        header = raw.raw_header(data)
        top, left, height, width = region
        if header is None or top + height > header.height or left + width > header.width:
            return None
        return to_device(raw.raw_crop(data, region, header), self.device)

    def _nvimgcodec(self, datas, regions, positions, crops, stream: int) -> list:
        """``crops[i]`` of each ``i`` in ``positions``: its region, uint8 ``(3, h, w)`` on the
        device (None: declined); returns ``(position, lines)`` a native decoder printed."""
        n, streams, where = self.n, [], []
        for i in positions:
            top, left, height, width = regions[i]
            try:
                whole = n.CodeStream(datas[i])
                # the CPU loaders' rule (Frame.plain_jpeg); the rest go to the CPU fallback
                if whole.codec_name != "jpeg" or whole.num_channels not in (1, 3):
                    continue
                region = n.Region(top, left, top + height, left + width)
                streams.append(whole.get_sub_code_stream(region=region))
                where.append(i)
            except (RuntimeError, ValueError):  # not an image nvImageCodec parses
                pass
        if not streams:
            return []
        with capture() as caught:
            images = self._decoder.decode(streams, params=self._params, cuda_stream=stream)
        for i, image in zip(where, images):
            crops[i] = None if image is None else self._tensor(image, regions[i])
        warned = []
        if caught.lines:  # which images printed: each decoded alone
            for i, code_stream in zip(where, streams):
                with capture() as alone:
                    self._decoder.decode([code_stream], params=self._params, cuda_stream=stream)
                if alone.lines:
                    warned.append((i, alone.lines))
        return warned

    def _tensor(self, image, region) -> torch.Tensor | None:
        """nvImageCodec's ``(h, w, 3)`` image as uint8 ``(3, h, w)``; None if decoded in part."""
        if self.device.type == "cuda":
            pixels = torch.from_dlpack(image)  # (h, w, 3) on the GPU, no copy
            self.on_device += pixels.is_cuda
        else:
            pixels = torch.from_numpy(np.asarray(image.cpu()))
        return pixels.permute(2, 0, 1) if tuple(pixels.shape) == (region[2], region[3], 3) else None

    def _torchvision(self, datas, regions, positions, crops) -> None:
        """``crops[i]`` of each ``i`` in ``positions``: torchvision's nvJPEG decode of a whole 1- or
        3-component JPEG, then its window; None for the rest. nvJPEG prints nothing to catch."""
        from torchvision.io import ImageReadMode, decode_jpeg as tv_decode_jpeg

        usable = [i for i in positions  # nvJPEG's: 1- or 3-component DCT JPEGs
                  if getattr(read_frame(bytes(datas[i])), "plain_jpeg", False)]
        if not usable:
            return
        tensors = [torch.frombuffer(bytearray(datas[i]), dtype=torch.uint8) for i in usable]
        nvjpeg = functools.partial(tv_decode_jpeg, mode=ImageReadMode.RGB, device=self.device)
        with warnings.catch_warnings():  # torchvision 0.29 warns on every call
            warnings.filterwarnings("ignore", "The image decoding", DeprecationWarning)
            try:
                wholes = nvjpeg(tensors)
            except RuntimeError:  # one refused: each on its own
                wholes = []
                for tensor in tensors:
                    try:
                        wholes.append(nvjpeg(tensor))
                    except RuntimeError:
                        wholes.append(None)
        self.on_device += sum(whole is not None and whole.is_cuda for whole in wholes)
        for i, whole in zip(usable, wholes):
            crops[i] = None if whole is None else _crop(whole, regions[i])

    def _on_cpu(self, data, region) -> torch.Tensor:
        """:func:`decode.decode`'s whole image, cropped, on the device. Raises what it raises."""
        image = whole_decode(bytes(data))
        crop = _crop(image, region)
        if tuple(crop.shape[-2:]) != tuple(region[2:]):
            raise ValueError(f"window {tuple(region)} outside the {tuple(image.shape[-2:])} image")
        return to_device(crop, self.device)


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """CPU ``tensor`` on ``device``; to CUDA through page-locked memory without blocking, on the
    current stream (a pageable copy would block the decode thread)."""
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    pinned = torch.empty_like(tensor, pin_memory=True)
    pinned.copy_(tensor)
    return pinned.to(device, non_blocking=True)


def _crop(image: torch.Tensor, region) -> torch.Tensor:
    top, left, height, width = region
    return image[:, top:top + height, left:left + width]


def resize_in_frame(crop: torch.Tensor, region, frame, size: tuple[int, int],
                    dtype: torch.dtype) -> torch.Tensor:
    """uint8 ``(3, h, w)`` pixels of ``region`` = ``(top, left, h, w)`` -> ``(3, *size)`` of
    ``dtype``: placed in a zero image of size ``frame[:2]``, resized to ``frame[2:4]`` (bilinear)
    and cropped at ``frame[4:6]`` = ``(top, left)``. Where the region covers the filter's reach
    around the crop (``loaders.transforms.center_crop_plan``), these equal the whole image's
    resize-then-crop pixels."""
    full_h, full_w, new_h, new_w, crop_top, crop_left = frame
    canvas = torch.zeros((3, full_h, full_w), dtype=crop.dtype, device=crop.device)
    _crop(canvas, region).copy_(crop)
    out = resize(canvas, (new_h, new_w), "bilinear", dtype)
    return out[:, crop_top:crop_top + size[0], crop_left:crop_left + size[1]]


@dataclass(frozen=True)
class CudaChoice:
    """The ``library`` (``"nvimgcodec"``, ``"torchvision"`` or None) that decodes into
    ``device``'s memory and why each one tried before did not."""

    device: str
    library: str | None
    problems: tuple[str, ...] = ()

    def line(self, hw_load: float | None = None) -> str:
        """The run's ``batch windows:`` start-up line for this choice."""
        device, why = torch.device(self.device), "; ".join(self.problems)
        if self.library is not None:
            return status_line("cuda", device, hw_load,
                               why if self.library == "torchvision" else None)
        return f"batch windows: no GPU decoder decodes on {device} ({why}): every window on the CPU"


def device_decode_problem(decoder: "WindowDecoder") -> str | None:
    """Why ``decoder`` does not decode a probe window into GPU memory, or None; never raises."""
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


@functools.lru_cache(maxsize=None)
def probe_cuda(device: torch.device, hw_load: float | None = None) -> CudaChoice:
    """The first of nvImageCodec and torchvision that decodes a probe window into ``device``'s
    memory (both need :func:`nvjpeg_pip_package`), cached per process. Never raises."""
    problems = []
    for name, label, library in (("nvimgcodec", "nvImageCodec", "default"),
                                 ("torchvision", "torchvision decode_jpeg", None)):
        if library and jpeg.window.library() is None:
            problems.append(f"nvImageCodec: {jpeg.window.status()}")
            continue
        if torch.device(device).type != "cuda" or not torch.cuda.is_available():
            problems.append(f"{label}: no CUDA device")
            continue
        try:
            problem = device_decode_problem(WindowDecoder("cuda", device, hw_load, library=library))
        except Exception as exc:  # noqa: BLE001 - the decoder could not be made here
            problem = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if problem is None:
            return CudaChoice(str(device), name, tuple(problems))
        problems.append(f"{label}: {problem}")
    return CudaChoice(str(device), None, tuple(problems))


def nvjpeg_pip_package(cuda_version: str | None) -> str:
    """The pip wheel with ``libnvjpeg`` (in neither nvImageCodec's nor torch's) for torch's CUDA
    ``cuda_version``: "12.8" -> ``nvidia-nvjpeg-cu12``; 13, None -> ``nvidia-nvjpeg`` (its
    ``-cu13`` is a placeholder)."""
    major = (cuda_version or "13").split(".")[0]
    return "nvidia-nvjpeg" if int(major) >= 13 else f"nvidia-nvjpeg-cu{major}"


def nvjpeg_hint() -> str:
    """The words "install <nvjpeg wheel> beside nvidia-nvimgcodec-cuN" for torch's CUDA major."""
    cuda = (torch.version.cuda or "13").split(".")[0]
    return f"install {nvjpeg_pip_package(cuda)} beside nvidia-nvimgcodec-cu{cuda}"


def status_line(kind: str, device: torch.device, hw_load: float | None = None,
                why: str | None = None) -> str:
    """:meth:`WindowDecoder.status` without a decoder; ``why`` given: torchvision's decoder's line,
    used instead of nvImageCodec for that reason ("": none said)."""
    library = jpeg.window.library()
    if library is None and kind != "cuda":
        return f"batch windows: not usable ({jpeg.window.status()})"
    if library is None or why is not None:
        why = jpeg.window.status() if why is None else why
        return (f"batch windows: torchvision decode_jpeg on {device} (whole JPEGs, then the "
                f"window{'; ' + why if why else ''})")
    load = DEFAULT_HW_LOAD if hw_load is None else hw_load
    where, how = (("cpu", "nvImageCodec CPU backend, libjpeg-turbo") if kind != "cuda" else
                  (device, f"hardware JPEG decoder where present, load {load:g}, then CUDA"))
    return f"batch windows: nvImageCodec {library.__version__} on {where} ({how})"

