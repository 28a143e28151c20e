"""Prove or disprove the whole GPU path in one command (``make gpu-check``, 30-35 minutes on an
H100 machine), or measure what matters most in a borrowed GPU's 15 minutes (``--lease``).

    python3 -m tools.gpu_check --out gpu-check-output              # on a GPU machine with time
    python3 -m tools.gpu_check --out /tmp/gc --dry-run --data DIR   # CPU, tiny sizes (tests)
    python3 -m tools.gpu_check --lease                  # each device call of a borrowed GPU
    python3 -m tools.gpu_check --rehearse               # those calls here, limits checked

``--lease`` and ``--rehearse``: ``_gpu_lease.py``, ``_gpu_plan.py`` (the rows, declared once)
and ``_gpu_rehearse.py``; docs/gpu-check.md says which calls to make. The rest of this
docstring is the full check.

Needs the source tree, a Python with torch and torchvision, and ``.gpu-bundle/`` (``make
gpu-bundle``: lmdb and pytest wheels, 100 real ImageNet images); no network and no venv. lmdb
or pytest missing from this interpreter are installed from ``BUNDLE/wheels`` into ``OUT/site``,
which goes on ``PYTHONPATH`` for every command. Every check is a subprocess run from the
repository root with its own timeout, so one failure never stops the others:

1. environment: GPU, driver, CUDA, torch, torchvision, DALI, CPU cores, Python;
2. ``python -m pytest -m gpu tests/FILE`` for each file with GPU tests, each with its own
   timeout: counts and failing tests;
3. training images/s through ``main.py`` itself on one GPU (``--gpu 0``: never
   DataParallel over the machine's GPUs; ResNet-50 and ResNet-18, ``--amp --channels-last
   -b 256``) on synthetic, JPEG-folder, LMDB and DALI data, each loader as a
   share of synthetic (target: ResNet-50's best loader >= 95%); ``--compile`` on synthetic,
   and on the best loader when it gains more than 5%;
4. loader-only images/s (``main.py --benchmark-data``);
5. ``main.py --multiprocessing-distributed`` with NCCL on every GPU;
6. progressive resizing's gain (issue 17): ResNet-50 trained at 160 px (FFCV's ``min_res``)
   against 224 px, on synthetic data, the best loader and DALI reading the LMDB (half the
   side in a dry run);
7. DALI's GPU decoding (``_gpu_dali.py``, issue 37): proof that nvJPEG decodes on the GPU, the
   hardware decoder's share and ``-j`` swept, ResNet-18 at 160 px, memory across epochs.
8. GPU decoding without DALI (``_gpu_decode.py``, issue 38: ``--decode-device cuda``): proof
   that nvImageCodec decodes windows into GPU memory, the hardware share and ``-j`` swept,
   ResNet-50 and ResNet-18 at 224 and 160 px.

DALI's wheel, too large for one transfer, may come in parts (``--parts``, ``make gpu-bundle``
prints the calls): reassembled, checked and installed with the other wheels first.

The sample is replicated with symlinks so no epoch ends inside the timed steps. Checks that
would start after ``--budget`` seconds are reported as skipped, and one that is still running
when the budget runs out is stopped (at the earliest 60 s after it started) and reported so.
A check still running at its own time limit is reported as "timed out", not failed. Writes
``OUT/report.json`` (everything), ``OUT/report.md`` (tables, commands, machine) and
``OUT/logs/`` (each command's stdout and stderr), whatever fails (an error of this script
itself becomes a failed ``gpu-check`` row). A GPU check that was skipped (not installed, time
budget, GPU tests skipped by pytest) or timed out is listed as *not proven*, never as passed.
Exit status 0 when every check ran and passed, 1 when one failed, 3 when none failed but
some are not proven (a dry run: 0, it proves the script, not the GPU), 2 for bad input (one
line on stderr), 130 when interrupted (the report so far is written).
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import sys
import time
import traceback

from . import _gpu_markdown
from . import _gpu_report as report_
from ._gpu_dali import dali_rows
from ._gpu_decode import gpu_decode_rows
from ._gpu_rows import (TIMEOUTS, announce, join_parts, loader_flags, loader_row, pytest_piece,
                        train_row)
from ._gpu_runner import (REPO, Runner, environment, fail, install, prepare_data, probe,
                          skipped)
from ._gpu_settings import InputError, get_args_parser, settings

# synthetic first: the others are shares of it; dali-lmdb: DALI reading the LMDB (issue 37's
# target pipeline), dali: DALI reading the JPEG folders
LOADERS = ("synthetic", "folder", "lmdb", "dali", "dali-lmdb")
TARGET_RATIO, COMPILE_GAIN = 0.95, 1.05
LOW_RES = 160  # FFCV's min_res: the side of a progressive run's first epochs


def gpu_test_files() -> list[str]:
    """``tests/**/test_*.py`` files (relative to the repository) that hold ``gpu``-marked
    tests."""
    marked = re.compile(r"^\s*(pytestmark\s*=\s*pytest\.mark\.gpu|@pytest\.mark\.gpu)", re.M)
    found = []
    for path in sorted(glob.glob(os.path.join(REPO, "tests", "**", "test_*.py"), recursive=True)):
        with open(path, errors="replace") as f:
            if marked.search(f.read()):
                found.append(os.path.relpath(path, REPO))
    return found


def pytest_section(runner: Runner, machine: dict, sample: str | None = None) -> list[dict]:
    """Section 2: the GPU-marked tests, one pytest run per file (each with its own timeout, so
    a slow file is reported as timed out without taking the others down)."""
    if not machine.get("pytest"):
        return [announce(runner, skipped("pytest", "not available: pytest not installed"))]
    return [announce(runner, pytest_piece(runner, path, sample)) for path in gpu_test_files()]


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
    wanted = ["synthetic", *([best["loader"]] if best else [])]
    for loader in wanted + [x for x in ("dali-lmdb",) if x not in wanted]:
        row = train_row(runner, s, data, machine, model, loader, res=low)
        row["speedup"] = report_.ratio(row, report_.find(rows, model, loader))
        out.append(announce(runner, row))
    return out


def loader_only(runner: Runner, s, data, machine) -> list[dict]:
    """Section 4: ``main.py --benchmark-data`` for each real loader (its last JSON line), with
    ``-j`` as set; with ``-j auto`` on a machine of more than 9 cores the folder and LMDB
    loaders again with one worker per core but one (``-j auto`` takes every core since issue
    38, so this row measures leaving one to the training process; the first H100 run's 8
    workers, then ``-j auto``'s cap, fed ResNet-50 at 62% of its synthetic images/s, 16
    cores)."""
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
            rows.append(announce(runner, loader_row(runner, s, loader, flags, workers, name)))
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





def run_all(s) -> dict:
    """Every selected section (:func:`run_sections`); returns the report, finished even when
    this script itself fails (a failed ``gpu-check`` row with the traceback's tail) or is
    interrupted (``interrupted`` True; the caller re-raises nothing)."""
    runner = Runner(s.out, s.budget)
    report = {"tool": "gpu-check", "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
              "dry_run": s.dry_run, "budget_seconds": s.budget, "settings": report_.settings_of(s),
              "sections": {"environment": [], "setup": []}}
    try:
        run_sections(runner, s, report)
    except KeyboardInterrupt:
        report["interrupted"] = True
    except Exception as exc:  # noqa: BLE001 -- whatever it is, the report must be written
        report["sections"]["internal"] = [announce(runner, {
            "name": "gpu-check", "status": "failed", "reason": f"{type(exc).__name__}: {exc}",
            "stderr_tail": traceback.format_exc()[-3000:]})]
    return report_.finish(report, runner.elapsed())


def run_sections(runner: Runner, s, report: dict) -> None:
    """Every selected section in order of value per second (cheap proofs first, --compile
    last), filling ``report`` as they finish."""
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


def main_cli(argv=None) -> int:
    """Console entry: 0 when every check ran and passed, 1 when one failed, 3 when none failed
    but some are not proven on a GPU (skipped or timed out; never in a dry run), 2 for bad
    input, 130 when interrupted."""
    args = get_args_parser(__doc__.splitlines()[0]).parse_args(argv)
    if args.probe:
        print(json.dumps(probe()))
        return 0
    if args.lease:
        from ._gpu_lease import lease_main
        return lease_main(args)
    if args.rehearse:
        from ._gpu_rehearse import rehearse_main
        return rehearse_main(args)
    try:
        s = settings(args)
        os.makedirs(s.out, exist_ok=True)
    except (InputError, OSError) as exc:
        print(f"gpu_check.py: error: {exc}", file=sys.stderr)
        return 2
    print(f"gpu-check: {'dry run (CPU), ' if s.dry_run else ''}budget {s.budget:.0f} s, "
          f"report in {s.out}", flush=True)
    report = run_all(s)
    _gpu_markdown.write(s.out, report)
    print(report_.summary_text(report, s.out), flush=True)
    if report.get("interrupted"):
        print("gpu_check.py: interrupted; the report holds the checks that finished",
              file=sys.stderr)
        return 130
    return report_.exit_status(report)


if __name__ == "__main__":
    sys.exit(main_cli())
