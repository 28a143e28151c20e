"""The command line of ``python -m tools.gpu_check`` and the run settings it resolves to
(sizes, flags, the bundle's paths); the check itself and its entry are :mod:`.check`."""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
from types import SimpleNamespace

from .runner import REPO

DESCRIPTION = ("Check and measure the GPU path on a GPU host, most important rows first "
               "(docs/gpu-check.md): all rows, or what fits a time budget, or one step of an "
               "offline bundle.")


class InputError(Exception):
    """Bad input to the check, the bundle or the dry run (a path, a size, a duration, a step
    that does not exist): one line, exit status 2."""


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=DESCRIPTION,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="gpu-check-output", help="report folder, also the state "
                   "kept between the steps of an offline bundle (created)")
    p.add_argument("--bundle", help="folder from `make gpu-bundle` (wheels/, sample/, steps/); "
                   "default .gpu-bundle")
    p.add_argument("--data", help="image folder holding train/ (and val/) instead of the "
                   "bundle's sample")
    p.add_argument("--budget", type=duration, help="time budget (15m, 900, 1h30m): rows run "
                   "in order while their expected time fits, and the report lists the rest; "
                   "default: every row")
    p.add_argument("--step", type=int, metavar="N", help="run step N of a bundle made with "
                   "--step-size (its files in BUNDLE/steps/N); the state stays in --out")
    p.add_argument("--archive", help="file or folder for the report archive (default "
                   "OUT/gpu-check[-stepN].tar.gz), rewritten after every row")
    p.add_argument("--rows", nargs="+", metavar="PATTERN",
                   help="only the rows matching these (fnmatch) patterns")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU check of this script: --no-accel, 32 px, -b 4, resnet18, 2 steps")
    p.add_argument("--steps", type=int, help="timed steps per row, after a warm-up past "
                   "every batch the pipeline holds ready (default 200; dry 2)")
    p.add_argument("--warmup", type=int, help="warm-up steps beyond the pipeline's ready "
                   "batches, for cuDNN's tuning (default 5; dry 1)")
    p.add_argument("-b", "--batch-size", type=int, help="images per step (default 256; dry 4)")
    p.add_argument("-j", "--workers", help="main.py -j (default auto; dry 0)")
    p.add_argument("--keep-data", action="store_true",
                   help="keep OUT/data (the replicated sample and its LMDBs, ~8 GB)")
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    return p


def duration(text: str) -> float:
    """Seconds of ``15m``, ``900``, ``900s``, ``1h30m``; argparse's error otherwise."""
    parts = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*"
                         r"(?:(\d+(?:\.\d+)?)s?)?\s*", text or "")
    if not text or not text.strip() or not parts:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a duration such as 15m, 900 "
                                         "or 1h30m")
    h, m, sec = (float(x or 0) for x in parts.groups())
    return h * 3600 + m * 60 + sec


def settings(args) -> SimpleNamespace:
    """Sizes and flags of every run; raises :class:`InputError` for a bad size or path."""
    dry = args.dry_run
    s = SimpleNamespace(
        dry_run=dry, budget=args.budget, out=os.path.abspath(args.out), step=args.step,
        steps=pick(args.steps, 2 if dry else 200), warmup=pick(args.warmup, 1 if dry else 5),
        batch=pick(args.batch_size, 4 if dry else 256),
        # dry run: in-process loading, as each worker process would import torch again
        workers=args.workers or ("0" if dry else "auto"),
        sizes=["--train-crop-size", "32", "--val-resize-size", "32", "--val-crop-size", "32"]
        if dry else [],
        # one GPU for every single-process run: without --gpu, main.py (as pytorch/examples)
        # wraps the model in DataParallel over all visible GPUs
        accel=["--no-accel"] if dry else ["--gpu", "0"],
        rows=args.rows, keep_data=args.keep_data, data=args.data, archive=args.archive)
    if s.steps < 1 or s.warmup < 0 or s.batch < 1:
        raise InputError("--steps and -b must be >= 1 and --warmup >= 0")
    if not (s.workers == "auto" or s.workers.isdigit()):
        raise InputError(f"-j {s.workers}: expected a number of workers or 'auto'")
    s.bundle = os.path.abspath(args.bundle or os.path.join(REPO, ".gpu-bundle"))
    if args.bundle and not os.path.isdir(s.bundle):
        raise InputError(f"--bundle {args.bundle}: no such directory (make gpu-bundle writes it)")
    if args.data and not os.path.isdir(args.data):
        raise InputError(f"--data {args.data}: no such directory")
    s.step_info = read_step(s.bundle, s.step) if s.step else None
    if s.step is None or s.step == 1:
        bundle_paths(s, s.bundle if s.step is None else step_folder(s.bundle, 1))
    return s


def read_step(bundle: str, number: int) -> dict:
    """``BUNDLE/steps/N/STEP.json`` (:mod:`.bundle.steps`). Raises :class:`InputError`."""
    path = os.path.join(step_folder(bundle, number), "STEP.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        raise InputError(f"--step {number}: no {path} (make gpu-bundle STEP_SIZE=64M writes "
                         "the steps; copy step N's folder to the host before running it)") from None


def step_folder(bundle: str, number: int) -> str:
    return os.path.join(bundle, "steps", str(number))


def bundle_paths(s, bundle: str) -> None:
    """The wheels and images of ``bundle`` (or ``s.data``) into ``s``. Raises
    :class:`InputError` without a train/ folder of images."""
    from .rows.measure import list_images

    s.wheels = sorted(glob.glob(os.path.join(bundle, "wheels", "*.whl")))
    s.dali_wheels = sorted(glob.glob(os.path.join(bundle, "wheels-dali", "*.whl")))
    s.parts = os.path.join(bundle, "parts")
    sample = s.data or os.path.join(bundle, "sample")
    flag = "--data" if s.data else "--bundle"
    if not os.path.isdir(os.path.join(sample, "train")):
        raise InputError(f"{flag} {s.data or bundle}: no train/ folder with images in "
                         f"{sample} (run make gpu-bundle, or pass --data DIR)")
    s.train_src = os.path.abspath(os.path.join(sample, "train"))
    val = os.path.join(sample, "val")
    s.val_src = os.path.abspath(val if os.path.isdir(val) else s.train_src)
    s.images = list_images(s.train_src)
    if not s.images:
        raise InputError(f"{flag}: {s.train_src} has no images in class folders")


def pick(value, default):
    return default if value is None else value
