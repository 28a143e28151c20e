"""CPU-side decode and augmentation to uint8, shared by the folder and LMDB backends.

The recipe is pytorch/examples imagenet/main.py's: training RandomResizedCrop(224) (scale
0.08-1, ratio 3/4-4/3, Szegedy et al. 2015) plus horizontal flip; validation Resize(256) +
CenterCrop(224). Normalisation is left to the device (``loaders._common.DeviceLoader``),
so these transforms end in ``PILToTensor``: uint8 ``(3, H, W)``.
"""
from __future__ import annotations

import io
from importlib import metadata

from PIL import Image
from torchvision import transforms


def train_transform(crop_size: int = 224):
    """PIL RGB image -> uint8 tensor ``(3, crop_size, crop_size)``, randomly cropped and flipped."""
    return transforms.Compose([
        transforms.RandomResizedCrop(crop_size),
        transforms.RandomHorizontalFlip(),
        transforms.PILToTensor(),
    ])


def val_transform(resize_size: int = 256, crop_size: int = 224):
    """PIL RGB image -> uint8 tensor ``(3, crop_size, crop_size)``: shorter side to
    ``resize_size``, then the central ``crop_size`` square."""
    return transforms.Compose([
        transforms.Resize(resize_size),
        transforms.CenterCrop(crop_size),
        transforms.PILToTensor(),
    ])


def build_transform(args, train: bool):
    """The transform for one split from ``--train-crop-size``, ``--val-resize-size``,
    ``--val-crop-size`` (torchvision references' flags; defaults 224/256/224)."""
    if train:
        return train_transform(args.train_crop_size)
    return val_transform(args.val_resize_size, args.val_crop_size)


def decode_rgb(data: bytes) -> Image.Image:
    """Decode encoded image bytes (JPEG, or any format PIL reads) to an RGB PIL image.

    Grayscale and CMYK JPEGs are converted to RGB, as torchvision's ``pil_loader`` does.
    Raises ``PIL.UnidentifiedImageError`` / ``OSError`` on bytes that are not an image.
    """
    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


def image_library() -> str:
    """Name and version of the installed PIL distribution, e.g. ``"Pillow-SIMD 9.5.0.post2"``."""
    for dist in ("Pillow-SIMD", "Pillow"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    import PIL

    return f"PIL {PIL.__version__}"
