"""Section ``gpudecode`` of ``gpu_check.py``: the batch-decode pipeline (``--decode-device
cuda``, issue 38) proven and measured, reading the LMDB.

* ``gpu-decode-probe``: ``decode.gpu.WindowDecoder("cuda")`` decodes windows of a real JPEG of
  the bundle's sample into device memory (nvImageCodec's result in GPU memory, none sent to the
  CPU fallback), within a few levels of the CPU decode; and whether the GPU's hardware JPEG
  decoder took a whole image (``hardware_decoder``);
* ``loader-gpudecode-cuda-j1`` against ``loader-gpudecode-cpu-j1``: the loader alone with one
  worker, decoding in the training process on the GPU and in the worker on the CPU; a GPU
  decode that is not clearly faster did not happen on the GPU;
* the hardware decoder's share (``--hw-decoder-load`` 0, 0.65, 1) and ``-j`` (2, 4, 8, 15) for
  the loader alone, and the CPU loaders at ``-j 8`` (section 4 has them at every core and at
  one per core but one);
* ResNet-50 and ResNet-18 trained at 224 and 160 px from the pipeline.

A dry run (CPU, ``--no-accel``) runs the pipeline on nvImageCodec's CPU backend
(``--decode-device cpu-nvimgcodec``): one timing pair and ResNet-18 at a low side, which prove
this code, not the GPU.
"""
from __future__ import annotations

import json
import re
import sys

from ._gpu_rows import announce, gpu_over_cpu, loader_flags, loader_row, train_row
from ._gpu_runner import Runner, fail, skipped

HW_LOADS = (0.0, 0.65, 1.0)
WORKERS = ("2", "4", "8", "15")
GPU_OVER_CPU = 1.5  # one worker: decoding on the GPU must beat the worker's CPU decode by this
PROBE_MAX_DIFF = 8  # levels: nvJPEG's IDCT and upsampling against libjpeg-turbo's
_PROBE = """\
import glob, json, os, sys, torch
from decode import decode, gpu
path = sorted(glob.glob(os.path.join(sys.argv[1], '*', '*')))[0]
data = open(path, 'rb').read()
whole = decode(data)
h, w = whole.shape[-2:]
regions = [(0, 0, h, w), (h // 4, w // 4, h // 2, w // 2)]
on_gpu = sys.argv[2] == 'cuda'
dev = torch.device('cuda', 0) if on_gpu else torch.device('cpu')
cpu = torch.stack([gpu.resize_window(whole[:, t:t + a, l:l + b], (64, 64), torch.float32)
                   for t, l, a, b in regions])
def run(decoder):
    out = decoder.decode([data, data], regions, (64, 64))
    return {'on_device': decoder.on_device, 'fallback': len(out.fallback),
            'max_diff': float((out.images.cpu().float() - cpu).abs().max())}
decoder = gpu.WindowDecoder('cuda' if on_gpu else 'cpu-nvimgcodec', dev)
result = {'decoder': decoder.status(), **run(decoder), 'hardware_decoder': None}
result['torchvision'] = run(gpu.WindowDecoder('cuda', dev, library=None))
n = decoder.n
if n is not None and on_gpu:
    only_hw = n.Decoder(device_id=0, backends=[n.Backend(n.BackendKind.HW_GPU_ONLY)])
    result['hardware_decoder'] = only_hw.decode([n.CodeStream(data)])[0] is not None
print(json.dumps(result))
"""


def gpu_decode_rows(runner: Runner, s, data, machine) -> list[dict]:
    """The section's rows (announced as they finish)."""
    flags = loader_flags("lmdb", data, machine)
    if isinstance(flags, str):
        return [announce(runner, skipped("gpudecode", flags))]
    device = "cpu-nvimgcodec" if s.dry_run else "cuda"
    batched = [*flags, "--decode-device", device]
    rows = [announce(runner, probe(runner, s, data))]
    rows += evidence(runner, s, flags, batched)
    if not s.dry_run:
        for load in HW_LOADS:
            rows.append(announce(runner, on_gpu(runner, s, {**loader_row(
                runner, s, "gpudecode-lmdb", [*batched, "--hw-decoder-load", str(load)],
                s.workers, f"loader-gpudecode-hw{load}"), "hw_decoder_load": load})))
        for workers in WORKERS:
            rows.append(announce(runner, on_gpu(runner, s, loader_row(
                runner, s, "gpudecode-lmdb", batched, workers, f"loader-gpudecode-j{workers}"))))
        # the CPU loaders at -j 8 (-j auto's old cap), beside section 4's -j auto (every
        # core) and one worker per core but one
        rows.append(announce(runner, loader_row(runner, s, "lmdb", flags, "8",
                                                "loader-lmdb-cpu-j8")))
    models = ("resnet18",) if s.dry_run else ("resnet50", "resnet18")
    sizes = (16,) if s.dry_run else (None, 160)
    for model in models:
        for res in sizes:
            rows.append(announce(runner, on_gpu(runner, s, train_row(
                runner, s, data, machine, model, "gpudecode-lmdb", res=res,
                extra=["--decode-device", device]))))
    return rows


def on_gpu(runner: Runner, s, rec: dict) -> dict:
    """``rec`` failed unless main.py's ``device:`` line names a batch decoder on CUDA (not in
    a dry run) and no sample went to the CPU fallback: those main.py names (``note: N
    samples decoded on the CPU``) are counted as ``cpu_fallbacks``, and any fails the row,
    since the figure is then partly the CPU's (the bundle's sample holds plain JPEGs)."""
    if rec.get("status") != "passed":
        return rec
    out, err = runner.text(rec["name"]), runner.text(rec["name"], "err")
    rec["cpu_fallbacks"] = sum(int(m) for m in re.findall(r"note: (\d+) samples decoded on the "
                                                         r"CPU", err))
    line = next((x for x in out.splitlines() if x.startswith("device:")), "")
    if not s.dry_run and not re.search(r"batch windows: (nvImageCodec \S+|torchvision "
                                       r"decode_jpeg) on cuda", line):
        return fail(rec, f"main.py did not name a batch decoder on CUDA: {line[:200]!r}")
    if rec["cpu_fallbacks"]:
        return fail(rec, f"{rec['cpu_fallbacks']} samples decoded on the CPU fallback: the "
                         "figure is not the batch decoder's alone")
    return rec


def probe(runner: Runner, s, data, timeout: float = 180) -> dict:
    """``gpu-decode-probe``: nvImageCodec decodes two windows of a sample JPEG into GPU memory
    (failed if any went to the CPU fallback or differs from the CPU decode by more than
    :data:`PROBE_MAX_DIFF` levels), whether the hardware JPEG decoder alone takes the whole
    image, and torchvision's ``decode_jpeg(device="cuda")``, the second GPU decoder, the same
    way (``torchvision``: recorded). A dry run probes nvImageCodec's CPU backend and
    torchvision on the CPU (the code, not the GPU)."""
    rec = runner.run("gpu-decode-probe", [sys.executable, "-c", _PROBE, data.train,
                                          "cpu" if s.dry_run else "cuda"], timeout)
    if rec["status"] != "passed":
        return rec
    try:
        result = json.loads(runner.text("gpu-decode-probe").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return fail(rec, "no JSON line from the probe")
    rec.update(result)
    placed = result["on_device"] if not s.dry_run else 2
    if placed < 2 or result["fallback"]:
        return fail(rec, f"{result['on_device']} of 2 windows decoded into GPU memory, "
                         f"{result['fallback']} sent to the CPU ({result['decoder']}; "
                         f"torchvision: {result['torchvision']['on_device']} of 2)")
    if result["max_diff"] > PROBE_MAX_DIFF:
        return fail(rec, f"windows differ from the CPU decode by {result['max_diff']:.0f} "
                         f"levels (> {PROBE_MAX_DIFF})")
    return rec


def evidence(runner: Runner, s, flags: list[str], batched: list[str]) -> list[dict]:
    """``loader-gpudecode-cuda-j1`` and ``loader-gpudecode-cpu-j1``: with one worker each, the
    batch decode must reach :data:`GPU_OVER_CPU` times the CPU loaders' images/s (a dry run
    decodes on the CPU both times and only reports the ratio)."""
    gpu = on_gpu(runner, s, loader_row(runner, s, "gpudecode-lmdb", batched, "1",
                                       "loader-gpudecode-cuda-j1"))
    cpu = loader_row(runner, s, "lmdb", flags, "1", "loader-gpudecode-cpu-j1")
    gpu = gpu_over_cpu(gpu, cpu, GPU_OVER_CPU, s.dry_run, "batch decode only {ratio:.2f}x the "
                       "CPU loaders with one worker: did the GPU decode?")
    return [announce(runner, gpu), announce(runner, cpu)]
