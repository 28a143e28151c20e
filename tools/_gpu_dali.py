"""Section ``dali`` of ``gpu_check.py``: DALI's GPU decoding proven and measured (issue 37).

* ``dali-gpu-decode``: nvJPEG decodes a probe JPEG into device memory through nvImageCodec, the
  library DALI's decoders are built on (``loaders.pipelines.dali.environment.gpu_decoding_problem``):
  a missing ``libnvjpeg`` would otherwise let DALI decode on the CPU and still "pass";
* ``loader-dali-mixed-j1`` against ``loader-dali-cpu-j1``: the loader alone with one CPU thread, decoding on
  the GPU and on the CPU; a GPU decode that is not clearly faster did not happen on the GPU;
* the hardware decoder's share (``--dali-hw-decoder-load`` 0.65, 0.9, 1.0) and ``-j`` (2, 4,
  8, 15) for the loader alone reading the LMDB;
* ResNet-18 trained at 160 px from DALI and from synthetic data (ResNet-50's 160 px rows are
  the ``resolution`` section's);
* memory: a 3-epoch DALI training run's host RSS and device memory after each epoch
  (``metrics.jsonl``), device memory flat after epoch 1 being the target.

A dry run (CPU, ``--no-accel``) runs one short row of each kind with DALI's CPU backend, which
proves this code, not the GPU.
"""
from __future__ import annotations

import json
import os
import shutil
import sys

from ._gpu_rows import announce, gpu_over_cpu, loader_flags, loader_row, train_row
from ._gpu_runner import Runner, fail, skipped

HW_LOADS = (0.65, 0.9, 1.0)
WORKERS = ("2", "4", "8", "15")
MEMORY_EPOCHS = 3
GPU_OVER_CPU = 1.5  # the GPU decode with one CPU thread must beat the CPU decode by this much
_PROBE = ("import json, torch; "
          "from loaders.pipelines.dali.environment import gpu_decoding_problem; "
          "print(json.dumps({'problem': gpu_decoding_problem(torch.device('cuda', 0))}))")


def dali_rows(runner: Runner, s, data, machine) -> list[dict]:
    """The section's rows (announced as they finish)."""
    flags = loader_flags("dali-lmdb", data, machine)
    if isinstance(flags, str):
        return [announce(runner, skipped("dali", flags))]
    rows = [announce(runner, decode_probe(runner, s))]
    rows += evidence(runner, s, flags)
    if not s.dry_run:
        for load in HW_LOADS:
            rows.append(announce(runner, {**loader_row(
                runner, s, "dali-lmdb", [*flags, "--dali-hw-decoder-load", str(load)],
                s.workers, f"loader-dali-hw{load}"), "hw_decoder_load": load}))
        for workers in WORKERS:
            rows.append(announce(runner, loader_row(
                runner, s, "dali-lmdb", flags, workers, f"loader-dali-j{workers}")))
    low = 16 if s.dry_run else 160
    for loader in ("synthetic", "dali-lmdb"):
        rows.append(announce(runner, train_row(runner, s, data, machine, "resnet18",
                                                           loader, res=low)))
    rows.append(announce(runner, memory_row(runner, s, flags)))
    return rows


def decode_probe(runner: Runner, s) -> dict:
    """``dali-gpu-decode``: nvJPEG decodes into device memory here (skipped in a dry run)."""
    if s.dry_run:
        return skipped("dali-gpu-decode", "dry run (no GPU)")
    rec = runner.run("dali-gpu-decode", [sys.executable, "-c", _PROBE], 120)
    if rec["status"] != "passed":
        return rec
    try:
        problem = json.loads(runner.text("dali-gpu-decode").strip().splitlines()[-1])["problem"]
    except (ValueError, KeyError, IndexError):
        return fail(rec, "no JSON line from the probe")
    return fail(rec, problem) if problem else rec


def evidence(runner: Runner, s, flags: list[str]) -> list[dict]:
    """``loader-dali-mixed-j1`` and ``loader-dali-cpu-j1``: with one CPU thread each, the GPU decode must be
    :data:`GPU_OVER_CPU` times the CPU decode's images/s (a dry run decodes on the CPU both
    times and only reports the ratio)."""
    mixed = loader_row(runner, s, "dali-lmdb", flags, "1", "loader-dali-mixed-j1")
    cpu = loader_row(runner, s, "dali-lmdb", [*flags, "--dali-cpu"], "1", "loader-dali-cpu-j1")
    mixed = gpu_over_cpu(mixed, cpu, GPU_OVER_CPU, s.dry_run, "GPU decode only {ratio:.2f}x "
                         "the CPU decode with one thread: did nvJPEG decode?")
    return [announce(runner, mixed), announce(runner, cpu)]


def memory_row(runner: Runner, s, flags: list[str]) -> dict:
    """``dali-memory``: ResNet-18 from DALI for :data:`MEMORY_EPOCHS` short epochs; host RSS
    and device memory after each (``host_rss_mib``, ``device_memory_mib`` of
    ``metrics.jsonl``). Fails when device memory grows by more than 5% after epoch 1."""
    name = "dali-memory"
    rundir = os.path.join(s.out, "runs", name)
    shutil.rmtree(rundir, ignore_errors=True)
    steps = str(max(s.steps, 4))
    rec = runner.run(name, [sys.executable, "main.py", *flags, "-a", "resnet18", "--amp",
                            "--channels-last", "-b", str(s.batch), "--epochs",
                            str(MEMORY_EPOCHS), "--train-batches", steps, "--val-batches", "2",
                            "-p", "0", "--seed", "0", "-j", s.workers, *s.sizes, *s.accel,
                            "--output-dir", rundir], 300)
    if rec["status"] != "passed":
        return rec
    with open(os.path.join(rundir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    rec["host_rss_mib"] = [r.get("host_rss_mib") for r in records]
    rec["device_memory_mib"] = [r.get("device_memory_mib") for r in records]
    device = [m for m in rec["device_memory_mib"] if m is not None]
    if len(device) >= 2 and device[-1] > 1.05 * device[0]:
        return fail(rec, f"device memory grew from {device[0]:.0f} to {device[-1]:.0f} MiB "
                         "after the first epoch")
    return rec
