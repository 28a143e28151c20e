"""Small ImageNet-layout JPEG datasets whose pixels encode the label (as ffcv's tests do).

Each image is its class's :func:`class_color` plus uniform noise of amplitude ``noise`` and
``shapes`` random grey rectangles, at a random size; with neither, :func:`label_from_pixels`
reads the label back from any crop; with noise the task is still learnable in a few epochs. A
seed gives the same files byte for byte on the same Pillow and libjpeg.
"""
from __future__ import annotations

import argparse
import colorsys
import os
import random

import numpy as np
from PIL import Image


def class_color(label: int, num_classes: int) -> tuple[int, int, int]:
    """RGB uint8 colour of class ``label``: hue ``label / num_classes`` at saturation 0.8."""
    r, g, b = colorsys.hsv_to_rgb(label / num_classes, 0.8, 0.9)
    return round(r * 255), round(g * 255), round(b * 255)


def label_from_pixels(image: np.ndarray, num_classes: int) -> int:
    """The class whose colour is nearest the mean of ``image`` (uint8 ``(3, H, W)`` or HWC)."""
    axes = (1, 2) if image.shape[0] == 3 else (0, 1)
    mean = image.reshape(image.shape).astype(np.float64).mean(axis=axes)
    dists = [np.sum((mean - np.array(class_color(c, num_classes))) ** 2) for c in range(num_classes)]
    return int(np.argmin(dists))


def make_image(label: int, num_classes: int, rng: random.Random, size: tuple[int, int],
               noise: int, shapes: int) -> Image.Image:
    """One RGB image of class ``label``, ``size`` = (width, height) pixels."""
    w, h = size
    base = np.array(class_color(label, num_classes), dtype=np.int16)
    nprng = np.random.default_rng(rng.getrandbits(32))
    pixels = np.broadcast_to(base, (h, w, 3)).copy()
    if noise:
        pixels += nprng.integers(-noise, noise + 1, size=(h, w, 3), dtype=np.int16)
    for _ in range(shapes):
        x0, y0 = rng.randrange(w), rng.randrange(h)
        pixels[y0:y0 + rng.randrange(1, h // 3 + 2), x0:x0 + rng.randrange(1, w // 3 + 2)] = rng.randrange(256)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")


def make_split(root: str, num_classes: int, per_class: int, seed: int, min_size: int = 64,
               max_size: int = 128, noise: int = 0, shapes: int = 0) -> list[tuple[str, int]]:
    """Write ``num_classes * per_class`` JPEGs under ``root/<wnid>/``; return (path, label)s.
    Folders are named like wnids (``n00000000``, ...), so sorted order is label order."""
    rng = random.Random(seed)
    written = []
    for label in range(num_classes):
        folder = os.path.join(root, f"n{label:08d}")
        os.makedirs(folder, exist_ok=True)
        for i in range(per_class):
            size = (rng.randint(min_size, max_size), rng.randint(min_size, max_size))
            path = os.path.join(folder, f"n{label:08d}_{i}.JPEG")
            make_image(label, num_classes, rng, size, noise, shapes).save(path, quality=90)
            written.append((path, label))
    return written


def make_dataset(root: str, num_classes: int = 4, train_per_class: int = 8,
                 val_per_class: int = 4, seed: int = 0, **image_kwargs) -> str:
    """``root/train`` and ``root/val`` in ImageNet layout (different images, same classes)."""
    make_split(os.path.join(root, "train"), num_classes, train_per_class, seed, **image_kwargs)
    make_split(os.path.join(root, "val"), num_classes, val_per_class, seed + 1, **image_kwargs)
    return root


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="output directory (gets train/ and val/)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--train-per-class", type=int, default=40)
    parser.add_argument("--val-per-class", type=int, default=10)
    parser.add_argument("--noise", type=int, default=60, help="uniform pixel noise amplitude")
    parser.add_argument("--shapes", type=int, default=3, help="random rectangles per image")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-size", type=int, default=64, help="smallest side in pixels")
    parser.add_argument("--max-size", type=int, default=128, help="largest side in pixels")
    args = parser.parse_args(argv)
    if not 1 <= args.min_size <= args.max_size:
        parser.error("--min-size and --max-size: 1 <= min <= max")
    make_dataset(args.root, args.classes, args.train_per_class, args.val_per_class, args.seed,
                 noise=args.noise, shapes=args.shapes, min_size=args.min_size,
                 max_size=args.max_size)
    total = args.classes * (args.train_per_class + args.val_per_class)
    print(f"wrote {total} JPEGs of {args.classes} classes to {args.root}/train and {args.root}/val")


if __name__ == "__main__":
    main()
