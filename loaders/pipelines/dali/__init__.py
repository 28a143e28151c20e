"""The NVIDIA DALI pipeline (``--dali``): :class:`DALILoader` with its feed threads, graph and
``--auto-augment`` ops, and here what it needs from its environment: the DALI wheel for torch's
CUDA major, nvJPEG for GPU decoding, the hardware JPEG decoder's share. DALI is imported late."""
from __future__ import annotations

import importlib
import importlib.metadata
import re
from typing import Sequence

import torch

from decode.gpu import DEFAULT_HW_LOAD, nvjpeg_hint
from decode.headers import probe_jpeg

from ...errors import DataError
from ...readers import Reader
from ...settings import DistInfo, LoaderSettings
from .augment import DaliAugment
from .graph import GraphOptions
from .loader import DALILoader

# hw_decoder_load (the hardware JPEG decoder's share; GPUs without one ignore it) on an A100: the
# one per-GPU figure NVIDIA published (quoted in NVIDIA/DALI#5362), elsewhere DALI 2.4's default:
# https://developer.nvidia.com/blog/loading-data-fast-with-dali-and-new-jpeg-decoder-in-a100/
A100_HW_DECODER_LOAD = 0.75


def build_loaders(train: Reader, val: Reader, settings: LoaderSettings, dist: DistInfo):
    """``(train, val)`` :class:`DALILoader` s. Raises :class:`DataError` for a reader without
    random access (streamed shards), bad order or graph settings, nvJPEG unable to decode on the
    GPU (without ``--dali-cpu``), or a training order smaller than one batch."""
    built = []
    for is_train, reader, path in ((True, train, settings.train_path),
                                   (False, val, settings.val_path)):
        if not reader.random_access:
            raise DataError(f"{path}: --dali reads local shards only; stream them with "
                            "--loader shards (without --dali)")
        order = (reader.train_order if is_train else reader.val_order)(settings, dist)
        opts = graph_options(settings, dist, is_train)
        if is_train and not opts.decode_on_cpu:
            problem = gpu_decoding_problem(dist.device)
            if problem:
                raise DataError(f"--dali: nvJPEG cannot decode on {dist.device} ({problem}), "
                                f"so DALI would decode on the CPU: {nvjpeg_hint()}, or give "
                                "--dali-cpu")
        built.append(DALILoader(reader, order, opts, settings, dist))
    return built[0], built[1]


def graph_options(settings: LoaderSettings, dist: DistInfo, train: bool) -> GraphOptions:
    """The split's graph options (``dali_hw_decoder_load`` None: ``default_hw_decoder_load``).
    Raises :class:`DataError` for a load outside [0, 1] or a policy DALI cannot run."""
    cuda = dist.device.type == "cuda"
    load = settings.dali_hw_decoder_load
    if load is None:
        load = default_hw_decoder_load(dist.device)
    elif not 0 <= load <= 1:
        raise DataError(f"--dali-hw-decoder-load {load}: must be between 0 and 1")
    policy = None
    if train and settings.auto_augment is not None:
        policy = DaliAugment(settings.auto_augment, settings.interpolation,
                             settings.ra_magnitude, settings.augmix_severity)
        policy.check(cuda)
    return GraphOptions(
        train=train, crop_size=settings.train_crop_size if train else settings.val_crop_size,
        resize_size=settings.val_resize_size, cuda=cuda,
        decode_on_cpu=not cuda or settings.dali_cpu, hw_decoder_load=load,
        dtype=settings.dtype, channels_last=settings.channels_last, augment=policy,
        interpolation=settings.interpolation, threads=max(1, settings.workers))


def dali_pip_package(cuda_version: str | None) -> str:
    """The DALI wheel for torch's CUDA ``cuda_version`` ("12.8" -> ``nvidia-dali-cuda120``,
    "13.0" -> ``nvidia-dali-cuda130``; None, a torch without CUDA -> the CUDA 13 wheel)."""
    return f"nvidia-dali-cuda{(cuda_version or '13').split('.')[0]}0"


def check_dali_wheel(cuda_version: str | None, installed: Sequence[str]) -> None:
    """Raise :class:`DataError` if one of the distributions ``installed`` is a DALI wheel
    (``nvidia-dali[-nightly]-cudaXY0``) for another CUDA major than ``cuda_version``. Both
    wheels write ``nvidia/dali``, so the fix uninstalls both before installing the right one."""
    wanted = dali_pip_package(cuda_version)
    for name in (n.lower().replace("_", "-") for n in installed):
        if (cuda_version and re.fullmatch(r"nvidia-dali(-[a-z]+)?-cuda\d+", name)
                and not name.endswith(wanted[len("nvidia-dali-"):])):
            raise DataError(f"--dali: {name} is built for another CUDA major than torch's "
                            f"{cuda_version}: pip uninstall -y {name} {wanted} && "
                            f"pip install {wanted}")


def require(dist) -> None:
    """Import DALI or raise :class:`DataError` naming the wheel to install: DALI is missing, or
    (on CUDA) built for another CUDA major than torch."""
    try:
        import nvidia.dali  # noqa: F401
    except (ImportError, OSError):
        raise DataError(f"--dali needs NVIDIA DALI, which is not installed: "
                        f"pip install {dali_pip_package(torch.version.cuda)}") from None
    if dist.device.type == "cuda":
        check_dali_wheel(torch.version.cuda, [d.metadata["Name"] or ""
                                              for d in importlib.metadata.distributions()])


def gpu_decoding_problem(device: torch.device, nvimgcodec=None) -> str | None:
    """Why a JPEG would not be decoded on the GPU ``device`` here, in one phrase, or None:
    nvImageCodec (``nvimgcodec``, default ``nvidia.nvimgcodec``, DALI 2.4's decoders' base) must
    decode a probe JPEG with its GPU backends only, into device memory (it finds ``libnvjpeg``
    only by its RUNPATH; elsewhere DALI silently decodes on the CPU)."""
    try:  # quiet: decode.libraries set PYNVIMGCODEC_VERBOSITY on import
        n = nvimgcodec or importlib.import_module("nvidia.nvimgcodec")
    except Exception as exc:  # noqa: BLE001 - ImportError, or its native libraries
        return f"nvImageCodec not usable: {type(exc).__name__}: {exc}".splitlines()[0]
    try:
        decoder = n.Decoder(device_id=device.index if device.index is not None else 0,
                            backends=[n.Backend(n.BackendKind.GPU_ONLY),
                                      n.Backend(n.BackendKind.HW_GPU_ONLY)])
        image = decoder.decode(probe_jpeg())
    except Exception as exc:  # noqa: BLE001 - no GPU backend could be created or run
        return f"nvImageCodec's GPU decoders failed: {exc}".splitlines()[0]
    if image is None:
        return "nvImageCodec's GPU decoders declined a baseline JPEG (libnvjpeg not found?)"
    if image.buffer_kind != n.ImageBufferKind.STRIDED_DEVICE:
        return "nvImageCodec decoded into host memory, not the GPU's"
    return None


def default_hw_decoder_load(device: torch.device) -> float:
    """``hw_decoder_load`` for ``device``: :data:`A100_HW_DECODER_LOAD` on an A100, else DALI's."""
    if device.type == "cuda" and "A100" in torch.cuda.get_device_name(device).upper():
        return A100_HW_DECODER_LOAD
    return DEFAULT_HW_LOAD
