#!/usr/bin/env python
"""Prove or disprove the whole GPU path in one command (``make gpu-check``, about 8 minutes).

    python3 benchmarks/gpu_check.py --out gpu-check-output              # on a GPU machine
    python3 benchmarks/gpu_check.py --out /tmp/gc --dry-run --data DIR   # CPU, tiny sizes (tests)

Needs the source tree, a Python with torch and torchvision, and ``.gpu-bundle/`` (``make
gpu-bundle``: lmdb and pytest wheels, 100 real ImageNet images); no network and no venv. lmdb
or pytest missing from this interpreter are installed from ``BUNDLE/wheels`` into ``OUT/site``,
which goes on ``PYTHONPATH`` for every command. Every check is a subprocess run from the
repository root with its own timeout, so one failure never stops the others:

1. environment: GPU, driver, CUDA, torch, torchvision, DALI, CPU cores, Python;
2. ``python -m pytest -m gpu tests/``: counts and failing tests;
3. training images/s through ``main.py`` itself (ResNet-50 and ResNet-18, ``--amp
   --channels-last -b 256``) on synthetic, JPEG-folder, LMDB and DALI data, each loader as a
   share of synthetic (target: ResNet-50's best loader >= 95%); ``--compile`` on synthetic,
   and on the best loader when it gains more than 5%;
4. loader-only images/s (``main.py --benchmark-data``);
5. ``main.py --multiprocessing-distributed`` with NCCL on every GPU;
6. progressive resizing's gain (issue 17): ResNet-50 trained at 160 px (FFCV's ``min_res``)
   against 224 px, on synthetic data and on the best loader (half the side in a dry run).

The sample is replicated with symlinks so no epoch ends inside the timed steps. Checks that
would start after ``--budget`` seconds are reported as skipped, and one that is still running
when the budget runs out is stopped (at the earliest 60 s after it started) and reported so.
Writes ``OUT/report.json`` (everything), ``OUT/report.md`` (tables, commands, machine) and
``OUT/logs/`` (each command's stdout and stderr). Exit status 0 when every check passed, 1 when
one failed, 2 for bad input (one line on stderr).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _gpu_report as report_  # noqa: E402
from _gpu_runner import (REPO, Runner, environment, fail, install, list_images,  # noqa: E402
                         prepare_data, probe, skipped)

SECTIONS = ("pytest", "train", "loaders", "nccl", "resolution", "compile")
LOADERS = ("synthetic", "folder", "lmdb", "dali")  # synthetic first: the others are shares of it
TARGET_MODEL, TARGET_RATIO, COMPILE_GAIN = "resnet50", 0.95, 1.05
LOW_RES = 160  # FFCV's min_res: the side of a progressive run's first epochs
TIMEOUTS = {"lmdb": 600, "pytest": 240, "train": 240,
            "compile": 420, "loaders": 180, "nccl": 240, "resolution": 240}


class InputError(Exception):
    """Bad --bundle / --data / sizes: one line, exit status 2."""


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="gpu-check-output", help="report folder (created)")
    p.add_argument("--bundle", help="folder from `make gpu-bundle` (wheels/, sample/); "
                   "default .gpu-bundle")
    p.add_argument("--data", help="image folder holding train/ (and val/) instead of BUNDLE/sample")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU check of this script: --no-accel, 32 px, -b 4, resnet18, 2 steps")
    p.add_argument("--budget", type=float, default=480.0, help="seconds; later checks are skipped")
    p.add_argument("--steps", type=int, help="timed training steps per run (default 40; dry 2)")
    p.add_argument("--warmup", type=int, help="untimed steps first (default 10; dry 1)")
    p.add_argument("-b", "--batch-size", type=int, help="images per step (default 256; dry 4)")
    p.add_argument("-j", "--workers", help="main.py -j (default auto; dry 0)")
    p.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    p.add_argument("--keep-data", action="store_true",
                   help="keep OUT/data (the replicated sample and its LMDBs, ~1.5 GB)")
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    return p


def settings(args) -> SimpleNamespace:
    """Sizes and flags of every run; raises :class:`InputError` for a bad path or size."""
    dry = args.dry_run
    s = SimpleNamespace(
        dry_run=dry, budget=args.budget, out=os.path.abspath(args.out),
        steps=pick(args.steps, 2 if dry else 40), warmup=pick(args.warmup, 1 if dry else 10),
        batch=pick(args.batch_size, 4 if dry else 256),
        # dry run: in-process loading, as each worker process would import torch again (seconds
        # on 2 cores); tests/test_loaders.py covers the workers
        workers=args.workers or ("0" if dry else "auto"),
        models=["resnet18"] if dry else [TARGET_MODEL, "resnet18"],
        sizes=["--train-crop-size", "32", "--val-resize-size", "32", "--val-crop-size", "32"]
        if dry else [], accel=["--no-accel"] if dry else [],
        only=set(args.only or SECTIONS), keep_data=args.keep_data)
    if s.steps < 1 or s.warmup < 0 or s.batch < 1:
        raise InputError("--steps and -b must be >= 1 and --warmup >= 0")
    if not (s.workers == "auto" or s.workers.isdigit()):
        raise InputError(f"-j {s.workers}: expected a number of workers or 'auto'")
    bundle = args.bundle or os.path.join(REPO, ".gpu-bundle")
    if args.bundle and not os.path.isdir(bundle):
        raise InputError(f"--bundle {args.bundle}: no such directory (make gpu-bundle writes it)")
    s.wheels = sorted(glob.glob(os.path.join(bundle, "wheels", "*.whl")))
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


def pick(value, default):
    return default if value is None else value


def pytest_section(runner: Runner, machine: dict) -> dict:
    """Section 2: the GPU-marked tests, parsed from pytest's summary line."""
    if not machine.get("pytest"):
        return skipped("pytest", "not available: pytest not installed")
    rec = runner.run("pytest", [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rsfE",
                                "-p", "no:cacheprovider", "tests/"], TIMEOUTS["pytest"])
    if rec["status"] == "skipped":
        return rec
    parsed = report_.parse_pytest(runner.text("pytest"))
    rec.update(parsed)
    if rec["status"] == "passed" and not parsed["counts"]:
        rec = fail(rec, "no pytest summary line")
    if rec["status"] != "passed" and "stdout_tail" not in rec:
        runner.attach_tails(rec)
    return rec


def loader_flags(loader: str, data: SimpleNamespace, machine: dict) -> list[str] | str:
    """main.py's data flags for ``loader``, or why it cannot run."""
    if loader == "synthetic":
        return ["--dummy"]
    if loader == "dali" and not machine.get("dali"):
        return "not installed"
    if data.reason:
        return data.reason
    if loader == "lmdb":
        return data.lmdb_reason or ["--lmdb", "--train", os.path.join(data.lmdb, "train"),
                                    "--val", os.path.join(data.lmdb, "val")]
    return (["--dali"] if loader == "dali" else []) + ["--train", data.train, "--val", data.val]


def train_row(runner: Runner, s, data, machine, model: str, loader: str,
              compiled: bool = False, res: int | None = None) -> dict:
    """One ``main.py`` training run (1 epoch of warm-up + steps batches; ``res``: at
    ``--train-crop-size res``); images/s from its ``metrics.jsonl``
    (``steady_images_per_sec``, else ``train_images_per_sec``)."""
    name = f"train-{model}-{loader}" + ("-compile" if compiled else "") + (f"-{res}px" if res else "")
    row = {"model": model, "loader": loader, "compile": compiled, **({"res": res} if res else {})}
    flags = loader_flags(loader, data, machine)
    if isinstance(flags, str):
        return skipped(name, flags, **row)
    rundir = os.path.join(s.out, "runs", name)
    shutil.rmtree(rundir, ignore_errors=True)
    cmd = [sys.executable, "main.py", *flags, "-a", model, "--amp", "--channels-last",
           "-b", str(s.batch), "--epochs", "1", "--train-batches", str(s.warmup + s.steps),
           "--val-batches", "1", "-p", "0", "--seed", "0", "--benchmark-warmup", str(s.warmup),
           "-j", s.workers, *s.sizes, *s.accel, "--output-dir", rundir]
    cmd += (["--compile"] if compiled else []) + (["--train-crop-size", str(res)] if res else [])
    rec = runner.run(name, cmd, TIMEOUTS["compile" if compiled else "resolution" if res
                                         else "train"])
    row.update(rec)
    for checkpoint in glob.glob(os.path.join(rundir, "*.pth.tar")):
        os.remove(checkpoint)  # a ResNet-50 checkpoint is 100 MB, and only speed is wanted here
    if rec["status"] != "passed":
        return row
    device = re.search(r"^device: (\S+?);", runner.text(name), re.M)
    row["device"] = device.group(1) if device else None
    try:
        row.update(report_.read_speed(rundir))
    except ValueError as exc:
        row = fail(row, str(exc))
        runner.attach_tails(row)
        return row
    if not s.dry_run and not (row["device"] or "").startswith("cuda"):
        return fail(row, f"ran on {row['device']}, not a GPU")
    return row


def training(runner: Runner, s, data, machine, models: list[str]) -> list[dict]:
    """Section 3 for ``models``: every loader, each as a share of synthetic."""
    rows = []
    for model in models:
        synthetic = None
        for loader in LOADERS:
            row = train_row(runner, s, data, machine, model, loader)
            synthetic = synthetic or row
            row["ratio_to_synthetic"] = report_.ratio(row, synthetic)
            rows.append(announce(runner, row))
    return rows


def compile_rows(runner: Runner, s, data, machine, rows: list[dict]) -> list[dict]:
    """``--compile`` on synthetic for each model; if it gains > 5%, on the best loader too."""
    if s.dry_run:
        return [skipped("compile", "dry run")]
    out = []
    for model in s.models:
        row = train_row(runner, s, data, machine, model, "synthetic", compiled=True)
        eager = report_.find(rows, model, "synthetic")
        row["speedup"] = report_.ratio(row, eager)
        out.append(announce(runner, row))
        best = report_.best_loader(rows, model)
        if row["speedup"] and row["speedup"] > COMPILE_GAIN and best:
            loaded = train_row(runner, s, data, machine, model, best["loader"], compiled=True)
            loaded["speedup"] = report_.ratio(loaded, best)
            loaded["ratio_to_synthetic"] = report_.ratio(loaded, row)
            out.append(announce(runner, loaded))
    return out


def resolution_rows(runner: Runner, s, data, machine, rows: list[dict]) -> list[dict]:
    """Section 6: the first model at :data:`LOW_RES` px against its 224 px rows (synthetic,
    then the best loader), ``speedup`` = images/s at 160 px over images/s at 224 px."""
    model, out = s.models[0], []
    low = 16 if s.dry_run else LOW_RES  # the dry run trains at 32 px
    best = report_.best_loader(rows, model)
    for loader in ("synthetic", *([best["loader"]] if best else [])):
        row = train_row(runner, s, data, machine, model, loader, res=low)
        row["speedup"] = report_.ratio(row, report_.find(rows, model, loader))
        out.append(announce(runner, row))
    return out


def loader_only(runner: Runner, s, data, machine) -> list[dict]:
    """Section 4: ``main.py --benchmark-data`` for each real loader (its last JSON line)."""
    rows = []
    for loader in ("folder", "lmdb", "dali"):
        name, flags = f"loader-{loader}", loader_flags(loader, data, machine)
        if isinstance(flags, str):
            rows.append(announce(runner, skipped(name, flags, loader=loader)))
            continue
        rec = runner.run(name, [sys.executable, "main.py", *flags, "--benchmark-data",
                                "--train-batches", str(s.steps), "--benchmark-warmup",
                                str(s.warmup), "-b", str(s.batch), "--channels-last", "--amp",
                                "-j", s.workers, *s.sizes, *s.accel], TIMEOUTS["loaders"])
        rec["loader"] = loader
        result = report_.last_json(runner.text(name)) if rec["status"] == "passed" else None
        if rec["status"] == "passed" and not (result or {}).get("images_per_sec"):
            rec = fail(rec, "no JSON line with images_per_sec on stdout")
            runner.attach_tails(rec)
        if result and rec["status"] == "passed":  # its "seconds" is the timed part only
            rec.update({k: v for k, v in result.items() if k != "seconds"},
                       timed_seconds=result.get("seconds"), loader=loader)
            if not s.dry_run and not str(rec.get("device")).startswith("cuda"):
                rec = fail(rec, f"ran on {rec.get('device')}, not a GPU")
        rows.append(announce(runner, rec))
    return rows


def nccl(runner: Runner, s, data, machine) -> dict:
    """Section 5: a short ``--multiprocessing-distributed`` run on every GPU (gloo, 2 CPU
    processes in a dry run); passes when it exits 0 with a val_acc1 in metrics.jsonl."""
    if data.reason:
        return announce(runner, skipped("distributed", data.reason))
    world = 2 if s.dry_run else max(machine.get("gpu_count", 1), 1)
    backend = "gloo" if s.dry_run else "nccl"
    flags = ["--no-accel", "--nproc-per-node", "2"] if s.dry_run else []
    rundir = os.path.join(s.out, "runs", "distributed")
    shutil.rmtree(rundir, ignore_errors=True)
    rec = runner.run("distributed", [
        sys.executable, "main.py", "--multiprocessing-distributed", "-a", "resnet18", "--amp",
        "--channels-last", "--train", data.train, "--val", data.val, "-b", str(s.batch * world),
        "--epochs", "1", "--train-batches", "2", "--val-batches", "2", "-p", "0", "--seed", "0",
        "-j", s.workers, *s.sizes, *flags, "--dist-backend", backend, "--output-dir", rundir],
        TIMEOUTS["nccl"])
    # A launched process joins a process group even alone (main.py says so on its device line),
    # so one GPU still runs DDP over NCCL.
    group = f"({backend} process group)"
    rec.update(world_size=world, backend=backend,
               process_group=group in runner.text("distributed", "out"))
    for checkpoint in glob.glob(os.path.join(rundir, "*.pth.tar")):
        os.remove(checkpoint)
    if rec["status"] == "passed":
        records = report_.read_metrics(rundir)
        if not rec["process_group"]:
            rec = fail(rec, f"main.py did not report joining a {backend} process group")
        elif not any(r.get("val_acc1") is not None for r in records):
            rec = fail(rec, "no metrics.jsonl record with val_acc1")
        else:
            rec["val_acc1"] = records[-1]["val_acc1"]
    return announce(runner, rec)


def announce(runner: Runner, record: dict) -> dict:
    """Print one progress line for ``record``; returns it."""
    print(report_.progress_line(runner.elapsed(), record), flush=True)
    return record


def run_all(s) -> dict:
    """Every selected section in order of value per second (cheap proofs first, --compile
    last); returns the report."""
    runner = Runner(s.out, s.budget)
    report = {"tool": "gpu-check", "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
              "dry_run": s.dry_run, "budget_seconds": s.budget, "settings": report_.settings_of(s),
              "sections": {"environment": [], "setup": []}}
    sections = report["sections"]
    setup = sections["setup"] = [announce(runner, r) for r in
                                 install(runner, s.wheels, os.path.join(s.out, "site"))]
    machine, env = environment(runner, s)
    report["machine"] = machine
    sections["environment"] = [announce(runner, env)]
    if env["status"] != "passed" and not s.dry_run:
        return report_.finish(report, runner.elapsed())  # no GPU: nothing else means anything
    data = None
    if s.only - {"pytest"}:
        data, prepared = prepare_data(runner, s, machine, TIMEOUTS["lmdb"])
        setup += [announce(runner, r) for r in prepared]
    if "pytest" in s.only:
        sections["pytest"] = [announce(runner, pytest_section(runner, machine))]
    if "nccl" in s.only:
        sections["nccl"] = [nccl(runner, s, data, machine)]
    rows = []
    if s.only & {"train", "compile", "resolution"}:
        rows = sections["training"] = training(runner, s, data, machine, s.models[:1])
    if "loaders" in s.only:
        sections["loaders"] = loader_only(runner, s, data, machine)
    if "resolution" in s.only and rows:
        sections["resolution"] = resolution_rows(runner, s, data, machine, rows)
    if "train" in s.only or "compile" in s.only:
        rows += training(runner, s, data, machine, s.models[1:])  # into sections["training"]
    if "compile" in s.only:
        sections["compile"] = compile_rows(runner, s, data, machine, rows)
    if rows:
        report["target"] = report_.target(rows, s.models[0], TARGET_RATIO, s.dry_run)
    if data is not None and not s.keep_data:
        shutil.rmtree(os.path.join(s.out, "data"), ignore_errors=True)
    return report_.finish(report, runner.elapsed())


def main_cli(argv=None) -> int:
    """Console entry: 0 when every check passed, 1 when one failed, 2 for bad input."""
    args = get_args_parser().parse_args(argv)
    if args.probe:
        print(json.dumps(probe()))
        return 0
    try:
        s = settings(args)
        os.makedirs(s.out, exist_ok=True)
    except (InputError, OSError) as exc:
        print(f"gpu_check.py: error: {exc}", file=sys.stderr)
        return 2
    print(f"gpu-check: {'dry run (CPU), ' if s.dry_run else ''}budget {s.budget:.0f} s, "
          f"report in {s.out}", flush=True)
    try:
        report = run_all(s)
    except KeyboardInterrupt:
        print("gpu_check.py: interrupted; no report written", file=sys.stderr)
        return 130
    report_.write(s.out, report)
    counts = report["summary"]
    print(report_.summary_text(report, s.out), flush=True)
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main_cli())
