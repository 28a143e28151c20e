"""The probes, each a process of its own (the check holds no CUDA context): the host's facts,
both GPU decoders (dry: their CPU backends, proving this code, not a GPU), the decoder that did
a batch-decode row's work, the GPU-over-CPU ratio of a one-worker pair."""
import ctypes
import importlib
import os
import platform
import re
import shutil
import sys

from ..runner import Runner, fail, last_json, skipped

PROBE_TIMEOUT, SMI_TIMEOUT = 120, 30
# The libraries whose file says which decoder build a process really uses
MAPPED = re.compile(r"/lib(nvjpeg|nvimgcodec|dali)[^/]*\.so[^/]*$")
# The modules whose file says which install a process imports (the bundle's or the host's)
ORIGINS = {"dali": "nvidia.dali", "nvimgcodec": "nvidia.nvimgcodec", "lmdb": "lmdb",
           "pytest": "pytest"}


def mapped_libraries() -> list[str]:
    """The nvJPEG, nvImageCodec and DALI libraries this process maps, sorted ([] off Linux)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if len(line.split()) >= 6}
    except OSError:
        return []
    return sorted(p for p in paths if MAPPED.search(p))


def host_facts() -> dict:
    """What this interpreter sees: versions, GPUs (memory in bytes), CPU cores, each of
    :data:`ORIGINS` (DALI first: its libraries must find nvImageCodec's alone), the library
    ``--decode-device cuda`` takes, the libraries mapped."""
    info = {"python": platform.python_version(), "platform": platform.platform(),
            "cpu_cores": len(os.sched_getaffinity(0))}
    for key, module in ORIGINS.items():
        try:
            imported = importlib.import_module(module)
            info[key] = getattr(imported, "__version__", "installed")
            info[f"{key}_file"] = getattr(imported, "__file__", None)
        except Exception as exc:  # DALI fails in many ways when its libraries do not match
            info[key], info[f"{key}_error"] = None, f"{type(exc).__name__}: {exc}"[:300]
    import torch
    import torchvision

    cuda = torch.cuda.is_available()
    info.update(torch=torch.__version__, torchvision=torchvision.__version__,
                cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version() if cuda else None,
                gpu_count=torch.cuda.device_count() if cuda else 0,
                cuda_driver_api=cuda_driver_api())
    info["gpus"] = [{"name": p.name, "memory_bytes": p.total_memory}
                    for p in map(torch.cuda.get_device_properties, range(info["gpu_count"]))]
    if cuda:
        try:
            from decode.gpu import probe_cuda

            choice = probe_cuda(torch.device("cuda", 0))
            info["decoder"] = {"library": choice.library, "problems": list(choice.problems)}
        except Exception as exc:  # noqa: BLE001 - reported, the rest of the probe stands
            info["decoder"] = {"library": None, "problems": [f"{type(exc).__name__}: {exc}"]}
    info["libraries"] = mapped_libraries()
    return info


def cuda_driver_api() -> str | None:
    """The CUDA version the driver supports ("13.0"), None without one; from libcuda's
    ``cuDriverGetVersion`` (no ``cuInit``; torch has it only in the optional ``cuda.bindings``)."""
    try:
        version = ctypes.c_int(0)
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return f"{version.value // 1000}.{version.value % 1000 // 10}" if version.value else None


def environment(runner: Runner, s) -> dict:
    """The ``environment`` record: :func:`host_facts` in a subprocess and nvidia-smi's driver
    version as ``machine``; failed without a CUDA GPU unless ``s.dry_run``."""
    rec, machine = _json_row(runner, "environment", [
        sys.executable, "-m", "tools.gpu_check", "--probe"], PROBE_TIMEOUT)
    if not machine:
        return {**rec, "machine": {}}
    lines = []
    if shutil.which("nvidia-smi") and runner.run("nvidia-smi", [
            "nvidia-smi", "--query-gpu=name,memory.total,driver_version",
            "--format=csv,noheader"], SMI_TIMEOUT)["status"] == "passed":
        lines = [x for x in runner.text("nvidia-smi").splitlines() if x]
    machine["driver"] = lines[0].split(", ")[-1] if lines else None
    machine.update({"nvidia_smi": lines} if lines else {})
    rec["libraries"] = machine.get("libraries")
    if not s.dry_run and not machine["gpu_count"]:
        # with torch's CUDA initialisation warning, if any
        rec = runner.attach_tails(fail(rec, "torch sees no CUDA GPU (use --dry-run for the "
                                            "CPU check)"))
    return {**rec, "machine": machine}


PROBE_MAX_DIFF = 8  # levels: nvJPEG's IDCT and upsampling against libjpeg-turbo's
# A probe script prints its ``result`` with the libraries it mapped, one JSON line
_HEAD = "import glob, json, os, sys\nfrom tools.gpu_check.rows.probes import mapped_libraries\n"
_TAIL = "result['libraries'] = mapped_libraries()\nprint(json.dumps(result))\n"
_PROBE = _HEAD + """\
import torch
from decode import decode, gpu, resize
path = sorted(glob.glob(os.path.join(sys.argv[1], '*', '*')))[0]
data = open(path, 'rb').read()
whole = decode(data)
h, w = whole.shape[-2:]
regions = [(0, 0, h, w), (h // 4, w // 4, h // 2, w // 2)]
on_gpu = sys.argv[2] == 'cuda'
dev = torch.device('cuda', 0) if on_gpu else torch.device('cpu')
cpu = torch.stack([resize(whole[:, t:t + a, l:l + b], (64, 64), dtype=torch.float32)
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
""" + _TAIL
_HARDWARE = _HEAD + """\
import nvidia.nvimgcodec as n
data = open(sorted(glob.glob(os.path.join(sys.argv[1], '*', '*')))[0], 'rb').read()
whole = n.CodeStream(data)
h, w = whole.height, whole.width
window = whole.get_sub_code_stream(region=n.Region(h // 4, w // 4, h // 2 + h // 4,
                                                   w // 2 + w // 4))
decoder = n.Decoder(device_id=0, backends=[n.Backend(n.BackendKind.HW_GPU_ONLY)])
def taken(stream):
    image = decoder.decode([stream])[0]
    return image is not None and image.buffer_kind == n.ImageBufferKind.STRIDED_DEVICE
result = {'whole': taken(whole), 'window': taken(window)}
""" + _TAIL
_DALI_PROBE = _HEAD + """\
import io
import nvidia.dali as dali
from nvidia.dali import fn, pipeline_def
import numpy as np
from PIL import Image
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
""" + _TAIL


def on_gpu(ctx, rec: dict) -> dict:
    """``rec`` (a ``--decode-device`` row) with ``cpu_fallbacks`` and ``decoder``, from
    main.py's ``device:`` line and whether the hardware decoder takes windows (its probe's
    ``window``): nvImageCodec hardware / CUDA / CPU (dry), torchvision nvJPEG, CPU. Failed unless
    nvImageCodec decoded on the GPU (not judged dry), or when a sample went to the CPU."""
    runner, windows = ctx.runner, ctx.done.get("gpu-decode-hardware", {}).get("window")
    err = runner.text(rec["name"], "err")
    rec["cpu_fallbacks"] = sum(map(int, re.findall(r"note: (\d+) samples decoded on the CPU", err)))
    line = next((x for x in runner.text(rec["name"]).splitlines() if x.startswith("device:")), "")
    found = re.search(r"batch windows: (nvImageCodec \S+|torchvision decode_jpeg) on (\S+?)"
                      r"[ ;]", line)
    load = re.search(r"load ([\d.]+)", line)
    on_cuda = found and found.group(2).startswith("cuda")
    if not found or "no GPU decoder" in line:
        rec["decoder"] = "CPU"
    elif found.group(1).startswith("torchvision"):
        rec["decoder"] = "torchvision nvJPEG" if on_cuda else "CPU"
    elif not on_cuda:
        rec["decoder"] = "nvImageCodec CPU"
    elif windows and load and float(load.group(1)) > 0:
        rec["decoder"] = "nvImageCodec hardware"
    else:
        rec["decoder"] = "nvImageCodec CUDA"
    if not ctx.s.dry_run and not rec["decoder"].startswith("nvImageCodec"):
        return fail(rec, f"decoded by {rec['decoder']}, not nvImageCodec on the GPU: "
                         f"{line[:200]!r}")
    if rec["cpu_fallbacks"]:
        return fail(rec, f"{rec['cpu_fallbacks']} samples decoded on the CPU fallback: the "
                         "figure is not the batch decoder's alone")
    return rec


def _json_row(runner: Runner, name: str, cmd: list[str], timeout: float) -> tuple[dict, dict]:
    """A probe's record and its last JSON line ({}: failed without one)."""
    rec = runner.run(name, cmd, timeout)
    result = last_json(runner.text(name)) if rec["status"] == "passed" else None
    if rec["status"] == "passed" and result is None:
        rec = runner.attach_tails(fail(rec, "no JSON line from the probe"))
    return rec, result or {}


def probe(ctx, row, timeout: float) -> dict:
    """``WindowDecoder("cuda")`` decodes two windows of a sample JPEG (torchvision's too); failed
    if one went to the CPU or host memory, or differs from the CPU's by > PROBE_MAX_DIFF."""
    rec, result = _json_row(ctx.runner, row.name, [
        sys.executable, "-c", _PROBE, ctx.data.train, "cpu" if ctx.s.dry_run else "cuda"], timeout)
    if not result:
        return rec
    rec.update(result)
    if (result["on_device"] < 2 and not ctx.s.dry_run) or result["fallback"]:
        return fail(rec, f"{result['on_device']} of 2 windows decoded into GPU memory, "
                         f"{result['fallback']} sent to the CPU ({result['decoder_line']}"
                         f"{'; ' + result['error'] if result.get('error') else ''}; "
                         f"torchvision: {result['torchvision']['on_device']} of 2)")
    if result["max_diff"] > PROBE_MAX_DIFF:
        return fail(rec, f"windows differ from the CPU decode by {result['max_diff']:.0f} "
                         f"levels (> {PROBE_MAX_DIFF})")
    return rec


def hardware(ctx, row, timeout: float) -> dict:
    """Whether nvImageCodec's hardware decoder takes a whole JPEG and a window (as
    :func:`on_gpu` names the decoder), a process of its own: a JPEG engine unreachable fails
    only this row. Skipped dry."""
    if ctx.s.dry_run:
        return skipped(row.name, "dry run: no JPEG engine on the CPU")
    rec, result = _json_row(ctx.runner, row.name, [
        sys.executable, "-c", _HARDWARE, ctx.data.train], timeout)
    return {**rec, **result}


def dali_probe(ctx, row, timeout: float) -> dict:
    """DALI imported first (its libraries must find nvImageCodec's by their run paths) decodes a
    JPEG with the mixed decoder, nvImageCodec's GPU backends into device memory, libnvjpeg mapped
    (without it DALI decodes on the CPU and still "passes"). Dry: DALI's CPU backend."""
    if not ctx.machine.get("dali"):
        return skipped(row.name, "not installed")
    rec, result = _json_row(ctx.runner, row.name, [
        sys.executable, "-c", _DALI_PROBE, "cpu" if ctx.s.dry_run else "mixed"], timeout)
    if not result:
        return rec
    rec.update(result)
    if result["shape"] != [48, 64, 3]:
        return fail(rec, f"decoded to shape {result['shape']}, not [48, 64, 3]")
    if ctx.s.dry_run:
        return rec
    nvjpeg = [p for p in result["libraries"] if "/libnvjpeg." in p]
    if result["output"] != "TensorListGPU" or not result.get("nvimgcodec_gpu") or not nvjpeg:
        return fail(rec, f"DALI's mixed decode gave {result['output']}, nvImageCodec's GPU "
                         f"backends {'decoded' if result.get('nvimgcodec_gpu') else 'did not'}"
                         f" into device memory, libnvjpeg mapped: {nvjpeg or 'none'}")
    return rec
