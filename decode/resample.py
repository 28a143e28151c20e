"""Resampling a uint8 image or window to an output size: the one resize of the JPEG and the
raw-record paths (:func:`decode.decode_window`, :func:`decode.raw.raw_window`)."""
from __future__ import annotations

import torch
import torch.nn.functional as nnf


def resize(image: torch.Tensor, size: tuple[int, int],
           interpolation: str = "bilinear") -> torch.Tensor:
    """uint8 ``(3, h, w)`` -> uint8 ``(3, *size)``, bilinear with antialiasing (as PIL's
    ``BILINEAR`` resize that torchvision applies to PIL images), on the channels-last uint8
    fast path of ``torch.nn.functional.interpolate``; ``interpolation`` ``"bicubic"``: bicubic
    with antialiasing, ``"nearest"``: nearest neighbour (torchvision's tensor ``resize`` of
    those modes, ``--interpolation``)."""
    batch = image.unsqueeze(0).contiguous(memory_format=torch.channels_last)
    if interpolation == "nearest":
        return nnf.interpolate(batch, size=size, mode="nearest")[0]
    return nnf.interpolate(batch, size=size, mode=interpolation, antialias=True,
                           align_corners=False)[0]
