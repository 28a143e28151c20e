#!/usr/bin/env python
"""Convert an ImageNet-layout image folder (``root/<wnid>/<image>.JPEG``) to one LMDB.

    python folder2lmdb.py --dataset /imagenet/train -o /lmdb/train [--strict] [--shuffle-seed 0]
                          [--check {full,header}] [--max-side 512 --quality 90]
                          [--raw-budget 1.5x]
    python folder2lmdb.py --verify /lmdb/train [--dataset /imagenet/train]

(the interface of PyTorch-LMDB's converter). Each image is stored with its ImageFolder label:
baseline JPEGs byte for byte, other images re-encoded to JPEG, non-images skipped and listed in
``OUTPUT/skipped.tsv`` (rules in ``formats/images.py``; the layout, writer and verifier in
``formats/lmdb/``, shared with the reader). The LMDB map grows as needed, files are
checked by several threads, and the metadata record is written last, so an interrupted
conversion is never read as complete; running the same command again resumes it. Every
baseline JPEG is decoded completely once (``--check full``, the default) or, with
``--check header``, only when its markers do not end in EOI (faster, misses damage inside the
compressed data; ``formats.images`` describes both). Records
follow ImageFolder's order (sorted by class) unless ``--shuffle-seed`` fixes a pseudo-random
one, which block order (``main.py --lmdb-order block``) needs to mix classes within a batch.
"""
from __future__ import annotations

import sys

import lmdb

from formats.cli import converter_parser, run_cli
from formats.conversion import ConversionError, Summary
from formats.sources import DatasetError
from formats.lmdb import convert, verify

# PyTorch-LMDB's import path: `from folder2lmdb import ImageFolderLMDB` in users' scripts.
from loaders.imagefolder_lmdb import ImageFolderLMDB

__all__ = ["ConversionError", "ImageFolderLMDB", "Summary", "convert", "main", "verify"]


def get_args_parser():
    parser = converter_parser(
        "Convert an image folder to an LMDB for main.py --lmdb, or check one.",
        output_help="LMDB directory to create (or resume)", verify_metavar="DB",
        verify_help="check the database DB instead",
        overwrite_help="replace an existing complete database at --output")
    parser.add_argument("--batch-size", type=int, default=256,
                        help="source files per LMDB transaction (default: 256)")
    parser.add_argument("--map-size", type=int, default=1 << 30,
                        help="initial LMDB map_size in bytes; doubles when full (default: 1 GiB)")
    parser.add_argument("--shuffle-seed", type=int, metavar="N",
                        help="write the records in a pseudo-random order fixed by N instead of "
                             "sorted by class (for training with --lmdb-order block)")
    return parser


def main(argv=None) -> int:
    """CLI entry point; returns the exit status (see :func:`formats.cli.run_cli`)."""
    return run_cli(
        "folder2lmdb.py", get_args_parser(), argv, "an existing database",
        lambda args: verify(args.verify, args.dataset, workers=args.workers, split=args.split),
        lambda args: convert(args.dataset, args.output, workers=args.workers,
                             overwrite=args.overwrite, map_size=args.map_size,
                             batch_size=max(1, args.batch_size), strict=args.strict,
                             shuffle_seed=args.shuffle_seed, check=args.check, split=args.split,
                             allow_partial=args.allow_partial, cap=args.cap,
                             raw_budget=args.raw, max_pixels=args.max_image_pixels),
        (ConversionError, DatasetError, OSError, lmdb.Error))


if __name__ == "__main__":
    sys.exit(main())
