"""DALI's GPU decoding (``--dali``) proven and measured, reading the LMDB. A dry run decodes on
DALI's CPU backend: it proves this code and the install layout, not the GPU.
"""
from __future__ import annotations

import json
import os
import shutil
import sys

from ..report import last_json
from .base import announce, gpu_over_cpu, loader_flags, loader_row, train_row
from ..runner import Runner, fail, skipped

HW_LOADS = (0.65, 0.9, 1.0)
WORKERS = ("2", "4", "8", "15")
MEMORY_EPOCHS = 3
GPU_OVER_CPU = 1.5  # the GPU decode with one CPU thread must beat the CPU decode by this much
PAIR_STEPS = 10  # timed batches of each one-thread row: a ratio, not a figure
_PROBE = """\
import io, json, sys
import nvidia.dali as dali
from nvidia.dali import fn, pipeline_def
import numpy as np
from PIL import Image
from tools.gpu_check.machine.environment import mapped_libraries
buf = io.BytesIO()
Image.new('RGB', (64, 48), (200, 100, 50)).save(buf, 'JPEG', quality=90)
jpeg = np.frombuffer(buf.getvalue(), np.uint8)
device = sys.argv[1]
@pipeline_def(batch_size=1, num_threads=1, device_id=0 if device == 'mixed' else None)
def pipe():
    return fn.decoders.image(fn.external_source(source=lambda: [jpeg], batch=True),
                             device=device)
p = pipe()
p.build()
(out,) = p.run()
result = {'dali': dali.__version__, 'dali_file': dali.__file__, 'output': type(out).__name__,
          'shape': list(np.asarray((out.as_cpu() if device == 'mixed' else out)[0]).shape)}
if device == 'mixed':
    import nvidia.nvimgcodec as n
    image = n.Decoder(device_id=0, backends=[n.Backend(n.BackendKind.GPU_ONLY)]).decode(
        buf.getvalue())
    result['nvimgcodec_gpu'] = (image is not None
                                and image.buffer_kind == n.ImageBufferKind.STRIDED_DEVICE)
result['libraries'] = mapped_libraries()
print(json.dumps(result))
"""


def dali_rows(runner: Runner, s, data, machine) -> list[dict]:
    """The full check's section: :func:`decode_probe`, :func:`evidence`, sweeps of
    ``--dali-hw-decoder-load`` and ``-j``, ResNet-18 at 160 px, :func:`memory_row`."""
    flags = loader_flags("dali-lmdb", data, machine)
    if isinstance(flags, str):
        return [announce(runner, skipped("dali", flags))]
    rows = [announce(runner, decode_probe(runner, s)), *evidence(runner, s, machine, flags)]
    if not s.dry_run:
        for load in HW_LOADS:
            rows.append(announce(runner, {**loader_row(
                runner, s, machine, "dali-lmdb", [*flags, "--dali-hw-decoder-load", str(load)],
                s.workers, f"loader-dali-hw{load}"), "hw_decoder_load": load}))
        for workers in WORKERS:
            rows.append(announce(runner, loader_row(
                runner, s, machine, "dali-lmdb", flags, workers, f"loader-dali-j{workers}")))
    low = 16 if s.dry_run else 160
    for loader in ("synthetic", "dali-lmdb"):
        rows.append(announce(runner, train_row(runner, s, data, machine, "resnet18", loader,
                                               res=low)))
    rows.append(announce(runner, memory_row(runner, s, flags)))
    return rows


def decode_probe(runner: Runner, s, timeout: float = 120) -> dict:
    """``dali-gpu-decode``: a fresh process imports DALI first (its libraries must find
    nvImageCodec's by their own run paths), decodes a JPEG with the mixed decoder and with
    nvImageCodec's GPU backends into device memory, and records the libraries mapped (without
    ``libnvjpeg`` DALI would decode on the CPU and still "pass"). Dry: DALI's CPU backend."""
    name = "dali-gpu-decode"
    rec = runner.run(name, [sys.executable, "-c", _PROBE, "cpu" if s.dry_run else "mixed"],
                     timeout)
    result = last_json(runner.text(name)) if rec["status"] == "passed" else None
    if rec["status"] != "passed":
        return rec
    if result is None:
        return fail(rec, "no JSON line from the probe")
    rec.update(result)
    if result["shape"] != [48, 64, 3]:
        return fail(rec, f"decoded to shape {result['shape']}, not [48, 64, 3]")
    if s.dry_run:
        return rec
    nvjpeg = [p for p in result["libraries"] if "/libnvjpeg." in p]
    if result["output"] != "TensorListGPU" or not result.get("nvimgcodec_gpu") or not nvjpeg:
        return fail(rec, f"DALI's mixed decode gave {result['output']}, nvImageCodec's GPU "
                         f"backends {'decoded' if result.get('nvimgcodec_gpu') else 'did not'}"
                         f" into device memory, libnvjpeg mapped: {nvjpeg or 'none'}")
    return rec


def evidence(runner: Runner, s, machine: dict, flags: list[str]) -> list[dict]:
    """``loader-dali-mixed-j1`` and ``loader-dali-cpu-j1`` (:data:`PAIR_STEPS` timed batches,
    one CPU thread each): the GPU decode must reach :data:`GPU_OVER_CPU` times the CPU
    decode's images/s (a dry run records the ratio only)."""
    mixed = loader_row(runner, s, machine, "dali-lmdb", flags, "1", "loader-dali-mixed-j1",
                       timed=PAIR_STEPS)
    cpu = loader_row(runner, s, machine, "dali-lmdb", [*flags, "--dali-cpu"], "1",
                     "loader-dali-cpu-j1", timed=PAIR_STEPS)
    mixed = gpu_over_cpu(mixed, cpu, GPU_OVER_CPU, s.dry_run, "GPU decode only {ratio:.2f}x "
                         "the CPU decode with one thread: did nvJPEG decode?")
    return [announce(runner, {**mixed, "decoder": "DALI CPU" if s.dry_run else "DALI mixed"}),
            announce(runner, {**cpu, "decoder": "DALI CPU"})]


def memory_row(runner: Runner, s, flags: list[str]) -> dict:
    """``dali-memory``: ResNet-18 from DALI for :data:`MEMORY_EPOCHS` short epochs; host RSS
    and device memory after each (``host_rss_mib``, ``device_memory_mib`` of
    ``metrics.jsonl``, MiB). Fails when device memory grows by more than 5% after epoch 1."""
    name = "dali-memory"
    rundir = os.path.join(s.out, "runs", name)
    shutil.rmtree(rundir, ignore_errors=True)
    rec = runner.run(name, [sys.executable, "main.py", *flags, "-a", "resnet18", "--amp",
                            "--channels-last", "-b", str(s.batch), "--epochs",
                            str(MEMORY_EPOCHS), "--train-batches", str(max(s.steps // 4, 4)),
                            "--val-batches", "2", "-p", "0", "--seed", "0", "-j", s.workers,
                            *s.sizes, *s.accel, "--output-dir", rundir], 300)
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
