"""The batch-decode pipeline (``--decode-device cuda`` or ``cpu-nvimgcodec``): ``loader``
(:class:`BatchDecodeLoader`, decoding each batch in the training process), ``windows`` (what
its DataLoader workers do: read the bytes, draw the windows) and ``ahead`` (decoding ahead of
the training thread); here the batch decoder both splits share."""
from __future__ import annotations

import torch

from decode.gpu import CudaChoice, WindowDecoder, nvjpeg_pip_package, probe_cuda

from ...errors import AcceleratorError
from ...readers import Reader
from ...settings import DistInfo, LoaderSettings
from .loader import BatchDecodeLoader

__all__ = ["BatchDecodeLoader", "build_loaders", "make_decoder", "refusal"]


def make_decoder(settings: LoaderSettings, dist: DistInfo) -> WindowDecoder:
    """The batch decoder of ``settings.decode_device`` on ``dist.device``: for ``cuda`` the
    first GPU decoder that decodes a probe window into device memory
    (:func:`decode.gpu.probe_cuda`: nvImageCodec, else torchvision's ``decode_jpeg``). Raises
    :class:`AcceleratorError` (one line) for ``cuda`` on a CPU device, for ``cuda`` where no
    GPU decoder decodes unless ``settings.allow_cpu_decode`` (``--allow-cpu-decode``: every
    window then goes to the CPU fallback, and the run says so), and for the CPU backend
    without nvImageCodec."""
    kind = settings.decode_device
    if kind == "cuda" and dist.device.type != "cuda":
        raise AcceleratorError("--decode-device cuda needs a CUDA device (use cpu-nvimgcodec "
                               "for the same pipeline on nvImageCodec's CPU backend)")
    device = dist.device if kind == "cuda" else torch.device("cpu")
    library = "default"
    if kind == "cuda":
        choice = probe_cuda(device, settings.hw_decoder_load)
        if choice.library is None and not settings.allow_cpu_decode:
            raise AcceleratorError(refusal(choice))
        library = None if choice.library == "torchvision" else "default"
    try:
        return WindowDecoder(kind, device, settings.hw_decoder_load,
                             threads=max(1, settings.workers), library=library)
    except RuntimeError as exc:
        raise AcceleratorError(str(exc).splitlines()[0]) from None


def refusal(choice: CudaChoice) -> str:
    """The one line ``--decode-device cuda`` stops with where no GPU decoder decodes."""
    cuda = (torch.version.cuda or "13").split(".")[0]
    return (f"--decode-device cuda: no GPU decoder decodes on {choice.device} "
            f"({'; '.join(choice.problems)}): install {nvjpeg_pip_package(cuda)} beside "
            f"nvidia-nvimgcodec-cu{cuda}, or pass --allow-cpu-decode to decode every window "
            "on the CPU")


def build_loaders(train: Reader, val: Reader, settings: LoaderSettings, dist: DistInfo):
    """``(train, val)`` :class:`BatchDecodeLoader` s over two readers in their orders, one
    decoder shared by both. Raises :class:`DataError` for a training order smaller than one
    batch, :class:`AcceleratorError` where the decoder cannot run (:func:`make_decoder`)."""
    decoder = make_decoder(settings, dist)
    return (BatchDecodeLoader(train, train.train_order(settings, dist), decoder, settings, dist,
                              train=True),
            BatchDecodeLoader(val, val.val_order(settings, dist), decoder, settings, dist,
                              train=False))
