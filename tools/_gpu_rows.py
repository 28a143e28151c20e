"""One row of ``gpu_check.py``'s report each: a ``main.py`` training run, a loader alone
(``--benchmark-data``), the data flags of every loader, and the progress line each prints.
Shared by ``gpu_check.py``'s sections and ``_gpu_dali.py``."""
from __future__ import annotations

import glob
import os
import re
import shutil
import sys
import time
from types import SimpleNamespace

from . import _gpu_report as report_
from ._gpu_runner import Runner, fail, skipped

# seconds per command; each pytest piece (one test file) fits a cold machine: torch.compile's
# first compile, three training runs and an NCCL spawn in tests/engine/test_gpu.py
NO_TESTS_RAN = 5  # pytest's exit status when every test was skipped at collection
TIMEOUTS = {"lmdb": 600, "pytest": 600, "train": 240,
            "compile": 420, "loaders": 180, "nccl": 240, "resolution": 240}


def loader_flags(loader: str, data: SimpleNamespace, machine: dict) -> list[str] | str:
    """main.py's data flags for ``loader``, or why it cannot run."""
    if loader == "synthetic":
        return ["--dummy"]
    if loader.startswith("dali") and not machine.get("dali"):
        return "not installed"
    if data.reason:
        return data.reason
    if loader == "gpudecode-lmdb":  # the batch-decode pipeline's --decode-device is the caller's
        loader = "lmdb"
    if loader in ("lmdb", "dali-lmdb"):
        return data.lmdb_reason or (["--dali"] if loader == "dali-lmdb" else []) + [
            "--lmdb", "--train", os.path.join(data.lmdb, "train"), "--val",
            os.path.join(data.lmdb, "val")]
    return (["--dali"] if loader == "dali" else []) + ["--train", data.train, "--val", data.val]


def train_row(runner: Runner, s, data, machine, model: str, loader: str,
              compiled: bool = False, res: int | None = None, extra: list[str] = (),
              name: str | None = None, workers: str | None = None,
              timeout: float | None = None) -> dict:
    """One ``main.py`` training run (1 epoch of warm-up + steps batches; ``res``: at
    ``--train-crop-size res``; ``extra``: more flags, e.g. ``--decode-device cuda``;
    ``workers``: ``-j`` instead of ``s.workers``; ``name``: the row's instead of the one made
    from model, loader, compile and res; ``timeout``: seconds instead of :data:`TIMEOUTS`);
    images/s from its ``metrics.jsonl`` (``steady_images_per_sec``, else
    ``train_images_per_sec``), and why: ``stages``, the last epoch's ``stages_*`` figures,
    bound and advice, and ``stage_lines``, the stage table main.py printed for it."""
    name = name or (f"train-{model}-{loader}" + ("-compile" if compiled else "")
                    + (f"-{res}px" if res else ""))
    row = {"model": model, "loader": loader, "compile": compiled, **({"res": res} if res else {})}
    flags = loader_flags(loader, data, machine)
    if isinstance(flags, str):
        return skipped(name, flags, **row)
    rundir = os.path.join(s.out, "runs", name)
    shutil.rmtree(rundir, ignore_errors=True)
    cmd = [sys.executable, "main.py", *flags, "-a", model, "--amp", "--channels-last",
           "-b", str(s.batch), "--epochs", "1", "--train-batches", str(s.warmup + s.steps),
           "--val-batches", "1", "-p", "0", "--seed", "0", "--benchmark-warmup", str(s.warmup),
           "-j", workers or s.workers, *s.sizes, *s.accel, "--output-dir", rundir]
    cmd += (["--compile"] if compiled else []) + (["--train-crop-size", str(res)] if res else [])
    cmd += list(extra)
    rec = runner.run(name, cmd, timeout or TIMEOUTS["compile" if compiled else "resolution"
                                                    if res else "train"])
    row.update(rec)
    for checkpoint in glob.glob(os.path.join(rundir, "*.pth.tar")):
        os.remove(checkpoint)  # a ResNet-50 checkpoint is 100 MB, and only speed is wanted here
    if rec["status"] != "passed":
        return row
    device = re.search(r"^device: (\S+?);", runner.text(name), re.M)
    row["device"] = device.group(1) if device else None
    row["stage_lines"] = report_.stage_lines(runner.text(name))
    try:
        row.update(report_.read_speed(rundir))
    except ValueError as exc:
        row = fail(row, str(exc))
        runner.attach_tails(row)
        return row
    if not s.dry_run and not (row["device"] or "").startswith("cuda"):
        return fail(row, f"ran on {row['device']}, not a GPU")
    return row


def loader_row(runner: Runner, s, loader: str, flags: list[str], workers: str,
               name: str, timeout: float | None = None) -> dict:
    """One ``main.py --benchmark-data`` run of ``loader`` with ``-j workers`` (``flags`` last:
    a ``--train-crop-size`` there wins over the dry run's sizes): its JSON line's figures, the
    ``stages_*`` ones as ``stages`` (:func:`~tools._gpu_report.stage_figures`), with
    ``stage_lines``, the stage table it printed (the loader's side of why its images/s is what
    it is)."""
    rec = runner.run(name, [sys.executable, "main.py", "--benchmark-data",
                            "--train-batches", str(s.steps), "--benchmark-warmup",
                            str(s.warmup), "-b", str(s.batch), "--channels-last", "--amp",
                            "-j", workers, *s.sizes, *s.accel, *flags],
                     timeout or TIMEOUTS["loaders"])
    rec["loader"] = loader
    result = report_.last_json(runner.text(name)) if rec["status"] == "passed" else None
    if rec["status"] == "passed" and not (result or {}).get("images_per_sec"):
        rec = fail(rec, "no JSON line with images_per_sec on stdout")
        runner.attach_tails(rec)
    if result and rec["status"] == "passed":  # its "seconds" is the timed part only
        stages = report_.stage_figures(result)
        rec.update({k: v for k, v in result.items() if k != "seconds" and k not in stages},
                   timed_seconds=result.get("seconds"), loader=loader, stages=stages,
                   stage_lines=report_.stage_lines(runner.text(name)))
        if not s.dry_run and not str(rec.get("device")).startswith("cuda"):
            rec = fail(rec, f"ran on {rec.get('device')}, not a GPU")
    return rec


def announce(runner: Runner, record: dict) -> dict:
    """Print one progress line for ``record``; returns it."""
    print(report_.progress_line(runner.elapsed(), record), flush=True)
    return record


def gpu_over_cpu(gpu: dict, cpu: dict, minimum: float, dry_run: bool, failure: str) -> dict:
    """``gpu`` with ``gpu_over_cpu`` (its images/s over ``cpu``'s) where both rows have a
    figure, failed with ``failure`` (formatted with the ratio as ``{ratio:.2f}``) when the
    ratio is under ``minimum``, except in a dry run (which decodes on the CPU both times)."""
    if gpu.get("images_per_sec") and cpu.get("images_per_sec"):
        gpu["gpu_over_cpu"] = gpu["images_per_sec"] / cpu["images_per_sec"]
        if not dry_run and gpu["gpu_over_cpu"] < minimum:
            gpu = fail(gpu, failure.format(ratio=gpu["gpu_over_cpu"]))
    return gpu


def sample_env(sample: str | None) -> dict:
    """``IMAGENET_SAMPLE`` for the tests (``tests/helpers/paths.py``): the bundle's sample
    (``train/``, ``val/``), since ``../shared`` does not travel to a GPU machine and the
    GPU-vs-CPU pixel tests would skip; {} without one."""
    return {"IMAGENET_SAMPLE": sample} if sample else {}


def pytest_piece(runner: Runner, path: str, sample: str | None = None) -> dict:
    """``pytest -m gpu PATH`` (the sample folder ``sample`` as ``IMAGENET_SAMPLE``), parsed from
    pytest's summary line."""
    name = "pytest-" + os.path.splitext(os.path.basename(path))[0]
    rec = runner.run(name, [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rsfE",
                            "-p", "no:cacheprovider", path], TIMEOUTS["pytest"],
                     env=sample_env(sample))
    if rec["status"] in ("skipped", "timed out"):
        return rec
    parsed = report_.parse_pytest(runner.text(name))
    rec.update(parsed)
    counts = parsed["counts"]
    if rec.get("returncode") == NO_TESTS_RAN and counts.get("skipped") and not any(
            counts.get(k) for k in ("passed", "failed", "error")):
        skip = re.search(r"^SKIPPED \[\d+\] \S+: (.+)$", runner.text(name), re.M)
        return {**rec, "status": "skipped", "reason": skip.group(1) if skip else "skipped"}
    if rec["status"] == "passed" and not counts:
        rec = fail(rec, "no pytest summary line")
    if rec["status"] != "passed" and "stdout_tail" not in rec:
        runner.attach_tails(rec)
    return rec


def join_parts(folder: str, out: str) -> tuple[list[str], list[dict]]:
    """The wheels carried in parts in ``folder`` (``tools/wheel_parts.py``; DALI's, which no
    single 64 MiB transfer carries), reassembled and checked into ``out``, and the ``parts``
    record: passed, failed (a part missing or damaged: named) or none when ``folder`` holds no
    manifest."""
    from .wheel_parts import MANIFEST, PartsError, reassemble

    if not os.path.isfile(os.path.join(folder, MANIFEST)):
        return [], []
    started = time.perf_counter()
    try:
        wheels = reassemble(folder, out)
    except (PartsError, OSError) as exc:
        return [], [{"name": "parts", "status": "failed", "reason": str(exc),
                     "seconds": time.perf_counter() - started}]
    return wheels, [{"name": "parts", "status": "passed", "seconds": time.perf_counter() - started,
                     "joined": [os.path.basename(w) for w in wheels]}]
