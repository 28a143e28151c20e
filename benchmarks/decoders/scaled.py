"""Scaled JPEG decoders side by side, one thread: ms per window, pixel difference to a full decode.

Per output size, the seeded RandomResizedCrop windows at least twice the output on both sides
(:func:`windows`; ``--below``: the others) are made by each :func:`candidates` entry. Prints
the median ms per window over interleaved rounds, the max and mean absolute difference
(levels, 0-255) to :func:`reference`, and whether a second pass gives identical pixels.
nvImageCodec 0.9 has no scaled decode (its ``DecodeParams`` carry no scale).
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import math
import os
import random
import sys
import time

import numpy as np
import torch

from benchmarks import runner
from decode import decode, jpeg, resize, window_size
from loaders.transforms import RRC_RATIO, RRC_SCALE, random_resized_crop_params


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


class _Region(ctypes.Structure):  # turbojpeg.h's tjregion
    _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int), ("h", ctypes.c_int)]


class _Scale(ctypes.Structure):  # turbojpeg.h's tjscalingfactor
    _fields_ = [("num", ctypes.c_int), ("denom", ctypes.c_int)]


# turbojpeg.h (libjpeg-turbo 3.0): TJINIT_DECOMPRESS, TJPARAM_SUBSAMP/JPEGWIDTH/JPEGHEIGHT,
# TJPF_RGB, and tjMCUWidth by TJSAMP_444, 422, 420, GRAY, 440, 411, 441.
_TJINIT_DECOMPRESS, _SUBSAMP, _WIDTH, _HEIGHT, _TJPF_RGB = 1, 4, 5, 6, 0
_MCU_WIDTH = (8, 16, 16, 8, 8, 32, 8)


def tj3_crop_scale(path: str):
    """A candidate decoding only the window's region at 1/k (left edge rounded down to the
    scaled iMCU) through libturbojpeg >= 3.0 at ``path`` (``tj3SetScalingFactor``,
    ``tj3SetCroppingRegion``), PIL resizing the exact box; raises OSError without tj3."""
    from PIL import Image

    lib = ctypes.CDLL(path)
    if not hasattr(lib, "tj3SetCroppingRegion"):
        raise OSError(f"{path}: no tj3 API (libturbojpeg >= 3.0 needed)")
    lib.tj3Init.restype = ctypes.c_void_p
    lib.tj3Get.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.tj3DecompressHeader.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.tj3SetScalingFactor.argtypes = [ctypes.c_void_p, _Scale]
    lib.tj3SetCroppingRegion.argtypes = [ctypes.c_void_p, _Region]
    lib.tj3Decompress8.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                   ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    handle = lib.tj3Init(_TJINIT_DECOMPRESS)

    def run(data, k, box, size):
        if lib.tj3DecompressHeader(handle, data, len(data)) != 0:
            raise RuntimeError("tj3DecompressHeader failed")
        width, height = lib.tj3Get(handle, _WIDTH), lib.tj3Get(handle, _HEIGHT)
        scaled_w, scaled_h = -(-width // k), -(-height // k)  # TJSCALED
        mcu = -(-_MCU_WIDTH[lib.tj3Get(handle, _SUBSAMP)] // k)
        # pixel i of a 1/k decode covers full-scale pixels k*i .. k*i+k-1
        top, left, bottom, right = (v / k for v in box)
        x0, y0 = int(left) // mcu * mcu, int(top)
        x1, y1 = min(scaled_w, math.ceil(right)), min(scaled_h, math.ceil(bottom))
        lib.tj3SetScalingFactor(handle, _Scale(1, k))
        lib.tj3SetCroppingRegion(handle, _Region(x0, y0, x1 - x0, y1 - y0))
        out = np.empty((y1 - y0, x1 - x0, 3), np.uint8)
        if lib.tj3Decompress8(handle, data, len(data), out.ctypes.data, 0, _TJPF_RGB) != 0:
            raise RuntimeError("tj3Decompress8 failed")
        image = Image.fromarray(out).resize(
            (size[1], size[0]), Image.BILINEAR,
            box=(left - x0, top - y0, right - x0, bottom - y0))
        return torch.from_numpy(np.array(image)).permute(2, 0, 1)
    return run


def candidates(libturbojpeg: str | None = None) -> dict:
    """``{name: fn(data, k, box, size) -> uint8 (3, *size)}`` of what is installed here:
    ``window, full scale`` (nvImageCodec's window, torch's antialiased resize: the path below
    the threshold); ``PIL draft`` (the whole image at 1/k, PIL's resize of the exact box);
    ``crop + scale`` (only the box's region at 1/k through ``decode/jpeg/_jpegcrop.so``: the
    loaders' path); ``simplejpeg`` and ``PyTurboJPEG`` (whole image at 1/k, as neither crops
    while scaling); ``tj3 crop + scale`` (:func:`tj3_crop_scale`)."""
    def window(data, k, box, size):
        top, left, bottom, right = box
        return resize(jpeg.window.decode_window(data, top, left, bottom - top, right - left), size)

    def array_out(decoder):
        return lambda *item: torch.from_numpy(decoder(*item)).permute(2, 0, 1)

    found = {"window, full scale (nvImageCodec)": window,
             "PIL draft": array_out(jpeg.scaled.draft_resized)}
    if jpeg.region.available():
        found["crop + scale (ours, _jpegcrop.so)"] = array_out(jpeg.scaled.region_resized)
    else:
        print(jpeg.region.status())
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
    if libturbojpeg:
        try:
            found["tj3 crop + scale"] = tj3_crop_scale(libturbojpeg)
        except OSError as exc:
            print(f"tj3: not usable ({exc})")
    return found


def windows(blobs: list[bytes], size: int, draws: int, seed: int = 0,
            below: bool = False) -> list[tuple]:
    """``(data, k, box, (size, size))`` of the seeded windows that are decoded scaled (with
    ``below``: those that are not, k = 1)."""
    rng, found = random.Random(seed), []
    for data in blobs:
        shape = window_size(data)
        if shape is None:
            continue
        for _ in range(draws):
            top, left, h, w = random_resized_crop_params(
                *shape, RRC_SCALE, RRC_RATIO, [rng.random() for _ in range(41)])
            k = jpeg.scaled.scale_factor(h, w, size, size)
            if (k == 1) == below:
                found.append((data, k, (top, left, top + h, left + w), (size, size)))
    return found


def reference(item) -> torch.Tensor:
    """A window as the reference makes it: the whole image decoded, cropped, torch-resized."""
    data, _, (top, left, bottom, right), size = item
    return resize(decode(data)[:, top:bottom, left:right], size)


def profile_size(blobs, size: int, draws: int, rounds: int, found: dict,
                 below: bool = False) -> None:
    """Print every candidate's median ms per window at ``size`` px and its pixel differences
    to :func:`reference`."""
    items = windows(blobs, size, draws, below=below)
    counts = {k: sum(1 for it in items if it[1] == k) for k in (1, 2, 4, 8)}
    print(f"\n{size} px: {len(items)} of {len(blobs) * draws} windows "
          + ("under the threshold (full scale)" if below else
             f"decoded scaled (1/2: {counts[2]}, 1/4: {counts[4]}, 1/8: {counts[8]})"))
    if not items:
        return
    refs = [reference(it) for it in items]

    def ms_per_window(name: str) -> float:
        start = time.perf_counter()
        for it in items:
            found[name](*it)
        return 1e3 * (time.perf_counter() - start) / len(items)

    times = runner.interleave(found, ms_per_window, rounds)
    for name, fn in found.items():
        outs = [fn(*it) for it in items]
        again = all(torch.equal(a, fn(*it)) for a, it in zip(outs, items))
        diffs = [(o.int() - r.int()).abs() for o, r in zip(outs, refs)]
        worst = max(int(d.max()) for d in diffs)
        mean = sum(float(d.float().mean()) for d in diffs) / len(diffs)
        median = runner.median_high(times[name])
        print(f"  {name:<36} {median:6.3f} ms/window  max |diff| {worst:3d}  mean |diff| "
              f"{mean:5.3f}  {'same on a second pass' if again else 'DIFFERS on a second pass'}")


def main(argv=None) -> int:
    """Command line: 0 when every size is profiled, 1 with one ``error:`` line otherwise."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.decoders.scaled",
                                     description=__doc__.splitlines()[0])
    runner.add_data_option(parser, "ImageNet-layout folder whose train/<wnid>/ JPEGs are decoded")
    parser.add_argument("--sizes", type=int, nargs="+", default=[160, 192, 224])
    parser.add_argument("--draws", type=int, default=8, help="windows drawn per image")
    runner.add_rounds_option(parser, 5)
    parser.add_argument("--below", action="store_true",
                        help="profile the windows under the threshold (full scale) instead")
    parser.add_argument("--libturbojpeg", metavar="PATH",
                        help="a libturbojpeg >= 3.0 to time its crop + scale decode")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    files = sorted(glob.glob(os.path.join(args.data, "train", "*", "*")))
    if not files or not jpeg.window.available():
        return runner.error("benchmarks.decoders.scaled", f"no images under {args.data}/train, "
                            f"or {jpeg.window.status()}")
    blobs = [open(f, "rb").read() for f in files]
    found = candidates(args.libturbojpeg)
    print(f"{len(files)} images from {args.data}/train, 1 thread, median of {args.rounds} "
          "interleaved rounds; |diff| against a full decode + torch resize, levels 0-255")
    for size in args.sizes:
        profile_size(blobs, size, args.draws, args.rounds, found, args.below)
    return 0


if __name__ == "__main__":
    sys.exit(main())
