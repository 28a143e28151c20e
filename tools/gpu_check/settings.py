"""The command line of ``python -m tools.gpu_check`` and the run settings it resolves to
(sizes, flags, the bundle's paths)."""
from __future__ import annotations

import argparse
import glob
import os
from types import SimpleNamespace

from .machine.data import list_images
from .runner import REPO

SECTIONS = ("pytest", "train", "loaders", "dali", "gpudecode", "nccl", "resolution",
            "compile")
TARGET_MODEL = "resnet50"
DESCRIPTION = ("Prove or disprove the GPU path (make gpu-check), or measure what matters most "
               "in a borrowed GPU's 15 minutes (--lease; docs/gpu-check.md).")


class InputError(Exception):
    """Bad input to the check, the bundle or the rehearsal (--bundle, --data, --images, --cuda, a
    call 1 too large, no git to list the files sent): one line, exit status 2."""


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=DESCRIPTION,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="gpu-check-output", help="report folder (created)")
    p.add_argument("--bundle", help="folder from `make gpu-bundle` (wheels/, sample/); "
                   "default .gpu-bundle")
    p.add_argument("--data", help="image folder holding train/ (and val/) instead of BUNDLE/sample")
    p.add_argument("--parts", help="folder of wheels carried in parts (NAME.partNN + "
                   "SHA256SUMS), reassembled and installed with BUNDLE/wheels; default "
                   "BUNDLE/parts")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU check of this script: --no-accel, 32 px, -b 4, resnet18, 2 steps")
    p.add_argument("--budget", type=float, default=3600.0, help="seconds; later checks are "
                   "skipped (the full check takes 35-40 min on an H100 machine)")
    p.add_argument("--steps", type=int, help="timed steps per row, after a warm-up past "
                   "every batch the pipeline holds ready (default 200; dry 2)")
    p.add_argument("--warmup", type=int, help="warm-up steps beyond the pipeline's ready "
                   "batches, for cuDNN's tuning (default 5; dry 1)")
    p.add_argument("-b", "--batch-size", type=int, help="images per step (default 256; dry 4)")
    p.add_argument("-j", "--workers", help="main.py -j (default auto; dry 0)")
    p.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    p.add_argument("--keep-data", action="store_true",
                   help="keep OUT/data (the replicated sample and its LMDBs, ~8 GB)")
    lease = p.add_argument_group("lease plan (docs/gpu-check.md)")
    lease.add_argument("--lease", action="store_true", help="one call of the lease plan on a "
                       "borrowed GPU: the same command every call")
    lease.add_argument("--lease-left", type=float, metavar="S", help="seconds of machine time "
                       "the lender reported left after the previous call (budget_left_s): the "
                       "call plans with it")
    lease.add_argument("--rehearse", action="store_true", help="the lease plan end to end on "
                       "this machine's CPU backends, with the borrowed machine's limits checked")
    lease.add_argument("--state", help="the lease's scratch folder, kept between calls "
                       "(default /tmp/gpu-check; never inside $OUT)")
    lease.add_argument("--archive", help="the one results file (default $OUT/gpu-check.tar.gz, "
                       "else STATE/gpu-check.tar.gz)")
    lease.add_argument("--rows", nargs="+", metavar="PATTERN",
                       help="only the plan's rows matching these (fnmatch) patterns")
    lease.add_argument("--fallback-start", action="store_true", help="--rehearse: as if the "
                       "first start failed once before the machine came")
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    return p


def settings(args) -> SimpleNamespace:
    """Sizes and flags of every run; raises :class:`InputError` for a bad path or size."""
    dry = args.dry_run
    s = SimpleNamespace(
        dry_run=dry, budget=args.budget, out=os.path.abspath(args.out),
        steps=pick(args.steps, 2 if dry else 200), warmup=pick(args.warmup, 1 if dry else 5),
        batch=pick(args.batch_size, 4 if dry else 256),
        # dry run: in-process loading, as each worker process would import torch again
        workers=args.workers or ("0" if dry else "auto"),
        models=["resnet18"] if dry else [TARGET_MODEL, "resnet18"],
        sizes=["--train-crop-size", "32", "--val-resize-size", "32", "--val-crop-size", "32"]
        if dry else [],
        # one GPU for every single-process run: without --gpu, main.py (as pytorch/examples)
        # wraps the model in DataParallel over all visible GPUs
        accel=["--no-accel"] if dry else ["--gpu", "0"],
        only=set(args.only or SECTIONS), keep_data=args.keep_data)
    check_not_in_out(s.out, "--out")
    if s.steps < 1 or s.warmup < 0 or s.batch < 1:
        raise InputError("--steps and -b must be >= 1 and --warmup >= 0")
    if not (s.workers == "auto" or s.workers.isdigit()):
        raise InputError(f"-j {s.workers}: expected a number of workers or 'auto'")
    bundle = args.bundle or os.path.join(REPO, ".gpu-bundle")
    if args.bundle and not os.path.isdir(bundle):
        raise InputError(f"--bundle {args.bundle}: no such directory (make gpu-bundle writes it)")
    s.wheels = sorted(glob.glob(os.path.join(bundle, "wheels", "*.whl")))
    # DALI's own dependencies (make gpu-bundle's wheels-dali/; DALI itself may be in parts)
    s.dali_wheels = sorted(glob.glob(os.path.join(bundle, "wheels-dali", "*.whl")))
    s.parts = args.parts or os.path.join(bundle, "parts")
    if args.parts and not os.path.isdir(args.parts):
        raise InputError(f"--parts {args.parts}: no such directory")
    sample = args.data or os.path.join(bundle, "sample")
    flag = "--data" if args.data else "--bundle"
    if not os.path.isdir(os.path.join(sample, "train")):
        raise InputError(f"{flag} {args.data or bundle}: no train/ folder with images in "
                         f"{sample} (run make gpu-bundle, or pass --data DIR)")
    s.train_src = os.path.abspath(os.path.join(sample, "train"))
    val = os.path.join(sample, "val")
    s.val_src = os.path.abspath(val if os.path.isdir(val) else s.train_src)
    s.images = list_images(s.train_src)
    if not s.images:
        raise InputError(f"{flag}: {s.train_src} has no images in class folders")
    return s


def check_not_in_out(path: str, flag: str) -> None:
    """Raise :class:`InputError` when ``path`` is ``$OUT`` or inside it: on a borrowed machine
    ``$OUT`` comes back (at most 8 files of 16 MiB), and scratch of gigabytes there would make
    the try return nothing; results go there as one archive (``--archive``)."""
    out = os.environ.get("OUT")
    if not out:
        return
    top, here = os.path.realpath(out), os.path.realpath(path)
    if here == top or here.startswith(top.rstrip(os.sep) + os.sep):
        raise InputError(f"{flag} {path} is inside $OUT ({out}), the folder that comes back "
                         "from a borrowed machine: give a scratch folder elsewhere and "
                         "--archive $OUT/gpu-check.tar.gz")


def pick(value, default):
    return default if value is None else value
