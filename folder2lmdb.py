#!/usr/bin/env python
"""Convert an ImageNet-layout JPEG folder (``root/<wnid>/<image>.JPEG``) to one LMDB.

    python folder2lmdb.py --dataset /imagenet/train -o /lmdb/train

(the interface of PyTorch-LMDB's converter). Each image's bytes are stored unchanged with its
ImageFolder label; the record format lives in ``loaders/_lmdb_codec.py``, shared with the reader.
The LMDB map grows as needed (no fixed 2 TiB ``map_size``), files are read by several threads,
and the metadata record is written last, so an interrupted conversion is never read as complete.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

from loaders._lmdb_codec import (META_KEY, LMDBFormatError, Metadata, close_readonly,
                                 encode_meta, encode_record, is_lmdb, read_meta, record_key)

_MiB = 1 << 20


class ConversionError(Exception):
    """The conversion cannot start or continue (bad source, existing output, disk): one line."""


@dataclass
class Summary:
    """What a conversion wrote: ``images`` records of ``bytes`` image bytes in ``seconds``."""

    images: int
    bytes: int
    seconds: float
    output: str

    @property
    def images_per_sec(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else float("inf")

    def line(self) -> str:
        return (f"wrote {self.images} images ({self.bytes / _MiB:.1f} MiB) to {self.output} "
                f"in {self.seconds:.1f} s ({self.images_per_sec:.0f} images/s)")


def list_samples(root: str) -> tuple[list[str], list[tuple[str, int]]]:
    """Class names and ``(path, label)`` pairs exactly as torchvision's ``ImageFolder(root)``.

    Raises :class:`ConversionError` if ``root`` is missing or holds no images.
    """
    if not os.path.isdir(root):
        raise ConversionError(f"{root}: no such directory")
    try:
        classes, class_to_idx = find_classes(root)
        samples = make_dataset(root, class_to_idx, extensions=IMG_EXTENSIONS)
    except (FileNotFoundError, OSError) as exc:
        raise ConversionError(f"{root}: {exc}") from None
    return classes, samples


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _prepare_output(output: str, overwrite: bool) -> None:
    """Create ``output``; replace an unfinished conversion there, or a complete one if asked."""
    if not os.path.exists(output):
        os.makedirs(output)
        return
    if not os.path.isdir(output) or (os.listdir(output) and not is_lmdb(output)):
        raise ConversionError(f"{output}: exists and is not an LMDB directory; choose another -o")
    if not is_lmdb(output):
        return  # an empty directory
    try:
        meta = read_meta(output)
    except LMDBFormatError:
        meta = None  # an unfinished conversion: start again
    if meta is not None and not overwrite:
        raise ConversionError(
            f"{output}: already holds a complete database of {meta.count} images "
            "(pass --overwrite to replace it)")
    close_readonly(output)
    shutil.rmtree(output)
    os.makedirs(output)


class _Writer:
    """Writes batches of records in one transaction each, doubling ``map_size`` when full."""

    def __init__(self, output: str, map_size: int):
        import lmdb

        self.lmdb = lmdb
        self.env = lmdb.open(output, map_size=map_size, subdir=True, meminit=False,
                             map_async=True)

    def put_all(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    for key, value in items:
                        txn.put(key, value)
                return
            except self.lmdb.MapFullError:
                # The aborted transaction left no trace: grow the map and write the batch again.
                self.env.set_mapsize(self.env.info()["map_size"] * 2)

    def close(self) -> None:
        self.env.sync(True)
        self.env.close()


def convert(dataset: str, output: str, workers: int = 8, overwrite: bool = False,
            map_size: int = 1 << 30, batch_size: int = 256, progress: bool = True) -> Summary:
    """Convert the ImageNet-layout folder ``dataset`` into a new LMDB directory ``output``.

    ``workers`` threads read the files; every ``batch_size`` records are committed in one
    transaction; ``map_size`` (bytes) is only the initial size of the map, which doubles
    whenever it is full. Raises :class:`ConversionError` for a bad source or an existing
    complete output (unless ``overwrite``); an incomplete output (no metadata) is replaced.
    """
    from tqdm import tqdm

    start = time.perf_counter()
    classes, samples = list_samples(dataset)
    _prepare_output(output, overwrite)
    writer = _Writer(output, map_size)
    total_bytes = 0
    bar = tqdm(total=len(samples), unit="img", desc=os.path.basename(output.rstrip("/")),
               disable=not progress or None, dynamic_ncols=True)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        pending = _submit(pool, samples, 0, batch_size)
        for first in range(0, len(samples), batch_size):
            batch, pending = pending, _submit(pool, samples, first + batch_size, batch_size)
            records = []
            for offset, future in enumerate(batch):
                data = future.result()
                total_bytes += len(data)
                label = samples[first + offset][1]
                records.append((record_key(first + offset), encode_record(data, label)))
            writer.put_all(records)
            bar.update(len(records))
    # Written last: a database without it is an unfinished conversion and is never opened.
    writer.put_all([(META_KEY, encode_meta(Metadata(count=len(samples), classes=tuple(classes))))])
    writer.close()
    bar.close()
    return Summary(len(samples), total_bytes, time.perf_counter() - start, output)


def _submit(pool: Executor, samples, first: int, batch_size: int) -> list[Future]:
    return [pool.submit(_read, path) for path, _ in samples[first:first + batch_size]]


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Convert an ImageNet-layout JPEG folder to an LMDB for main.py --lmdb.")
    parser.add_argument("-d", "--dataset", required=True,
                        help="folder of class subfolders, e.g. /imagenet/train")
    parser.add_argument("-o", "--output", required=True, help="LMDB directory to create")
    parser.add_argument("-j", "--workers", type=int, default=8,
                        help="threads reading image files (default: 8)")
    parser.add_argument("--map-size", type=int, default=1 << 30,
                        help="initial LMDB map_size in bytes; doubles when full (default: 1 GiB)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing complete database at --output")
    return parser


def main(argv=None) -> int:
    """CLI entry point; returns the exit status (0 success, 1 error with a one-line message)."""
    args = get_args_parser().parse_args(argv)
    try:
        summary = convert(args.dataset, args.output, workers=args.workers,
                          overwrite=args.overwrite, map_size=args.map_size)
    except (ConversionError, OSError) as exc:
        print(f"folder2lmdb.py: error: {exc}", file=sys.stderr)
        return 1
    print(summary.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
