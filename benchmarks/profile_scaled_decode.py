#!/usr/bin/env python
"""Scaled JPEG decoders side by side, one thread: ms per window, pixel difference to a full decode.

    python benchmarks/profile_scaled_decode.py --data /path/to/imagenet \\
        [--sizes 160 192 224] [--draws 8] [--rounds 5]

For each output size, ``--draws`` RandomResizedCrop windows per real JPEG (the training
transform's own ``random_resized_crop_params``, seeded) are kept where the window is at least
twice the output on both sides (where ``loaders.jpeg_scaled`` decodes at 1/2, 1/4 or 1/8).
Each candidate turns such a window into the uint8 output:

* ``window, full scale``: today's path below the threshold: nvImageCodec decodes the window
  (``loaders.jpeg_window``), torch's antialiased bilinear resize (``loaders.transforms.resize``);
* ``PIL draft`` (ours): ``loaders.jpeg_scaled.resized_window``, the whole image at 1/k, PIL's
  antialiased bilinear resize of the exact (fractional) box;
* ``simplejpeg`` / ``PyTurboJPEG`` (where installed: ``pip install simplejpeg PyTurboJPEG``; the
  latter needs Debian's ``libturbojpeg0``): the whole image at 1/k into a NumPy array, the box
  rounded outwards to whole pixels, torch's resize. Neither crops while scaling (PyTurboJPEG's
  ``crop`` is a lossless transform on MCU boundaries; simplejpeg has none).

nvImageCodec 0.9 has no scaled decode (its ``DecodeParams`` carry orientation, colour and sample
format only). Prints the median ms per window over ``--rounds`` interleaved rounds, and each
candidate's max and mean absolute difference (levels of 0-255) to a full decode of the image,
cropped and resized by torch (the reference ``TrainTransform`` with scaled decoding off), and
whether a second pass gives identical pixels.
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from loaders import jpeg_scaled, jpeg_window  # noqa: E402
from loaders.transforms import (  # noqa: E402
    RRC_RATIO, RRC_SCALE, decode, random_resized_crop_params, resize)


def _whole_scaled(decode_at):
    """A candidate from ``decode_at(data, k) -> HxWx3 uint8 array`` (whole image at 1/k): the
    box rounded outwards to whole scaled pixels, then torch's antialiased resize."""
    def run(data, k, box, size):
        array = decode_at(data, k)
        top, left, bottom, right = box
        crop = torch.from_numpy(array)[int(top / k):math.ceil(bottom / k),
                                       int(left / k):math.ceil(right / k)]
        return resize(crop.permute(2, 0, 1), size)
    return run


def candidates() -> dict:
    """``{name: fn(data, k, box, size) -> uint8 (3, *size)}`` of what is installed here."""
    def window(data, k, box, size):
        top, left, bottom, right = box
        return resize(jpeg_window.decode_window(data, top, left, bottom - top, right - left), size)

    found = {"window, full scale (nvImageCodec)": window,
             "PIL draft (ours)": jpeg_scaled.resized_window}
    try:
        import simplejpeg

        def simple(data, k):  # the smallest scale >= these sides, i.e. exactly 1/k
            height, width = simplejpeg.decode_jpeg_header(data)[:2]
            return simplejpeg.decode_jpeg(data, colorspace="RGB", min_factor=k,
                                          min_height=-(-height // k), min_width=-(-width // k))

        found["simplejpeg"] = _whole_scaled(simple)
    except ImportError:
        print("simplejpeg: not installed (pip install simplejpeg)")
    try:
        import turbojpeg

        tj = turbojpeg.TurboJPEG()
        found["PyTurboJPEG"] = _whole_scaled(lambda d, k: tj.decode(
            d, pixel_format=turbojpeg.TJPF_RGB, scaling_factor=(1, k)))
    except (ImportError, RuntimeError, OSError) as exc:
        print(f"PyTurboJPEG: not usable ({type(exc).__name__}: {exc})")
    return found


def windows(blobs: list[bytes], size: int, draws: int, seed: int = 0) -> list[tuple]:
    """``(data, k, box, (size, size))`` of the seeded windows that are decoded scaled."""
    rng, found = random.Random(seed), []
    for data in blobs:
        shape = jpeg_window.jpeg_size(data)
        if shape is None:
            continue
        for _ in range(draws):
            top, left, h, w = random_resized_crop_params(
                *shape, RRC_SCALE, RRC_RATIO, [rng.random() for _ in range(41)])
            k = jpeg_scaled.scale_factor(h, w, size, size)
            if k > 1:
                found.append((data, k, (top, left, top + h, left + w), (size, size)))
    return found


def reference(item) -> torch.Tensor:
    data, _, (top, left, bottom, right), size = item
    return resize(decode(data)[:, top:bottom, left:right], size)


def profile_size(blobs, size: int, draws: int, rounds: int, found: dict) -> None:
    items = windows(blobs, size, draws)
    counts = {k: sum(1 for it in items if it[1] == k) for k in (2, 4, 8)}
    print(f"\n{size} px: {len(items)} of {len(blobs) * draws} windows decoded scaled "
          f"(1/2: {counts[2]}, 1/4: {counts[4]}, 1/8: {counts[8]})")
    if not items:
        return
    refs = [reference(it) for it in items]
    times = {name: [] for name in found}
    for _ in range(rounds):
        for name, fn in found.items():
            start = time.perf_counter()
            for it in items:
                fn(*it)
            times[name].append(1e3 * (time.perf_counter() - start) / len(items))
    for name, fn in found.items():
        outs = [fn(*it) for it in items]
        again = all(torch.equal(a, fn(*it)) for a, it in zip(outs, items))
        diffs = [(o.int() - r.int()).abs() for o, r in zip(outs, refs)]
        worst = max(int(d.max()) for d in diffs)
        mean = sum(float(d.float().mean()) for d in diffs) / len(diffs)
        median = sorted(times[name])[len(times[name]) // 2]
        print(f"  {name:<36} {median:6.3f} ms/window  max |diff| {worst:3d}  mean |diff| "
              f"{mean:5.3f}  {'same on a second pass' if again else 'DIFFERS on a second pass'}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True,
                        help="ImageNet-layout folder whose train/<wnid>/ JPEGs are decoded")
    parser.add_argument("--sizes", type=int, nargs="+", default=[160, 192, 224])
    parser.add_argument("--draws", type=int, default=8, help="windows drawn per image")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    files = sorted(glob.glob(os.path.join(args.data, "train", "*", "*")))
    if not files or not jpeg_window.available():
        print(f"profile_scaled_decode.py: error: no images under {args.data}/train, or "
              f"{jpeg_window.status()}", file=sys.stderr)
        return 1
    blobs = [open(f, "rb").read() for f in files]
    found = candidates()
    print(f"{len(files)} images from {args.data}/train, 1 thread, median of {args.rounds} "
          "interleaved rounds; |diff| against a full decode + torch resize, levels 0-255")
    for size in args.sizes:
        profile_size(blobs, size, args.draws, args.rounds, found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
