"""The one resize of decoded windows: the JPEG and raw-record paths and the batch decoder
(:mod:`decode.gpu`)."""
from __future__ import annotations

import torch
import torch.nn.functional as nnf


def resize(image: torch.Tensor, size: tuple[int, int], interpolation: str = "bilinear",
           dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """uint8 ``(3, h, w)`` -> ``(3, *size)`` of ``dtype``: bilinear or bicubic antialiased, as
    PIL's resize under torchvision, or nearest; uint8 channels-last (``interpolate``'s uint8
    kernels), float32 unrounded (CUDA's kernels take floats)."""
    batch = image.unsqueeze(0)
    if dtype == torch.uint8:
        batch = batch.contiguous(memory_format=torch.channels_last)
    else:
        batch = batch.to(dtype)
    if interpolation == "nearest":
        return nnf.interpolate(batch, size=size, mode="nearest")[0]
    return nnf.interpolate(batch, size=size, mode=interpolation, antialias=True,
                           align_corners=False)[0]


def resize_window(crop: torch.Tensor, size: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """:func:`resize`, bilinear, to ``dtype``: the batch decoder's."""
    return resize(crop, size, "bilinear", dtype)


def resize_in_frame(crop: torch.Tensor, region, frame, size: tuple[int, int],
                    dtype: torch.dtype) -> torch.Tensor:
    """uint8 ``(3, h, w)`` pixels of ``region`` = ``(top, left, h, w)`` -> ``(3, *size)`` of
    ``dtype``: placed in a zero image of size ``frame[:2]``, resized to ``frame[2:4]``
    (:func:`resize_window`) and cropped at ``frame[4:6]`` = ``(top, left)``. Where the region
    covers the filter's reach around the crop (``loaders.transforms.center_crop_plan``), these
    equal the whole image's resize-then-crop pixels."""
    top, left, height, width = region
    full_h, full_w, new_h, new_w, crop_top, crop_left = frame
    canvas = torch.zeros((3, full_h, full_w), dtype=crop.dtype, device=crop.device)
    canvas[:, top:top + height, left:left + width] = crop
    out = resize_window(canvas, (new_h, new_w), dtype)
    return out[:, crop_top:crop_top + size[0], crop_left:crop_left + size[1]]
