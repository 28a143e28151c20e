"""FFCV's side of ``benchmarks/ffcv/compare.py``, run with the side environment's Python
(``.ffcv/``, ``benchmarks/ffcv/setup.sh``), never the project's: writes ``.beton`` files and
times FFCV 1.0.2's loader. Imports nothing from this project.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import numpy as np

_CURRENT = {"bytes": None}  # the JPEG bytes of the sample being written (same-bytes mode)


class _Files:
    """``(image, label)`` of each listed file: the decoded image as FFCV's writer wants it
    (H x W x 3 uint8), the file's bytes kept aside for the ``same-bytes`` encoder."""

    def __init__(self, listing: str):
        with open(listing) as f:
            rows = [line.rstrip("\n").split("\t", 1) for line in f if line.strip()]
        self.rows = [(int(label), path) for label, path in rows]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        import cv2

        label, path = self.rows[index]
        with open(path, "rb") as f:
            data = f.read()
        image = cv2.imdecode(np.frombuffer(data, np.uint8),
                             cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
        _CURRENT["bytes"] = data
        return cv2.cvtColor(image, cv2.COLOR_BGR2RGB), label


def _same_bytes_encoder(image, quality):
    data = _CURRENT["bytes"]
    return np.frombuffer(data, np.uint8)


def write(args) -> None:
    """Write ``--out`` from ``--list`` (``label<TAB>path`` lines). ``same-bytes`` stores each
    file's bytes unchanged: FFCV's ``write_mode="jpg"`` always re-encodes, so its
    ``encode_jpeg`` is replaced by one returning the sample's bytes (images must already be
    within ``max_resolution``, 512). ``example``: FFCV's ImageNet example's writer settings
    (``proportion``, half the images as raw pixels, ``max_resolution=500``, quality 90)."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.fields import rgb_image
    from ffcv.writer import DatasetWriter

    if args.mode == "same-bytes":
        field = RGBImageField(write_mode="jpg", max_resolution=512, jpeg_quality=90)
        rgb_image.encode_jpeg = _same_bytes_encoder  # forked writer processes inherit it
    else:
        field = RGBImageField(write_mode="proportion", compress_probability=0.5,
                              max_resolution=500, jpeg_quality=90)
    writer = DatasetWriter(args.out, {"image": field, "label": IntField()},
                           num_workers=args.workers)
    np.random.seed(0)  # FFCV's proportion mode draws with NumPy's global RNG
    writer.from_indexed_dataset(_Files(args.list), chunksize=64)


def time_loader(args) -> None:
    """Print one JSON line as ``main.py --benchmark-data`` does (``images``, ``seconds``,
    ``images_per_sec``) for RandomResizedCropRGBImageDecoder + flip + ToTensor + ToTorchImage,
    uint8, random order, ``os_cache=True``, epochs cycled. FFCV's CPU ``NormalizeImage`` is
    reported to hang, so FFCV is timed to uint8 (ours to uint8 plus normalisation)."""
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    size = args.size
    loader = Loader(args.beton, batch_size=args.batch_size, num_workers=args.workers,
                    order=OrderOption.RANDOM, os_cache=True, drop_last=True, seed=0,
                    pipelines={"image": [RandomResizedCropRGBImageDecoder((size, size)),
                                         RandomHorizontalFlip(), ToTensor(), ToTorchImage()],
                               "label": [IntDecoder(), ToTensor(), Squeeze()]})
    batches = itertools.chain.from_iterable(loader for _ in itertools.count())
    for _ in range(args.warmup):
        next(batches)
    images, start = 0, time.perf_counter()
    for images_batch, _labels in itertools.islice(batches, args.batches):
        images += images_batch.shape[0]
        assert images_batch.dtype.is_floating_point is False
    seconds = time.perf_counter() - start
    print(json.dumps({"loader": "ffcv", "images": images, "seconds": seconds,
                      "images_per_sec": images / seconds, "size": size,
                      "shape": list(images_batch.shape)}), flush=True)
    # FFCV's loader thread may still be filling the next epoch, and tearing the interpreter
    # down under it aborts ("terminate called without an active exception")
    os._exit(0)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("--list", required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--mode", choices=("same-bytes", "example"), required=True)
    w.add_argument("-j", "--workers", type=int, default=2)
    t = sub.add_parser("time")
    t.add_argument("--beton", required=True)
    t.add_argument("--size", type=int, required=True)
    t.add_argument("-b", "--batch-size", type=int, default=64)
    t.add_argument("-j", "--workers", type=int, default=2)
    t.add_argument("--batches", type=int, default=100)
    t.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args(argv)
    write(args) if args.command == "write" else time_loader(args)


if __name__ == "__main__":
    main()
