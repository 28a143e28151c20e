#!/usr/bin/env python
"""Convert an ImageNet-layout image folder (``root/<wnid>/<image>.JPEG``) to WebDataset shards.

    python folder2shards.py --dataset /imagenet/train -o /shards/train [--prefix train]
        [--shard-size 1G] [--max-per-shard N] [--shuffle-seed 0] [-j 8] [--strict] [--overwrite]
        [--check {full,header}]
    python folder2shards.py --verify /shards/train [--dataset /imagenet/train]
    python folder2shards.py --dataset /imagenet --split train -o /shards/train  # any download
    python folder2shards.py --dataset /imagenet/train -o /shards/train --max-per-shard 1000 \
        --task I --tasks N  # task I of a job array of N (slurm/convert.sbatch), then --finish
    python folder2shards.py --index /wds/imagenet1k-train-{0000..1023}.tar [-o INDEX_DIR]
        [--classes /shards/train/index.json]  # shards written by other tools, e.g. timm's

The sibling of ``folder2lmdb.py``: the same records in the layout of :mod:`formats.shards`, in one
global pseudo-random order (``--shuffle-seed``), so that every shard mixes all classes (a streaming
shuffle of a class-sorted tar leaves shards of a few classes; docs/formats.md). ``--index`` indexes
shards made by other tools without rewriting them."""
from __future__ import annotations

import os
import sys

from formats.cli import converter_parser, parse_size, run_cli
from formats.conversion import ConversionError, ResumeState
from formats.sources import DatasetError
from formats.shards import ShardFormatError, convert, index_shards, shard_digests, verify

__all__ = ["ConversionError", "ResumeState", "convert", "main", "parse_size", "verify"]


def get_args_parser():
    parser = converter_parser(
        "Convert an image folder to WebDataset tar shards for main.py --loader shards, or check "
        "them.", output_help="folder to write the shards to (or resume)", verify_metavar="DIR",
        verify_help="check the shards in DIR instead",
        overwrite_help="replace a complete or different conversion at --output")
    parser.add_argument("--prefix", help="shard names PREFIX-000000.tar... (default: --split, "
                        "else the base name of --dataset, e.g. train)")
    parser.add_argument("--shard-size", default="1G", help="most bytes per shard file, suffixes "
                        "K, M, G allowed (default: 1G = 1 GiB)")
    parser.add_argument("--max-per-shard", type=int, metavar="N",
                        help="most records per shard (default: no limit)")
    parser.add_argument("--shuffle-seed", type=int, default=0, metavar="N",
                        help="seed of the records' global pseudo-random order (default: 0)")
    parser.add_argument("--index", metavar="SHARDS",
                        help="instead of converting: index WebDataset shards written by another "
                             "tool (a folder of .tar, or a brace pattern of paths or URLs) into "
                             "-o (default: beside them), for main.py --loader shards")
    parser.add_argument("--classes", metavar="FILE",
                        help="with --index: the WNIDs in label order (an index.json, or one WNID "
                             "a line), for shards whose records name none (e.g. val)")
    parser.add_argument("--task", type=int, metavar="I",
                        help="convert task I's part (0-based) of a job array of --tasks N: whole "
                             "shards of the one shuffled order, the same files for any N; needs "
                             "--max-per-shard (slurm/convert.sbatch passes SLURM's array "
                             "variables; docs/slurm.md)")
    parser.add_argument("--tasks", type=int, metavar="N", help="tasks in the job array")
    parser.add_argument("--finish", action="store_true",
                        help="write the index of a job array's output once all its tasks are "
                             "done (the last task does it too; for a dependent job step)")
    # a task's threads: the cores SLURM gave it, not the node's
    parser.set_defaults(workers=int(os.environ.get("SLURM_CPUS_PER_TASK") or 8))
    return parser


def _convert_or_index(args):
    if args.index:
        return index_shards(args.index, args.output, args.classes)
    return convert(args.dataset, args.output, args.prefix, parse_size(args.shard_size),
                   args.max_per_shard, args.shuffle_seed, args.workers, args.strict,
                   args.overwrite, check=args.check, split=args.split,
                   allow_partial=args.allow_partial, cap=args.cap, raw_budget=args.raw,
                   max_pixels=args.max_image_pixels, task=args.task, tasks=args.tasks,
                   finish=args.finish)


def main(argv=None) -> int:
    """CLI entry point; returns the exit status (see :func:`formats.cli.run_cli`)."""
    return run_cli(
        "folder2shards.py", get_args_parser(), argv, "existing shards",
        # against the shards' own SHA-256s where progress.json still has them
        lambda args: verify(args.verify, args.dataset, workers=args.workers,
                            digests=shard_digests(args.verify), split=args.split),
        _convert_or_index,
        (ConversionError, DatasetError, ShardFormatError, ValueError, OSError))


if __name__ == "__main__":
    sys.exit(main())
