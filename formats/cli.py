"""The one command line of the converters (``folder2lmdb.py``, ``folder2shards.py``): the flags
they share, and :func:`run_cli`, which parses, converts or verifies, and turns every expected
error into one ``PROG: error:`` line and an exit status."""
from __future__ import annotations

import argparse
import sys
import warnings
from contextlib import suppress
from typing import Callable

from decode import retain_freed_memory
from decode.acceptance import MAX_PIXELS, limit_pil
from formats.cap import Cap
from formats.images import CHECKS, REENCODE_QUALITY
from formats.raw_share import parse_budget, size_in_bytes


def converter_parser(description: str, output_help: str, verify_metavar: str, verify_help: str,
                     overwrite_help: str) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` with the flags both converters take (PyTorch-LMDB's ``-d/--dataset``,
    ``-o/--output``, and ``--verify``, ``--check``, ``-j``, ...); each converter adds its own."""
    parser = argparse.ArgumentParser(description=description)
    add = parser.add_argument
    add("-d", "--dataset", help="folder of class subfolders, e.g. /imagenet/train, or with "
        "--split the folder ImageNet was downloaded into (with --verify: also compare every "
        "record with it)")
    add("-o", "--output", help=output_help)
    add("--verify", metavar=verify_metavar, help=verify_help)
    add("--strict", action="store_true",
        help="fail on the first file that is not an image instead of skipping it")
    add("--check", choices=CHECKS, default="full",
        help="full (default): decode every image completely, so damaged ones are skipped; "
             "header: decode a baseline JPEG only if it does not end in EOI (faster; misses "
             "damage inside the compressed data)")
    add("-j", "--workers", type=int, default=8,
        help="threads reading and checking image files (default: 8)")
    add("--overwrite", action="store_true", help=overwrite_help)
    add("--split", choices=("train", "val"),
        help="--dataset is the folder ImageNet was downloaded into (the official tars + devkit, "
             "Kaggle's ILSVRC tree, Hugging Face's repository, or train/ and val/ class "
             "folders): convert this split of it")
    add("--allow-partial", action="store_true",
        help="convert a download that lacks images or classes of ImageNet (default: stop, "
             "naming what is missing)")
    add("--max-side", type=int, metavar="N",
        help="store images larger than N pixels on their longer side scaled down to N (area "
             "average, as FFCV's max_resolution) and re-encoded at --quality; smaller ones stay "
             "byte-exact (default: no cap)")
    add("--quality", type=int, default=REENCODE_QUALITY, metavar="Q",
        help=f"JPEG quality of every re-encoded image (default: {REENCODE_QUALITY}; e.g. "
             "--max-side 512 --quality 90)")
    add("--reencode-all", action="store_true",
        help="re-encode every image at --quality, not only those above --max-side, as FFCV's "
             "writer does: lossy, about half the bytes of ImageNet's originals and faster to "
             "decode at --quality 90 (docs/raw-share.md)")
    add("--raw-budget", metavar="BUDGET",
        help="store the images that save the most decode time per extra byte as raw pixels "
             "(at the --max-side size) instead of JPEG, up to BUDGET: Nx (the store at most N "
             "times the JPEG-only store, e.g. 1.5x, 2.7x) or a size (the store's images at most "
             "200M, 30G); prints the decode time it saves per epoch (docs/raw-share.md)")
    add("--max-image-pixels", type=_pixels, default=MAX_PIXELS, metavar="N",
        help=f"skip an image whose header claims more pixels, before decoding it, as main.py "
             f"does (default: {MAX_PIXELS:,}, PIL's decompression-bomb limit; 0: no limit)")
    return parser


def _pixels(text: str) -> int:
    """``--max-image-pixels``: a whole number of pixels, 0 or more."""
    with suppress(ValueError):
        if int(text) >= 0:
            return int(text)
    raise argparse.ArgumentTypeError(f"not a pixel count (0 or more): {text!r}")


def parse_size(text: str) -> int:
    """``--shard-size``: :func:`~formats.raw_share.size_in_bytes`; ``ValueError`` if none."""
    size = size_in_bytes(text)
    if size is None:
        raise ValueError(f"--shard-size: not a size in bytes: {text!r} (e.g. 1073741824, 512M)")
    return size


def run_cli(prog: str, parser: argparse.ArgumentParser, argv, verified: str,
            verify_run: Callable, convert_run: Callable, errors: tuple) -> int:
    """A converter's command line: parse ``argv``, then ``verify_run(args)`` (a result with
    ``line()``, ``problems``, ``total``) under ``--verify``, else ``convert_run(args)`` (a summary
    with ``line()``, or a finished step's line, a str). Returns the exit status: 0; 1 for an
    error in ``errors`` (one ``PROG: error:`` line) or a problem found by ``--verify`` (one stderr
    line each); 2 for bad flags. ``verified`` names what ``--verify`` checks."""
    args = parser.parse_args(argv)
    # As main.py (decode.memory): halves the converter's system CPU time.
    retain_freed_memory()
    # PIL (the re-encoder, and the header read of every verbatim JPEG) agrees with the rule
    limit_pil(args.max_image_pixels)
    # such files are decoded by decode.libraries or listed in the report
    warnings.filterwarnings("ignore", message="image file could not be identified")
    if args.verify and args.output:
        parser.error(f"--verify checks {verified}: give no -o/--output")
    indexing = getattr(args, "index", None)  # folder2shards.py --index needs no --dataset
    if not args.verify and not indexing and not (args.dataset and args.output):
        parser.error("the following arguments are required: -d/--dataset, -o/--output")
    try:
        args.cap = Cap(args.max_side, args.quality, bool(getattr(args, "reencode_all", False)))
        args.raw = parse_budget(args.raw_budget) if args.raw_budget else None
    except ValueError as exc:
        parser.error(str(exc))
    try:
        if args.verify:
            result = verify_run(args)
            print(result.line())
            for text in result.problems:
                print(f"{prog}: {text}", file=sys.stderr)
            return 1 if result.total else 0
        summary = convert_run(args)
    except errors as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    print(summary if isinstance(summary, str) else summary.line())
    return 0
