"""The acceptance rule measured (``decode.acceptance``): how far real photographs, their
re-encodings and generated images sit above the coded-data bound, where the damaged headers
fall, and what the rule and the stderr capture cost per image, one thread.

Per corpus (:func:`corpora`): bytes per pixel and the *bound ratio* (bytes after the header /
the least a complete image of that frame needs), minimum and median; then :func:`flip_sweep`
and :func:`costs`.
"""
from __future__ import annotations

import argparse
import glob
import io
import os
import random
import sys
import time

import numpy as np

from benchmarks import runner


def _save(image, fmt: str = "JPEG", **options) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def corpora(data: str, count: int) -> dict[str, list[bytes]]:
    """``{corpus name: encoded images}``: the real sample as stored and re-encoded (quality 1
    to 100, optimised, progressive, grayscale, 4:4:4, CMYK, 56 and 2,400 px, PNG),
    ``tools.datagen`` images (flat colour, the nearest to the bound; with noise), and a
    one-bit height flip and a 65,000 x 65,000 bomb of the first real JPEGs."""
    from PIL import Image

    from tools.datagen import make_image

    files = sorted(glob.glob(os.path.join(data, "train", "*", "*")))[:count]
    real = [open(path, "rb").read() for path in files]
    images = [Image.open(io.BytesIO(b)).convert("RGB") for b in real]
    out = {"real, as stored": real}
    for quality in (1, 5, 25, 75, 95, 100):
        out[f"real, quality {quality}"] = [_save(i, quality=quality) for i in images]
    out["real, quality 5, optimised"] = [_save(i, quality=5, optimize=True) for i in images]
    out["real, progressive"] = [_save(i, quality=75, progressive=True) for i in images]
    out["real, grayscale, quality 1, optimised"] = [_save(i.convert("L"), quality=1,
                                                          optimize=True) for i in images]
    out["real, 4:4:4, quality 1"] = [_save(i, quality=1, subsampling=0) for i in images]
    out["real, CMYK"] = [_save(i.convert("CMYK"), quality=75) for i in images]
    out["real, 56 px"] = [_save(i.resize((56, max(1, 56 * i.height // i.width))))
                          for i in images]
    out["real, 2,400 px, quality 5, optimised"] = [
        _save(i.resize((2400, 2400 * i.height // i.width)), quality=5, optimize=True)
        for i in images[:20]]
    out["real, PNG"] = [_save(i, "PNG") for i in images[:40]]
    rng = random.Random(0)
    sizes = [(rng.randint(64, 500), rng.randint(64, 500)) for _ in range(100)]
    flat = [make_image(k % 10, 10, rng, size, 0, 0) for k, size in enumerate(sizes)]
    out["generated flat, quality 90 (the tests')"] = [_save(i, quality=90) for i in flat]
    out["generated flat, optimised"] = [_save(i, quality=90, optimize=True) for i in flat]
    out["generated flat, grayscale, optimised"] = [_save(i.convert("L"), optimize=True)
                                                   for i in flat]
    out["generated flat, PNG"] = [_save(i, "PNG") for i in flat]
    noisy = [make_image(k % 10, 10, rng, size, 8, 3) for k, size in enumerate(sizes)]
    out["generated, noise and shapes"] = [_save(i, quality=90) for i in noisy]
    out["real, one-bit height flip"] = [_edited(b, "flip") for b in real[:50]]
    out["real, 65,000 x 65,000"] = [_edited(b, "bomb") for b in real[:50]]
    return out


def frame_at(data: bytes) -> int:
    """Offset of the height field of a JPEG's frame header (SOF0-2), walking the marker
    segments (an EXIF thumbnail inside APP1 has a SOF of its own)."""
    from decode.headers import jpeg_segments

    return next(begin for marker, begin, _ in jpeg_segments(data)
                if marker in (0xC0, 0xC1, 0xC2)) + 5


def _edited(data: bytes, how: str, bit: int = 15) -> bytes:
    """``data`` (a baseline JPEG) with bit ``bit`` of its height flipped (``"flip"``; of its
    width: ``"flip-width"``), or claiming 65,000 x 65,000 pixels (``"bomb"``)."""
    body = bytearray(data)
    at = frame_at(data)
    if how == "bomb":
        body[at:at + 4] = (65000).to_bytes(2, "big") * 2
    else:
        at += 2 if how == "flip-width" else 0
        value = int.from_bytes(body[at:at + 2], "big") ^ (1 << bit)
        body[at:at + 2] = value.to_bytes(2, "big")
    return bytes(body)


def flip_sweep(real: list[bytes]) -> dict:
    """Every one-bit flip of the height and of the width of each image that makes it larger:
    ``{factor bucket: [flips, refused]}``, by how many times the pixel count grows."""
    from decode.acceptance import Refused, check, read_frame

    buckets: dict[str, list[int]] = {}
    for data in real:
        frame = check(data)
        for how in ("flip", "flip-width"):
            for bit in range(16):
                edited = _edited(data, how, bit)
                grown = read_frame(edited).pixels / frame.pixels
                if grown <= 1:
                    continue
                key = ("< 2x" if grown < 2 else "2-8x" if grown < 8 else "8-64x" if grown < 64
                       else ">= 64x")
                row = buckets.setdefault(key, [0, 0])
                row[0] += 1
                try:
                    check(edited)
                except Refused:
                    row[1] += 1
    return buckets


def figures(blobs: list[bytes]) -> dict:
    """Bytes per pixel and bound ratio (min, median) of one corpus, and how many it refuses."""
    from decode.acceptance import Refused, check, read_frame

    per_pixel, ratios, refused = [], [], 0
    for data in blobs:
        frame = read_frame(data)
        per_pixel.append(len(data) / frame.pixels)
        if frame.min_bytes:
            ratios.append(frame.available / frame.min_bytes)
        try:
            check(data)
        except Refused:
            refused += 1
    return {"images": len(blobs), "bytes_per_pixel": [min(per_pixel), np.median(per_pixel)],
            "bound_ratio": [min(ratios), float(np.median(ratios))] if ratios else None,
            "refused": refused}


def costs(blobs: list[bytes], rounds: int) -> dict:
    """Microseconds per image of :func:`decode.acceptance.check`, an empty
    :class:`decode.messages.capture` and the 224 px training transform they guard, medians
    over interleaved rounds (one thread)."""
    import torch

    from decode.acceptance import check
    from decode.messages import capture
    from loaders.transforms import TrainTransform

    torch.set_num_threads(1)
    transform = TrainTransform(224)

    def empty_capture(_):
        with capture():
            pass

    steps = {"check": check, "capture": empty_capture, "transform": transform}

    def measure(name):
        step, started = steps[name], time.perf_counter()
        for data in blobs:
            step(data)
        return (time.perf_counter() - started) / len(blobs) * 1e6

    timed = runner.interleave(steps, measure, rounds, alternate=True)
    return {name: runner.median(values) for name, values in timed.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.decoders.acceptance",
                                     description=__doc__.splitlines()[0])
    runner.add_data_option(parser, "ImageNet-layout folder whose train/ JPEGs are measured")
    parser.add_argument("--images", type=int, default=250, help="real JPEGs read (default 250)")
    runner.add_rounds_option(parser, 5)
    runner.add_out_option(parser, "also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if not glob.glob(os.path.join(args.data, "train", "*", "*")):
        return runner.error("benchmarks.decoders.acceptance", f"{args.data}/train: no images")
    found = {name: figures(blobs) for name, blobs in corpora(args.data, args.images).items()}
    rows = [[name, str(f["images"]), f"{f['bytes_per_pixel'][0]:.4f}",
             f"{f['bytes_per_pixel'][1]:.3f}",
             f"{f['bound_ratio'][0]:.2f}" if f["bound_ratio"] else "-",
             f"{f['bound_ratio'][1]:.1f}" if f["bound_ratio"] else "-", str(f["refused"])]
            for name, f in found.items()]
    print(runner.markdown_table(["corpus", "images", "B/px min", "B/px median", "ratio min",
                                 "ratio median", "refused"], rows))
    real = [open(p, "rb").read() for p in sorted(glob.glob(os.path.join(
        args.data, "train", "*", "*")))[:args.images]]
    sweep = flip_sweep(real)
    print("\none-bit flips of the height or width that enlarge the frame, by growth of the "
          "pixel count:\n" + runner.markdown_table(
              ["growth", "flips", "refused"],
              [[key, str(n), f"{refused} ({100 * refused / n:.0f}%)"]
               for key, (n, refused) in sorted(sweep.items(), key=lambda kv: (
                   ["< 2x", "2-8x", "8-64x", ">= 64x"].index(kv[0])))]))
    spent = costs(real, args.rounds)
    print(f"\nper image, one thread: check {spent['check']:.1f} us, capture {spent['capture']:.1f} "
          f"us, training transform {spent['transform'] / 1000:.2f} ms: the rule and the capture "
          f"add {100 * (spent['check'] + spent['capture']) / spent['transform']:.1f}%")
    if args.out:
        runner.write_json(args.out, {"corpora": found, "flips": sweep, "microseconds": spent})
    return 0


if __name__ == "__main__":
    sys.exit(main())
