"""What ``--dali`` needs from its environment: the DALI wheel for torch's CUDA major, nvJPEG for
GPU decoding, the hardware JPEG decoder's share, and telling a CUDA failure inside DALI from a
damaged file."""
from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
from typing import Sequence

import torch

from decode.headers import probe_jpeg

from ...errors import DataError

# hw_decoder_load (the hardware JPEG decoder's share; GPUs without one ignore it): DALI 2.4's
# default, and on A100 the one per-GPU figure NVIDIA published (quoted in NVIDIA/DALI#5362):
# https://developer.nvidia.com/blog/loading-data-fast-with-dali-and-new-jpeg-decoder-in-a100/
DEFAULT_HW_DECODER_LOAD = 0.65
A100_HW_DECODER_LOAD = 0.75
# DALI's and CUDA's words for a failed GPU or driver ("CUDA runtime API error cudaErrorMemory
# Allocation", "CUDA driver API error", "CUDA allocation failed", "out of memory"): not bad data.
_CUDA_FAILURE = re.compile(r"cuda (error|runtime|driver|allocation)|cudaerror|cuda_error|"
                           r"out of memory", re.IGNORECASE)


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
    (on CUDA) built for another CUDA major than torch (before any split is opened)."""
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
    # nvImageCodec prints two coloured lines to stderr per failure unless told not to
    os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")
    try:
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
    return DEFAULT_HW_DECODER_LOAD


def message_lines(exc: Exception) -> list[str]:
    """The lines of a DALI error that say something (no blanks, no "Current pipeline ...")."""
    return [line.strip() for line in str(exc).splitlines()
            if line.strip() and not line.startswith("Current pipeline")]


def cuda_failure(exc: Exception) -> str | None:
    """One line for a DALI error naming a CUDA / driver failure (from the last line naming one
    on); None for other errors."""
    lines = message_lines(exc)
    hits = [i for i, line in enumerate(lines) if _CUDA_FAILURE.search(line)]
    return " ".join(lines[hits[-1]:]) if hits else None
