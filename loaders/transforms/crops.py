"""Encoded bytes to a uint8 ``(3, H, W)`` crop as pytorch/examples imagenet/main.py, decoding only
the window: 1.27 ms per image, PIL 2.41 ms (``benchmarks.loading.transforms``)."""
from __future__ import annotations

import math

import torch

import decode as decoding
from decode import decode, jpeg, resize

from ..settings import LoaderSettings
from .auto_augment import make_auto_augment

# RandomResizedCrop's area-share and aspect-ratio ranges: torchvision's (Szegedy et al. 2015)
RRC_SCALE = (0.08, 1.0)
RRC_RATIO = (3 / 4, 4 / 3)
RRC_ATTEMPTS = 10  # torchvision's RandomResizedCrop.get_params tries 10 random windows
_DRAWS = 4 * RRC_ATTEMPTS + 1  # four uniforms per attempt, one for the flip


def random_resized_crop_params(height: int, width: int, scale: tuple[float, float],
                               ratio: tuple[float, float], draws: list[float]):
    """``(top, left, h, w)``: torchvision's ``RandomResizedCrop.get_params``, its [0, 1)
    uniforms from ``draws`` (four per attempt), not torch RNG calls (0.08 ms)."""
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for k in range(RRC_ATTEMPTS):
        u_area, u_ratio, u_top, u_left = draws[4 * k:4 * k + 4]
        target_area = area * (scale[0] + u_area * (scale[1] - scale[0]))
        aspect = math.exp(log_lo + u_ratio * (log_hi - log_lo))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(u_top * (height - h + 1)), int(u_left * (width - w + 1)), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class TrainTransform:
    """Encoded bytes -> uint8 ``(3, crop_size, crop_size)``: RandomResizedCrop + flip (p=0.5), then
    ``augment``, as torchvision's ``ClassificationPresetTrain``; draws from torch's global RNG.
    ``loaders.timing.stages.timed_transform`` times its stages."""

    def __init__(self, crop_size: int = 224, scale=RRC_SCALE, ratio=RRC_RATIO,
                 augment=None, interpolation: str = "bilinear"):
        self.size, self.scale, self.ratio = (crop_size, crop_size), scale, ratio
        self.augment, self.interpolation = augment, interpolation
        self.side = 0  # the last image's longer side (px), for the stage figures

    def __call__(self, data: bytes, frame=None) -> torch.Tensor:
        """``frame``: the :class:`decode.acceptance.Frame` of ``data``, if read."""
        window, flip, image = self.window(data, frame=frame)
        kind, pixels = decoding.decode_crop(data, window, self.size, image, self.interpolation,
                                            frame)
        return self.augmented(self.resized(kind, pixels), flip)

    def resized(self, kind: str, pixels: torch.Tensor) -> torch.Tensor:
        """:func:`decode.decode_crop`'s ``pixels`` at the crop size (the scaled decoder's are)."""
        return pixels if kind == "scaled" else resize(pixels, self.size, self.interpolation)

    def augmented(self, out: torch.Tensor, flip: bool) -> torch.Tensor:
        """The horizontal flip drawn, then the ``--auto-augment`` policy."""
        out = out.flip(-1) if flip else out
        return out if self.augment is None else self.augment(out)

    def window(self, data: bytes, size_of=None, frame=None):
        """``(window (top, left, height, width), flip, the whole decode if the size needed it)``;
        its ``_DRAWS`` uniforms first, as in every pipeline. Raises as :func:`decode.decode`."""
        draws = torch.rand(_DRAWS).tolist()
        size = decoding.window_size(data, frame)
        if size is None and size_of is not None:
            size = size_of(data)
        image = decode(data) if size is None else None
        height, width = size if size is not None else image.shape[-2:]
        self.side = max(height, width)
        window = random_resized_crop_params(height, width, self.scale, self.ratio, draws)
        return window, draws[-1] < 0.5, image


class ValTransform:
    """Encoded bytes -> uint8 ``(3, crop_size, crop_size)``: ``Resize`` + ``CenterCrop``, a JPEG's
    square decoded alone at a DCT scale (within 2 levels of resize-then-crop)."""

    def __init__(self, resize_size: int = 256, crop_size: int = 224,
                 interpolation: str = "bilinear"):
        self.resize_size, self.crop_size = resize_size, crop_size
        self.interpolation = interpolation

    def __call__(self, data: bytes, frame=None) -> torch.Tensor:
        size = None if self.interpolation == "nearest" or decoding.is_raw(data) else \
            decoding.window_size(data, frame)
        if size is not None:
            short = min(size)
            factor = jpeg.scaled.scale_factor(short, short, self.resize_size, self.resize_size)
            # at 1/1 too where our C decodes just the region: 1.29 vs 1.58 ms, within 2 levels
            if factor > 1 or (jpeg.scaled.enabled() and jpeg.region.available()):
                out = jpeg.scaled.resized_window(data, factor, center_crop_box(
                    *size, self.resize_size, self.crop_size), (self.crop_size,) * 2,
                    self.interpolation, size)
                if out is not None:
                    return out
        return resize_center_crop(decode(data), self.resize_size, self.crop_size,
                                  self.interpolation)


def _center_crop(height: int, width: int, resize_size: int, crop_size: int):
    """torchvision ``Resize(resize_size)``'s output ``(h, w)`` (the longer side truncated) and
    the ``top``, ``left`` corner of ``CenterCrop(crop_size)`` in it."""
    short, long = sorted((height, width))
    new_long = int(resize_size * long / short)
    size = (resize_size, new_long) if height <= width else (new_long, resize_size)
    return size, int(round((size[0] - crop_size) / 2.0)), int(round((size[1] - crop_size) / 2.0))


def center_crop_box(height: int, width: int, resize_size: int, crop_size: int):
    """``(top, left, bottom, right)`` in pixels of a ``height x width`` image (fractional) of
    the square that ``Resize(resize_size)`` + ``CenterCrop(crop_size)`` keep."""
    size, top, left = _center_crop(height, width, resize_size, crop_size)
    sy, sx = height / size[0], width / size[1]
    return top * sy, left * sx, (top + crop_size) * sy, (left + crop_size) * sx


def center_crop_plan(height: int, width: int, resize_size: int, crop_size: int):
    """``(region (top, left, height, width): the box widened by the filter's reach, clamped,
    frame (height, width, resized height, resized width, crop top, crop left))``: an integer
    region resampled as :func:`resize_center_crop` would the whole image."""
    size, crop_top, crop_left = _center_crop(height, width, resize_size, crop_size)
    box = center_crop_box(height, width, resize_size, crop_size)
    reach = (math.ceil(height / size[0]) + 2, math.ceil(width / size[1]) + 2)
    top, left = (max(0, math.floor(v) - r) for v, r in zip(box[:2], reach))
    bottom, right = (min(n, math.ceil(v) + r) for n, v, r in zip((height, width), box[2:], reach))
    return (top, left, bottom - top, right - left), (height, width, *size, crop_top, crop_left)


def resize_center_crop(image: torch.Tensor, resize_size: int, crop_size: int,
                       interpolation: str = "bilinear") -> torch.Tensor:
    """uint8 ``(3, h, w)`` -> uint8 ``(3, crop_size, crop_size)``: torchvision's ``Resize`` and
    ``CenterCrop``, pytorch/examples' validation (``interpolation``: :func:`decode.resize`'s)."""
    size, top, left = _center_crop(*image.shape[-2:], resize_size, crop_size)
    out = resize(image, size, interpolation)
    return out[:, top:top + crop_size, left:left + crop_size]


def split_transform(settings: LoaderSettings, train: bool):
    """One split's transform: ``settings``' sizes, ``--interpolation``, ``--auto-augment``."""
    if train:
        augment = make_auto_augment(settings.auto_augment, settings.interpolation,
                                    settings.ra_magnitude, settings.augmix_severity)
        return TrainTransform(settings.train_crop_size, augment=augment,
                              interpolation=settings.interpolation)
    return ValTransform(settings.val_resize_size, settings.val_crop_size, settings.interpolation)
