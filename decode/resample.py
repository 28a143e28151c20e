"""Resampling a uint8 image or window to an output size: the one resize of the JPEG and the
raw-record paths (:func:`decode.decode_window`, :func:`decode.raw.raw_window`), and the batch
decoder's (:mod:`decode.gpu`: :func:`resize_window`, :func:`resize_in_frame`)."""
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


def resize_window(crop: torch.Tensor, size: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """uint8 ``(3, h, w)`` -> ``(3, *size)`` of ``dtype``, bilinear with antialiasing (PIL's
    ``BILINEAR``, as the CPU loaders resize: :func:`decode.resize`). uint8 on the CPU runs
    torch's channels-last uint8 kernel, the CPU loaders' own (equal pixels for equal crops);
    float32 on CUDA (torch's antialiased kernels take floats there) keeps the unrounded
    values, normalised next."""
    if dtype == torch.uint8:
        batch = crop.unsqueeze(0).contiguous(memory_format=torch.channels_last)
    else:
        batch = crop.unsqueeze(0).to(dtype)
    return nnf.interpolate(batch, size=size, mode="bilinear", antialias=True,
                           align_corners=False)[0]


def resize_in_frame(crop: torch.Tensor, region, frame, size: tuple[int, int],
                    dtype: torch.dtype) -> torch.Tensor:
    """uint8 ``(3, h, w)`` pixels of ``region`` = ``(top, left, h, w)`` -> ``(3, *size)`` of
    ``dtype``: placed in a zero image of the full size ``frame[:2]``, resized to
    ``frame[2:4]`` (:func:`resize_window`) and cropped at ``frame[4:6]`` = ``(top, left)``.
    Where the region covers the filter's reach around the crop (``loaders.transforms.
    center_crop_plan``), these are the whole image's resize-then-crop pixels, from a decode
    of the region only."""
    top, left, height, width = region
    full_h, full_w, new_h, new_w, crop_top, crop_left = frame
    canvas = torch.zeros((3, full_h, full_w), dtype=crop.dtype, device=crop.device)
    canvas[:, top:top + height, left:left + width] = crop
    out = resize_window(canvas, (new_h, new_w), dtype)
    return out[:, crop_top:crop_top + size[0], crop_left:crop_left + size[1]]
