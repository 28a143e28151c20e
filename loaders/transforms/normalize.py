"""Normalisation with the ImageNet mean/std (pytorch/examples imagenet/main.py's ``Normalize``),
on the CPU or on the device after the uint8 batch reached it (as timm's PrefetchLoader)."""
from __future__ import annotations

import threading
import weakref
from typing import Iterable

import numpy as np
import torch

# ImageNet channel statistics on the [0, 1] scale, as in pytorch/examples imagenet/main.py.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def imagenet_mean_std(device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The ImageNet mean and std at 0-255, float32 ``(1, 3, 1, 1)`` on ``device``."""
    return tuple(torch.tensor(v, device=device).view(1, 3, 1, 1) * 255
                 for v in (IMAGENET_MEAN, IMAGENET_STD))


def normalize(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
              channels_last: bool = False, memory: BatchMemory | None = None) -> torch.Tensor:
    """CPU uint8 ``(N, 3, H, W)`` -> float32 ``(images - mean) / std``, NCHW or channels-last, in
    new memory or ``memory``'s; ``mean``/``std``: float32 ``(1, 3, 1, 1)`` on the 0-255 scale."""
    out = float_batch(images.shape, images.device, channels_last, memory=memory)
    return normalize_each(images, out, mean, std)


def float_batch(shape, device: torch.device, channels_last: bool = False,
                dtype: torch.dtype = torch.float32,
                memory: BatchMemory | None = None) -> torch.Tensor:
    """An uninitialised ``(N, 3, H, W)`` batch of ``dtype``, NCHW or channels-last; on the CPU in
    ``memory``'s buffers if given, else in new memory."""
    if memory is not None and torch.device(device).type == "cpu":
        return memory.empty(shape, channels_last, dtype)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    return torch.empty(shape, dtype=dtype, device=device, memory_format=memory_format)


class BatchMemory:
    """CPU batches in memory used again once nothing holds it. glibc gives a batch new pages each
    time, faulted in one by one even with ``decode.retain_freed_memory``'s thresholds: 64 images
    at 224 px (38.5 MB of float32) are normalised in 13.8 ms into new memory (9,408 page faults),
    2.2 ms into used memory (one core); on a 2-core host that time is the workers' lost."""

    def __init__(self, keep: int = 3):
        self.keep = keep  # buffers at most (a consumer holds one or two batches as it steps)
        # [uint8 buffer, weak reference to the array a tensor's storage holds, or None]
        self._buffers: list[list] = []
        self._lock = threading.Lock()  # feed threads may ask at once

    def empty(self, shape, channels_last: bool = False,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """An uninitialised CPU ``(N, 3, H, W)`` batch of ``dtype``, NCHW or channels-last, in a
        free buffer, else a new one (kept while fewer than ``keep``), as :func:`float_batch`."""
        n, c, h, w = shape
        size = n * c * h * w * dtype.itemsize
        with self._lock:
            entry = next((entry for entry in self._buffers if entry[0].nbytes >= size
                          and (entry[1] is None or entry[1]() is None)), None)
            if entry is None:
                if len(self._buffers) >= self.keep:
                    return float_batch(shape, torch.device("cpu"), channels_last, dtype)
                entry = [np.empty(size, np.uint8), None]
                self._buffers.append(entry)
            # The tensor's storage (every view of it) holds ``part``: the buffer is free again
            # once ``part`` is gone.
            part = entry[0][:size]
            entry[1] = weakref.ref(part)
            flat = torch.from_numpy(part).view(dtype)
        if channels_last:
            return flat.view(n, h, w, c).permute(0, 3, 1, 2)
        return flat.view(n, c, h, w)

    def clear(self) -> None:
        """Let the kept buffers go (those in use live on in their tensors)."""
        with self._lock:
            self._buffers = []


def normalize_each(images: Iterable[torch.Tensor], out: torch.Tensor, mean: torch.Tensor,
                   std: torch.Tensor) -> torch.Tensor:
    """CPU: each uint8 ``(3, H, W)`` image normalised into ``out[i]`` (float32, returned), image
    by image to stay in cache (2.0 vs 2.9 ms for 64 at 224 px); ``ValueError`` if counts differ."""
    scale, shift = 1 / std[0], -mean[0] / std[0]
    images = iter(images)
    for count, target in enumerate(out):
        image = next(images, None)
        if image is None:
            raise ValueError(f"normalize_each: {count} images for a batch of {len(out)}")
        target.copy_(image).mul_(scale).add_(shift)
    if next(images, None) is not None:
        raise ValueError(f"normalize_each: more images than the batch of {len(out)}")
    return out


def normalize_into(images: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                   dtype: torch.dtype, channels_last: bool,
                   memory: BatchMemory | None = None) -> torch.Tensor:
    """uint8 ``(N, 3, H, W)`` -> ``dtype`` ``images * scale + shift`` in one pass (float32
    ``(1, 3, 1, 1)`` ``1/std``, ``-mean/std``: within 2.4e-7 of ``(images - mean) / std``), in
    new memory or, on the CPU, ``memory``'s."""
    out = float_batch(images.shape, images.device, channels_last, dtype, memory)
    return torch.addcmul(shift, images, scale, out=out)
