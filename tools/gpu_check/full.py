"""The full check (``make gpu-check``, 35-40 minutes on an H100 machine; docs/gpu-check.md):
every section in order of value per second, a row per command, the report always written.

Target: the best loader's training at >= 95% of synthetic data's images/s (capped by the
loader alone). A check skipped (not installed, the time budget, skipped by pytest) or timed
out is *not proven*, never passed.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import sys
import time

from . import markdown
from . import report as report_
from .rows.dali import dali_rows
from .machine.data import prepare_data
from .rows.gpu_decode import gpu_decode_rows
from .machine.install import install, join_parts
from .machine.environment import environment
from .rows.base import (LOW_RES, TIMEOUTS, announce, loader_flags, loader_row, pytest_piece,
                        train_row)
from .runner import REPO, Runner, crashed, fail, skipped

# synthetic first: the others are shares of it
LOADERS = ("synthetic", "folder", "lmdb", "dali", "dali-lmdb")
TARGET_RATIO, COMPILE_GAIN = 0.95, 1.05


def gpu_test_files() -> list[str]:
    """``tests/**/test_*.py`` files (relative to the repository) with ``gpu``-marked tests."""
    marked = re.compile(r"^\s*(pytestmark\s*=\s*pytest\.mark\.gpu|@pytest\.mark\.gpu)", re.M)
    found = []
    for path in sorted(glob.glob(os.path.join(REPO, "tests", "**", "test_*.py"), recursive=True)):
        with open(path, errors="replace") as f:
            if marked.search(f.read()):
                found.append(os.path.relpath(path, REPO))
    return found


def pytest_section(runner: Runner, machine: dict, sample: str | None = None) -> list[dict]:
    """The GPU-marked tests, one pytest run per file (each with its own timeout, so a slow
    file times out alone)."""
    if not machine.get("pytest"):
        return [announce(runner, skipped("pytest", "not available: pytest not installed"))]
    return [announce(runner, pytest_piece(runner, path, sample)) for path in gpu_test_files()]


def training(runner: Runner, s, data, machine, models: list[str]) -> list[dict]:
    """Training rows of ``models`` on every loader, each as a share of synthetic."""
    rows = []
    for model in models:
        synthetic = None
        for loader in LOADERS:
            row = train_row(runner, s, data, machine, model, loader)
            synthetic = synthetic or row
            rows.append(announce(runner, report_.over_synthetic(row, synthetic, s.dry_run)))
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
    """The first model at :data:`LOW_RES` px against its 224 px rows (synthetic, the best
    loader, DALI-LMDB), ``speedup`` = images/s at 160 px over images/s at 224 px."""
    model, out = s.models[0], []
    low = 16 if s.dry_run else LOW_RES  # the dry run trains at 32 px
    best = report_.best_loader(rows, model)
    wanted = ["synthetic", *([best["loader"]] if best else [])]
    for loader in wanted + [x for x in ("dali-lmdb",) if x not in wanted]:
        row = train_row(runner, s, data, machine, model, loader, res=low)
        row["speedup"] = report_.ratio(row, report_.find(rows, model, loader))
        out.append(announce(runner, row))
    return out


def loader_only(runner: Runner, s, data, machine) -> list[dict]:
    """``main.py --benchmark-data`` for each real loader; with ``-j auto`` on more than 9 cores
    the CPU loaders again with a worker per core but one (does training need a core?)."""
    rows = []
    cores = machine.get("cpu_cores") or 0
    for loader in ("folder", "lmdb", "dali", "dali-lmdb"):
        flags = loader_flags(loader, data, machine)
        if isinstance(flags, str):
            rows.append(announce(runner, skipped(f"loader-{loader}", flags, loader=loader)))
            continue
        every = [s.workers] + ([str(cores - 1)] if s.workers == "auto" and cores - 1 > 8
                               and not loader.startswith("dali") and not s.dry_run else [])
        for workers in every:
            name = f"loader-{loader}" + ("" if workers == s.workers else f"-j{workers}")
            rows.append(announce(runner, loader_row(runner, s, machine, loader, flags, workers,
                                                    name)))
    return rows


def nccl(runner: Runner, s, data, machine) -> dict:
    """A short ``--multiprocessing-distributed`` run on every GPU (gloo, 2 CPU processes in a
    dry run); passes when it exits 0 with a val_acc1 in metrics.jsonl."""
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


def run_all(s) -> dict:
    """Every selected section (:func:`run_sections`); returns the report, finished even when
    this script fails (a failed ``gpu-check`` row) or is interrupted (``interrupted`` True)."""
    runner = Runner(s.out, s.budget, dry_run=s.dry_run)
    report = {"tool": "gpu-check", "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
              "dry_run": s.dry_run, "budget_seconds": s.budget, "settings": report_.settings_of(s),
              "sections": {"environment": [], "setup": []}}
    try:
        run_sections(runner, s, report)
    except KeyboardInterrupt:
        report["interrupted"] = True
    except Exception as exc:  # noqa: BLE001 -- whatever it is, the report must be written
        report["sections"]["internal"] = [announce(runner, crashed("gpu-check", exc))]
    return report_.finish(report, runner.elapsed())


def run_sections(runner: Runner, s, report: dict) -> None:
    """Every selected section in order of value per second (cheap proofs first, --compile
    last: the environment, GPU tests, NCCL, training, loaders alone, DALI, the batch decode,
    160 px), filling ``report`` as they finish."""
    sections = report["sections"]
    joined, records = join_parts(s.parts, os.path.join(s.out, "wheels-joined"))
    setup = sections["setup"] = [announce(runner, r) for r in records + install(
        runner, s.wheels + s.dali_wheels + joined, os.path.join(s.out, "site"))]
    machine, env = environment(runner, s)
    report["machine"] = machine
    sections["environment"] = [announce(runner, env)]
    if env["status"] != "passed" and not s.dry_run:
        return  # no GPU: nothing else means anything
    data = None
    if s.only - {"pytest"}:
        data, prepared = prepare_data(runner, s, machine, TIMEOUTS["lmdb"])
        setup += [announce(runner, r) for r in prepared]
    if "pytest" in s.only:
        sections["pytest"] = pytest_section(runner, machine, os.path.dirname(s.train_src))
    if "nccl" in s.only:
        sections["nccl"] = [nccl(runner, s, data, machine)]
    rows = []
    if s.only & {"train", "compile", "resolution"}:
        rows = sections["training"] = training(runner, s, data, machine, s.models[:1])
    if "loaders" in s.only:
        sections["loaders"] = loader_only(runner, s, data, machine)
    if "dali" in s.only:
        sections["dali"] = dali_rows(runner, s, data, machine)
    if "gpudecode" in s.only:
        sections["gpudecode"] = gpu_decode_rows(runner, s, data, machine)
    if "resolution" in s.only and rows:
        sections["resolution"] = resolution_rows(runner, s, data, machine, rows)
    if "train" in s.only or "compile" in s.only:
        rows += training(runner, s, data, machine, s.models[1:])  # into sections["training"]
    if "compile" in s.only:
        sections["compile"] = compile_rows(runner, s, data, machine, rows)
    if rows:
        report["target"] = report_.target(rows, s.models[0], TARGET_RATIO, s.dry_run,
                                          sections.get("loaders"))
    if data is not None and not s.keep_data:
        shutil.rmtree(os.path.join(s.out, "data"), ignore_errors=True)


def full_main(s) -> int:
    """Run the full check and write its report; returns :func:`.report.exit_status`, or 130
    when interrupted."""
    print(f"gpu-check: {'dry run (CPU), ' if s.dry_run else ''}budget {s.budget:.0f} s, "
          f"report in {s.out}", flush=True)
    report = run_all(s)
    markdown.write(s.out, report)
    print(report_.summary_text(report, s.out), flush=True)
    if report.get("interrupted"):
        print("gpu_check: interrupted; the report holds the checks that finished",
              file=sys.stderr)
        return 130
    return report_.exit_status(report)
