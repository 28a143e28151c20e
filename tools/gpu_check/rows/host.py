"""The environment probe (``python -m tools.gpu_check --probe``, in a subprocess so that the
check never holds a CUDA context) and nvidia-smi's driver line."""
from __future__ import annotations

import ctypes
import importlib
import os
import platform
import re
import shutil
import sys

from ..judge import last_json
from ..runner import Runner, fail

PROBE_TIMEOUT, SMI_TIMEOUT = 120, 30
# The shared libraries whose file says which decoder build a process really uses.
MAPPED = re.compile(r"/lib(nvjpeg|nvimgcodec|dali)[^/]*\.so[^/]*$")
# The modules whose origin says which install a process imports (the bundle's or the host's).
ORIGINS = ("nvidia.dali", "nvidia.nvimgcodec", "lmdb", "pytest")


def mapped_libraries() -> list[str]:
    """Paths of the nvJPEG, nvImageCodec and DALI libraries this process has mapped
    (``/proc/self/maps``), sorted; [] where there is no such file (not Linux)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if len(line.split()) >= 6}
    except OSError:
        return []
    return sorted(p for p in paths if MAPPED.search(p))


def probe() -> dict:
    """What this interpreter sees: versions; GPUs (name, memory in bytes); CPU cores; each of
    :data:`ORIGINS`' version and file, or its import error (DALI first, so its libraries must
    find nvImageCodec's by themselves); ``decoder``, the library ``--decode-device cuda`` takes
    after a probe decode and why not the others; :func:`mapped_libraries`."""
    info = {"python": platform.python_version(), "platform": platform.platform(),
            "cpu_cores": len(os.sched_getaffinity(0))}
    for key, module in zip(("dali", "nvimgcodec", "lmdb", "pytest"), ORIGINS):
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


def environment(runner: Runner, s) -> tuple[dict, dict]:
    """:func:`probe` in a subprocess and nvidia-smi's driver version. Returns (the host's facts,
    the ``environment`` record); no CUDA GPU is a failure unless ``s.dry_run``."""
    rec = runner.run("environment", [sys.executable, "-m", "tools.gpu_check", "--probe"],
                     PROBE_TIMEOUT)
    if rec["status"] == "skipped":
        return {}, rec
    machine = last_json(runner.text("environment")) if rec["status"] == "passed" else None
    if machine is None:
        return {}, fail(rec, rec.get("reason") or "the probe printed no JSON")
    machine["driver"] = None
    if shutil.which("nvidia-smi"):
        smi = runner.run("nvidia-smi", ["nvidia-smi", "--query-gpu=name,memory.total,"
                                        "driver_version", "--format=csv,noheader"], SMI_TIMEOUT)
        rows = [line.split(", ") for line in runner.text("nvidia-smi").splitlines() if line]
        if smi["status"] == "passed" and rows:
            machine["driver"] = rows[0][-1]
            machine["nvidia_smi"] = [", ".join(r) for r in rows]
    rec["libraries"] = machine.get("libraries")
    if not s.dry_run and not machine["gpu_count"]:
        rec = fail(rec, "torch sees no CUDA GPU (use --dry-run for the CPU check)")
        runner.attach_tails(rec)  # torch's CUDA initialisation warning, if any
    return machine, rec
