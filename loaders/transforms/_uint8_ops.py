"""The auto-augment ops on uint8 ``(3, H, W)`` tensors with torchvision 0.29's pixels: :data:`OPS`
maps its transform ids to ``op(image, magnitude, interpolation)``; its kernels where as fast, the
same bits cheaper elsewhere (``benchmarks/training/recipes.py``). ``bicubic``: ``grid_sample``'s,
clamped (torchvision's tensor kernels refuse it)."""
from __future__ import annotations

import math
import os
from functools import lru_cache, partial

import numpy as np
import torch
import torch.nn.functional as nnf
from torchvision.transforms.v2 import functional as F

_LEVELS = torch.arange(256, dtype=torch.uint8)


def sharpness(image, magnitude, interpolation=None):
    """torchvision's ``adjust_sharpness_image``: inner pixels blended with their 3x3 blur (weights
    1, centre 5, /13, rounded: exact, as no such sum is within 1/26 of a rounding edge)."""
    factor = 1.0 + magnitude
    height, width = image.shape[-2:]
    if height <= 2 or width <= 2:
        return image
    wide = image.to(torch.int16)  # 13 x 255 fits
    rows = wide[:, :, :-2] + wide[:, :, 1:-1] + wide[:, :, 2:]  # 3-wide sums, then 3-high
    total = rows[:, :-2] + rows[:, 1:-1] + rows[:, 2:] + wide[:, 1:-1, 1:-1] * 4
    blurred = torch.div(total * 2 + 13, 26, rounding_mode="floor").to(torch.float32)  # rounded
    output = image.to(torch.float32)
    view = output[..., 1:-1, 1:-1]
    view.add_(blurred.sub_(view), alpha=(1.0 - factor))
    return output.clamp_(0, 255).to(torch.uint8)


def _lut(image: torch.Tensor, table: np.ndarray) -> torch.Tensor:
    """``image`` through uint8 ``table`` (``(256,)``, or ``(3, 256)`` per channel) by NumPy's
    indexing (torch's costs 4-5x more): exact for any per-value map."""
    pixels = image.numpy()
    if table.ndim == 1:
        return torch.from_numpy(np.take(table, pixels))
    return torch.from_numpy(np.stack([np.take(table[c], pixels[c]) for c in range(3)]))


def solarize(image, magnitude, interpolation=None):
    """torchvision's ``solarize_image`` (float32 threshold ``255 x magnitude``) by a lookup."""
    threshold = torch.tensor(255.0 * magnitude, dtype=torch.float32)
    if threshold > 255:
        return image
    return _lut(image, torch.where(_LEVELS >= threshold, _LEVELS.bitwise_not(), _LEVELS).numpy())


def equalize(image, magnitude=0.0, interpolation=None):
    """torchvision's ``equalize_image`` (PIL's scheme) in NumPy integers: 0.19 vs 0.29 ms for
    torchvision's kernel at 176 px, one thread."""
    pixels = image.numpy()
    tables = []
    for c in range(3):
        hist = np.bincount(pixels[c].reshape(-1), minlength=256)
        step = (hist.sum() - hist[np.flatnonzero(hist)[-1]]) // 255
        below = np.cumsum(hist) - hist  # pixels under each level: level 0 maps to 0
        table = np.arange(256) if step == 0 else (below + step // 2) // step
        tables.append(np.clip(table, 0, 255).astype(np.uint8))
    return _lut(image, np.stack(tables))


@lru_cache(maxsize=8)
def _base_grid(height: int, width: int) -> torch.Tensor:
    """torchvision's ``_affine_grid`` base: float32 ``(1, H x W, 3)`` of ``(x, y, 1)``, centred."""
    base = torch.empty(1, height, width, 3)
    base[..., 0].copy_(torch.linspace((1.0 - width) * 0.5, (width - 1.0) * 0.5, steps=width))
    base[..., 1].copy_(torch.linspace((1.0 - height) * 0.5, (height - 1.0) * 0.5,
                                      steps=height).unsqueeze_(-1))
    base[..., 2].fill_(1)
    return base.view(1, height * width, 3)


def inverse_affine_matrix(center, angle: float, shear) -> list[float]:
    """torchvision's ``_get_inverse_affine_matrix`` at scale 1, no translation (degrees)."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    cx, cy = center
    a = math.cos(rot - sy) / math.cos(sy)
    b = -(a * math.tan(sx) + math.sin(rot))
    c = math.sin(rot - sy) / math.cos(sy)
    d = math.cos(rot) - c * math.tan(sx)
    matrix = [d, -b, 0.0, -c, a, 0.0]
    matrix[2] += cx - matrix[0] * cx - matrix[1] * cy
    matrix[5] += cy - matrix[3] * cx - matrix[4] * cy
    return matrix


def _grid(matrix: list[float], height: int, width: int, separable: bool | None = None):
    """torchvision's ``_affine_grid``, float32 ``(1, H, W, 2)``: by ``bmm``, or ``separable`` as
    two outer sums (0.03 vs 0.4 ms at 176 px; None: where :func:`_separable_is_exact`)."""
    theta = torch.tensor(matrix, dtype=torch.float32).reshape(1, 2, 3)
    scale = torch.tensor([0.5 * width, 0.5 * height], dtype=torch.float32)
    rescaled = theta.transpose(1, 2).div_(scale)[0]  # (3, 2)
    if not (_separable_is_exact() if separable is None else separable):
        return _base_grid(height, width).bmm(rescaled[None]).view(1, height, width, 2)
    base = _base_grid(height, width).view(height, width, 3)
    xs, ys = base[0, :, 0], base[:, 0, 1]
    return torch.stack([(xs[None, :] * rescaled[0, k] + (ys * rescaled[1, k])[:, None])
                        + rescaled[2, k] for k in range(2)], dim=-1).unsqueeze(0)


@lru_cache(maxsize=1)
def _separable_is_exact() -> bool:
    """Whether the separable grid equals the ``bmm`` one bit for bit on this machine's BLAS,
    checked once per process."""
    if os.environ.get("IMAGENET_AUGMENT_BMM_GRID") == "1":  # tests: the bmm fallback
        return False
    return all(torch.equal(_grid(m, 176, 160, True), _grid(m, 176, 160, False))
               for m in ([1.0, -0.7, 61.6, 0.0, 1.0, 0.0], [0.8, -0.6, 0.0, 0.6, 0.8, 0.0]))


def warp(image: torch.Tensor, matrix: list[float], interpolation: str) -> torch.Tensor:
    """``image`` resampled through the inverse affine ``matrix`` (pixel units about the centre)
    as torchvision's tensor ``affine``/``rotate``: ``grid_sample`` with zero padding, rounded."""
    height, width = image.shape[-2:]
    out = nnf.grid_sample(image.to(torch.float32).unsqueeze(0), _grid(matrix, height, width),
                          mode=interpolation, padding_mode="zeros", align_corners=False)
    if interpolation == "bicubic":
        out = out.clamp_(0, 255)
    return out.round_().to(torch.uint8)[0]


def _shear(image, magnitude, interpolation="bilinear", axis=0):
    height, width = image.shape[-2:]
    degrees = math.degrees(math.atan(magnitude))
    shear = [degrees, 0.0] if axis == 0 else [0.0, degrees]
    matrix = inverse_affine_matrix([-width * 0.5, -height * 0.5], 0.0, shear)
    return warp(image, matrix, interpolation)


def _translate(image: torch.Tensor, dx: int, dy: int) -> torch.Tensor:
    """``image`` moved ``dx`` px right and ``dy`` down, zero-filled: torchvision's resampling at
    whole-pixel offsets (its points land on pixel centres)."""
    height, width = image.shape[-2:]
    out = torch.zeros_like(image)
    if abs(dx) >= width or abs(dy) >= height:
        return out
    out[:, max(dy, 0):height + min(dy, 0), max(dx, 0):width + min(dx, 0)] = \
        image[:, max(-dy, 0):height + min(-dy, 0), max(-dx, 0):width + min(-dx, 0)]
    return out


def rotate(image, magnitude, interpolation="bilinear"):
    """torchvision's ``rotate_image`` (no expansion, about the centre), with its exact fast
    paths: 0 (a copy), 180 and, for a square image, 90 and 270 degrees (``rot90``)."""
    angle = magnitude % 360
    height, width = image.shape[-2:]
    if angle == 0:
        return image.clone()
    if angle == 180 or (height == width and angle in (90, 270)):
        return torch.rot90(image, k=int(angle // 90), dims=(-2, -1))
    matrix = inverse_affine_matrix([0.0, 0.0], -angle, [0.0, 0.0])
    return warp(image, matrix, interpolation)


shear_x, shear_y = partial(_shear, axis=0), partial(_shear, axis=1)

OPS = {  # torchvision's transform ids (_AutoAugmentBase._apply_image_or_video_transform) -> op
    "Identity": lambda image, magnitude, interpolation: image,
    "ShearX": shear_x, "ShearY": shear_y,
    "TranslateX": lambda image, magnitude, interpolation: _translate(image, int(magnitude), 0),
    "TranslateY": lambda image, magnitude, interpolation: _translate(image, 0, int(magnitude)),
    "Rotate": rotate, "Sharpness": sharpness, "Solarize": solarize,
    "Equalize": equalize,
    "Contrast": lambda image, magnitude, interpolation: F.adjust_contrast_image(
        image, 1.0 + magnitude),
    "Brightness": lambda image, magnitude, interpolation: F.adjust_brightness_image(
        image, 1.0 + magnitude),
    "Color": lambda image, magnitude, interpolation: F.adjust_saturation_image(
        image, 1.0 + magnitude),
    "Posterize": lambda image, magnitude, interpolation: F.posterize_image(image, int(magnitude)),
    "AutoContrast": lambda image, magnitude, interpolation: F.autocontrast_image(image),
    "Invert": lambda image, magnitude, interpolation: F.invert_image(image),
}
