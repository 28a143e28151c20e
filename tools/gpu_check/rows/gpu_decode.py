"""GPU decoding without DALI (``--decode-device cuda``, docs/loaders.md) proven and measured,
reading the LMDB, and the name of the decoder that did each row's work. A dry run decodes on
nvImageCodec's CPU backend (``cpu-nvimgcodec``): it proves this code, not the GPU.
"""
from __future__ import annotations

import re
import sys

from ..report import last_json
from .base import announce, gpu_over_cpu, loader_flags, loader_row, train_row
from ..runner import Runner, fail, skipped

HW_LOADS = (0.0, 0.65, 1.0)
WORKERS = ("2", "4", "8", "15")
GPU_OVER_CPU = 1.5  # one worker: decoding on the GPU must beat the worker's CPU decode by this
PAIR_STEPS = 10  # timed batches of each one-worker row: a ratio, not a figure
PROBE_MAX_DIFF = 8  # levels: nvJPEG's IDCT and upsampling against libjpeg-turbo's
_PROBE = """\
import glob, json, os, sys, torch
from decode import decode, gpu
from tools.gpu_check.machine.environment import mapped_libraries
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
    try:
        out = decoder.decode([data, data], regions, (64, 64))
    except Exception as exc:
        return {'on_device': 0, 'fallback': 2, 'error': f'{type(exc).__name__}: {exc}'}
    return {'on_device': decoder.on_device, 'fallback': len(out.fallback),
            'max_diff': float((out.images.cpu().float() - cpu).abs().max())}
decoder = gpu.WindowDecoder('cuda' if on_gpu else 'cpu-nvimgcodec', dev)
result = {'decoder_line': decoder.status(), **run(decoder)}
result['torchvision'] = run(gpu.WindowDecoder('cuda', dev, library=None))
result['libraries'] = mapped_libraries()
print(json.dumps(result))
"""
_HARDWARE = """\
import glob, json, os, sys
import nvidia.nvimgcodec as n
from tools.gpu_check.machine.environment import mapped_libraries
data = open(sorted(glob.glob(os.path.join(sys.argv[1], '*', '*')))[0], 'rb').read()
whole = n.CodeStream(data)
h, w = whole.height, whole.width
window = whole.get_sub_code_stream(region=n.Region(h // 4, w // 4, h // 2 + h // 4,
                                                   w // 2 + w // 4))
decoder = n.Decoder(device_id=0, backends=[n.Backend(n.BackendKind.HW_GPU_ONLY)])
def taken(stream):
    image = decoder.decode([stream])[0]
    return image is not None and image.buffer_kind == n.ImageBufferKind.STRIDED_DEVICE
print(json.dumps({'whole': taken(whole), 'window': taken(window),
                  'libraries': mapped_libraries()}))
"""


def gpu_decode_rows(runner: Runner, s, data, machine) -> list[dict]:
    """The full check's section: :func:`probe`, :func:`hardware`, :func:`evidence`, sweeps of
    ``--hw-decoder-load`` and ``-j``, ResNet-50 and ResNet-18 at 224 and 160 px."""
    flags = loader_flags("lmdb", data, machine)
    if isinstance(flags, str):
        return [announce(runner, skipped("gpudecode", flags))]
    device = "cpu-nvimgcodec" if s.dry_run else "cuda"
    batched = [*flags, "--decode-device", device]
    rows = [announce(runner, probe(runner, s, data)),
            announce(runner, hardware(runner, s, data, machine))]
    rows += evidence(runner, s, machine, flags, batched)
    if not s.dry_run:
        for load in HW_LOADS:
            rows.append(announce(runner, on_gpu(runner, s, machine, {**loader_row(
                runner, s, machine, "gpudecode-lmdb", [*batched, "--hw-decoder-load",
                                                       str(load)],
                s.workers, f"loader-gpudecode-hw{load}"), "hw_decoder_load": load})))
        for workers in WORKERS:
            rows.append(announce(runner, on_gpu(runner, s, machine, loader_row(
                runner, s, machine, "gpudecode-lmdb", batched, workers,
                f"loader-gpudecode-j{workers}"))))
        # the CPU loaders at -j 8, beside section 4's every core and one per core but one
        rows.append(announce(runner, loader_row(runner, s, machine, "lmdb", flags, "8",
                                                "loader-lmdb-cpu-j8")))
    for model in ("resnet18",) if s.dry_run else ("resnet50", "resnet18"):
        for res in (16,) if s.dry_run else (None, 160):
            rows.append(announce(runner, on_gpu(runner, s, machine, train_row(
                runner, s, data, machine, model, "gpudecode-lmdb", res=res,
                extra=["--decode-device", device]))))
    return rows


def decoder_name(line: str, machine: dict) -> str:
    """Which decoder did a row's work, from main.py's ``device:`` line and the machine's
    ``hardware_windows`` (:func:`hardware`): ``nvImageCodec hardware``, ``nvImageCodec CUDA``,
    ``nvImageCodec CPU`` (a dry run), ``torchvision nvJPEG`` or ``CPU``."""
    found = re.search(r"batch windows: (nvImageCodec \S+|torchvision decode_jpeg) on (\S+?)"
                      r"[ ;]", line)
    if not found or "no GPU decoder" in line:
        return "CPU"
    if found.group(1).startswith("torchvision"):
        return "torchvision nvJPEG" if found.group(2).startswith("cuda") else "CPU"
    if not found.group(2).startswith("cuda"):
        return "nvImageCodec CPU"
    load = re.search(r"load ([\d.]+)", line)
    if machine.get("hardware_windows") and load and float(load.group(1)) > 0:
        return "nvImageCodec hardware"
    return "nvImageCodec CUDA"


def on_gpu(runner: Runner, s, machine: dict, rec: dict) -> dict:
    """``rec`` (a passed ``--decode-device`` row) with ``decoder`` (:func:`decoder_name`) and
    ``cpu_fallbacks`` (main.py's ``note: N samples decoded on the CPU``); failed unless
    nvImageCodec decoded on the GPU (not judged in a dry run), or when any sample went to the
    CPU fallback (the figure would be partly the CPU's)."""
    if rec.get("status") != "passed":
        return rec
    out, err = runner.text(rec["name"]), runner.text(rec["name"], "err")
    rec["cpu_fallbacks"] = sum(int(m) for m in re.findall(r"note: (\d+) samples decoded on the "
                                                         r"CPU", err))
    line = next((x for x in out.splitlines() if x.startswith("device:")), "")
    rec["decoder"] = decoder_name(line, machine)
    if not s.dry_run and not rec["decoder"].startswith("nvImageCodec"):
        return fail(rec, f"decoded by {rec['decoder']}, not nvImageCodec on the GPU: "
                         f"{line[:200]!r}")
    if rec["cpu_fallbacks"]:
        return fail(rec, f"{rec['cpu_fallbacks']} samples decoded on the CPU fallback: the "
                         "figure is not the batch decoder's alone")
    return rec


def _json_row(runner: Runner, name: str, cmd: list[str], timeout: float) -> tuple[dict, dict]:
    """Run a probe script; (its record, its last JSON line or {}), failed without one."""
    rec = runner.run(name, cmd, timeout)
    result = last_json(runner.text(name)) if rec["status"] == "passed" else None
    if rec["status"] == "passed" and result is None:
        rec = fail(rec, "no JSON line from the probe")
        runner.attach_tails(rec)
    return rec, result or {}


def probe(runner: Runner, s, data, timeout: float = 180) -> dict:
    """``gpu-decode-probe``: ``WindowDecoder("cuda")`` decodes two windows of a sample JPEG;
    failed if one went to the CPU fallback or host memory, or differs from the CPU decode by
    more than :data:`PROBE_MAX_DIFF`; torchvision's ``decode_jpeg`` is recorded too."""
    rec, result = _json_row(runner, "gpu-decode-probe", [
        sys.executable, "-c", _PROBE, data.train, "cpu" if s.dry_run else "cuda"], timeout)
    if not result:
        return rec
    rec.update(result)
    placed = result["on_device"] if not s.dry_run else 2
    if placed < 2 or result["fallback"]:
        return fail(rec, f"{result['on_device']} of 2 windows decoded into GPU memory, "
                         f"{result['fallback']} sent to the CPU ({result['decoder_line']}"
                         f"{'; ' + result['error'] if result.get('error') else ''}; "
                         f"torchvision: {result['torchvision']['on_device']} of 2)")
    if result["max_diff"] > PROBE_MAX_DIFF:
        return fail(rec, f"windows differ from the CPU decode by {result['max_diff']:.0f} "
                         f"levels (> {PROBE_MAX_DIFF})")
    return rec


def hardware(runner: Runner, s, data, machine: dict, timeout: float = 60) -> dict:
    """``gpu-decode-hardware``, a process of its own so that an unreachable JPEG engine fails
    only this row: whether nvImageCodec's hardware decoder takes a whole JPEG and a window
    (``whole``, ``window``; ``window`` also as ``machine["hardware_windows"]``). Skipped dry."""
    if s.dry_run:
        return skipped("gpu-decode-hardware", "dry run: no JPEG engine on the CPU")
    rec, result = _json_row(runner, "gpu-decode-hardware", [
        sys.executable, "-c", _HARDWARE, data.train], timeout)
    rec.update(result)
    machine["hardware_windows"] = result.get("window")
    return rec


def evidence(runner: Runner, s, machine: dict, flags: list[str],
             batched: list[str]) -> list[dict]:
    """``loader-gpudecode-cuda-j1`` and ``loader-gpudecode-cpu-j1`` (:data:`PAIR_STEPS` timed
    batches, one worker each): the batch decode must reach :data:`GPU_OVER_CPU` times the CPU
    loader's images/s (a dry run records the ratio only)."""
    gpu = on_gpu(runner, s, machine, loader_row(runner, s, machine, "gpudecode-lmdb", batched,
                                                "1", "loader-gpudecode-cuda-j1",
                                                timed=PAIR_STEPS))
    cpu = loader_row(runner, s, machine, "lmdb", flags, "1", "loader-gpudecode-cpu-j1",
                     timed=PAIR_STEPS)
    gpu = gpu_over_cpu(gpu, cpu, GPU_OVER_CPU, s.dry_run, "batch decode only {ratio:.2f}x the "
                       "CPU loaders with one worker: did the GPU decode?")
    return [announce(runner, gpu), announce(runner, cpu)]
