"""The crops: encoded bytes to a uint8 crop, decoded on the CPU (the DataLoader-workers pipeline's
transforms; the other pipelines draw the same windows with :meth:`TrainTransform.window`).

The recipe is pytorch/examples imagenet/main.py's: training RandomResizedCrop(224) (scale
0.08-1, ratio 3/4-4/3, Szegedy et al. 2015) plus horizontal flip; validation Resize(256) +
CenterCrop(224); torchvision's recipes add an ``--auto-augment`` policy on the training crop
(``loaders.transforms.auto_augment``) and ``--interpolation``. Normalisation is left to the device
(``loaders.pipelines.workers``).

Each transform takes the encoded file bytes and returns a uint8 ``(3, H, W)`` tensor. Measured
on real ImageNet JPEGs (``benchmarks/profile_transforms.py``, docs/performance.md): decoding only
the crop window (``decode.jpeg_window``, the cascade of :func:`decode.decode_window`), or else
the whole image with libjpeg-turbo (``decode.libraries``), and resizing the uint8 crop with torch's antialiased bilinear kernel
(channels-last) takes 1.27 ms per training image against 2.41 ms for PIL's decode + crop +
resize + ToTensor + Normalize, with the same random crop parameters (torchvision's
``RandomResizedCrop.get_params``).
"""
from __future__ import annotations

import math
import time

import torch

import decode as decoding
from decode import decode, jpeg_region, jpeg_scaled, resize

from ..settings import LoaderSettings
from ..timing import stages
from .auto_augment import make_auto_augment

# RandomResizedCrop's ranges (Szegedy et al. 2015; torchvision's defaults, also DALI's in
# NVIDIA DeepLearningExamples RN50): area share of the image, and aspect ratio of the window.
RRC_SCALE = (0.08, 1.0)
RRC_RATIO = (3 / 4, 4 / 3)
RRC_ATTEMPTS = 10  # torchvision's RandomResizedCrop.get_params tries 10 random windows
_DRAWS = 4 * RRC_ATTEMPTS + 1  # four uniforms per attempt, one for the flip


def random_resized_crop_params(height: int, width: int, scale: tuple[float, float],
                               ratio: tuple[float, float], draws: list[float]):
    """``(top, left, h, w)`` of a RandomResizedCrop window in a ``height x width`` image.

    torchvision's ``RandomResizedCrop.get_params`` algorithm (Szegedy et al. 2015): up to 10
    attempts at an area share uniform in ``scale`` and an aspect ratio log-uniform in
    ``ratio``, the window placed uniformly; if none fits, the central crop with the ratio
    clamped to ``ratio``. The uniforms in [0, 1) come from ``draws`` (four per attempt), not
    five torch RNG calls per attempt, which cost 0.08 ms per image (about 6% of a sample).
    """
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
    """Encoded bytes -> uint8 ``(3, crop_size, crop_size)``: RandomResizedCrop + flip (p=0.5),
    then ``augment`` if given (an ``--auto-augment`` policy, ``.auto_augment``, on the
    uint8 crop: torchvision's ``ClassificationPresetTrain`` order).

    The crop window is drawn from the JPEG header's size. A window at least twice the output
    on both sides is decoded at libjpeg-turbo's DCT scale 1/2, 1/4 or 1/8 and resampled from
    there (``decode.jpeg_scaled``); otherwise only that window is decoded
    (``decode.jpeg_window``), else the whole image; resized with ``interpolation``
    (``--interpolation``: ``bilinear``, ``bicubic``, ``nearest``, antialiased but the last).
    Random draws come from torch's global RNG, which the loaders seed per batch
    (``loaders.pipelines.workers.slots.SlotWriter``): the same draws, hence the same window,
    whichever way it is decoded; the policy's draws follow the crop's.

    ``clock`` (a :class:`loaders.timing.stages.StageClock`, set by the pipeline; None: not measured)
    gets each image's window draw, decode (and decoder), resize and flip + policy seconds and
    the stored image's longer side; the pixels and draws are the same either way.
    """

    clock = None

    def __init__(self, crop_size: int = 224, scale=RRC_SCALE, ratio=RRC_RATIO,
                 augment=None, interpolation: str = "bilinear"):
        self.size, self.scale, self.ratio = (crop_size, crop_size), scale, ratio
        self.augment, self.interpolation = augment, interpolation
        self._side = 0  # the last image's longer side (px), for the clock

    def __call__(self, data: bytes) -> torch.Tensor:
        if self.clock is not None:
            return self._timed(data, self.clock)
        window, flip, image = self.window(data)
        out = decoding.decode_window(data, window, self.size, image,
                                     interpolation=self.interpolation)
        out = out.flip(-1) if flip else out
        return out if self.augment is None else self.augment(out)

    def _timed(self, data: bytes, clock) -> torch.Tensor:
        """:meth:`__call__` with each stage's seconds added to ``clock.t``."""
        t, marks = clock.t, clock.marks
        start = time.perf_counter()
        window, flip, image = self.window(data)
        drawn = time.perf_counter()
        marks.clear()
        out = decoding.decode_window(data, window, self.size, image,
                                     interpolation=self.interpolation, marks=marks)
        resized = time.perf_counter()
        if image is not None:  # decoded whole in window(), for its size: that is the decode
            t[stages.DECODE] += drawn - start
            decoded = drawn
        else:
            t[stages.WINDOW] += drawn - start
            decoded = marks[1]
            t[stages.DECODE] += decoded - drawn
        t[stages.RESIZE] += resized - decoded
        t[stages.KIND] = stages.KIND_CODES[marks[0]]
        t[stages.SIDE] = self._side
        out = out.flip(-1) if flip else out
        out = out if self.augment is None else self.augment(out)
        t[stages.AUGMENT] += time.perf_counter() - resized
        return out

    def window(self, data: bytes, size_of=None):
        """``(window, flip, image)``: this sample's RandomResizedCrop window ``(top, left,
        height, width)`` in pixels of the stored image, whether to flip it, and the whole
        decode where it was needed for the size (else None). The draws (``_DRAWS`` uniforms
        from torch's global RNG) are taken first, so every pipeline that calls this draws the
        same window for the same seed (``loaders.pipelines.gpu_decode``'s workers too).
        ``size_of(data) -> (height, width) | None`` reads the size of what ``jpeg_size`` does
        not (e.g. ``decode.image_size``) before the whole image is decoded for it. Raises what
        :func:`decode.decode` raises for bytes that are not an image."""
        draws = torch.rand(_DRAWS).tolist()
        size = decoding.window_size(data)  # a JPEG's or a raw record's header
        if size is None and size_of is not None:
            size = size_of(data)
        image = decode(data) if size is None else None
        height, width = size if size is not None else image.shape[-2:]
        self._side = max(height, width)
        window = random_resized_crop_params(height, width, self.scale, self.ratio, draws)
        return window, draws[-1] < 0.5, image


class ValTransform:
    """Encoded bytes -> uint8 ``(3, crop_size, crop_size)``: shorter side to ``resize_size``
    (the longer scaled alike, truncated, as torchvision's ``Resize``), then the central square.
    A JPEG whose shorter side is at least twice ``resize_size`` is decoded at libjpeg-turbo's
    DCT scale and only the central square resampled (``decode.jpeg_scaled``); where
    ``decode/_jpegcrop.so`` is built, any JPEG is decoded only down to the square's last row
    and across its columns, at 1/1 or that scale, and PIL resamples the square from there
    (within 2 levels of resize-then-crop, mean under 0.003 on the sample)."""

    def __init__(self, resize_size: int = 256, crop_size: int = 224,
                 interpolation: str = "bilinear"):
        self.resize_size, self.crop_size = resize_size, crop_size
        self.interpolation = interpolation

    def __call__(self, data: bytes) -> torch.Tensor:
        size = decoding.jpeg_size(data) if self.interpolation != "nearest" else None
        if size is not None:
            short = min(size)
            factor = jpeg_scaled.scale_factor(short, short, self.resize_size, self.resize_size)
            # at 1/1 too where our C decodes just the region: 1.29 vs 1.58 ms per image on the
            # sample (profile_transforms.py), within 2 levels
            if factor > 1 or (jpeg_scaled.enabled() and jpeg_region.available()):
                out = jpeg_scaled.resized_window(data, factor, center_crop_box(
                    *size, self.resize_size, self.crop_size), (self.crop_size,) * 2,
                    self.interpolation)
                if out is not None:
                    return out
        return resize_center_crop(decode(data), self.resize_size, self.crop_size,
                                  self.interpolation)


def _resized_shape(height: int, width: int, resize_size: int) -> tuple[int, int]:
    """torchvision ``Resize(resize_size)``'s output size: the shorter side ``resize_size``, the
    longer scaled alike and truncated."""
    short, long = sorted((height, width))
    new_long = int(resize_size * long / short)
    return (resize_size, new_long) if height <= width else (new_long, resize_size)


def center_crop_box(height: int, width: int, resize_size: int, crop_size: int):
    """``(top, left, bottom, right)`` in pixels of a ``height x width`` image (fractional) of
    the square that ``Resize(resize_size)`` + ``CenterCrop(crop_size)`` keep."""
    size = _resized_shape(height, width, resize_size)
    top = int(round((size[0] - crop_size) / 2.0))
    left = int(round((size[1] - crop_size) / 2.0))
    sy, sx = height / size[0], width / size[1]
    return top * sy, left * sx, (top + crop_size) * sy, (left + crop_size) * sx


def center_crop_plan(height: int, width: int, resize_size: int, crop_size: int):
    """``(region, frame)`` for a decoder that decodes an integer region of a ``height x width``
    image and then resamples it as :func:`resize_center_crop` would the whole image
    (``loaders.pipelines.gpu_decode``): ``region`` = ``(top, left, height, width)`` in whole
    pixels, :func:`center_crop_box` widened by the bilinear filter's reach (the scale + 2
    pixels) on each side, clamped to the image; ``frame`` = ``(height, width, resized height,
    resized width, crop top, crop left)``: the region placed in an image of the full size,
    resized to torchvision ``Resize``'s size and cropped at the central square gives
    :func:`resize_center_crop`'s pixels."""
    size = _resized_shape(height, width, resize_size)
    crop_top = int(round((size[0] - crop_size) / 2.0))
    crop_left = int(round((size[1] - crop_size) / 2.0))
    box = center_crop_box(height, width, resize_size, crop_size)
    reach = (math.ceil(height / size[0]) + 2, math.ceil(width / size[1]) + 2)
    top, left = (max(0, math.floor(v) - r) for v, r in zip(box[:2], reach))
    bottom = min(height, math.ceil(box[2]) + reach[0])
    right = min(width, math.ceil(box[3]) + reach[1])
    return (top, left, bottom - top, right - left), (height, width, *size, crop_top, crop_left)


def resize_center_crop(image: torch.Tensor, resize_size: int, crop_size: int,
                       interpolation: str = "bilinear") -> torch.Tensor:
    """uint8 ``(3, h, w)`` -> uint8 ``(3, crop_size, crop_size)``: torchvision's ``Resize`` of
    the shorter side to ``resize_size`` (the longer side scaled alike, truncated) and
    ``CenterCrop``, as pytorch/examples' validation transform (``interpolation``: the resize's
    filter, :func:`decode.resize`)."""
    size = _resized_shape(*image.shape[-2:], resize_size)
    out = resize(image, size, interpolation)
    top = int(round((size[0] - crop_size) / 2.0))
    left = int(round((size[1] - crop_size) / 2.0))
    return out[:, top:top + crop_size, left:left + crop_size]


def split_transform(settings: LoaderSettings, train: bool):
    """One split's transform at ``settings``' sizes in pixels (``--train-crop-size``,
    ``--val-resize-size``, ``--val-crop-size``: torchvision references' flags) and
    ``--interpolation``, training crops augmented by the ``--auto-augment`` policy."""
    if train:
        augment = make_auto_augment(settings.auto_augment, settings.interpolation,
                                    settings.ra_magnitude, settings.augmix_severity)
        return TrainTransform(settings.train_crop_size, augment=augment,
                              interpolation=settings.interpolation)
    return ValTransform(settings.val_resize_size, settings.val_crop_size, settings.interpolation)
