"""Running ``gpu_check.py``'s commands: timeouts, a shared time budget, logs, the
environment probe and bundle install that come before everything else, and the data (the
replicated sample and its LMDBs).

Times are seconds. A command's record is a dict with ``name``, ``command`` (shell-quoted),
``status`` (passed / failed / skipped), ``reason`` unless passed, ``seconds``, ``returncode``
and, when it did not pass, ``stdout_tail`` / ``stderr_tail``.
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from types import SimpleNamespace

from _gpu_report import last_json

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRACE = 60.0  # seconds a command started near the end of the budget may still run
INSTALL_TIMEOUT, PROBE_TIMEOUT, SMI_TIMEOUT = 120, 120, 30


class Runner:
    """Runs commands from the repository root, each with a timeout, all within one budget."""

    def __init__(self, out: str, budget: float):
        self.logs, self.budget = os.path.join(out, "logs"), budget
        os.makedirs(self.logs, exist_ok=True)
        self.start = time.monotonic()
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def add_path(self, folder: str) -> None:
        old = self.env.get("PYTHONPATH")
        self.env["PYTHONPATH"] = folder + (os.pathsep + old if old else "")

    def run(self, name: str, cmd: list[str], timeout: float) -> dict:
        """Run ``cmd`` (stdout/stderr to ``logs/NAME.out|.err``) for at most ``timeout`` s, or
        less when the budget runs out. Returns a record: ``status`` passed (exit 0), failed
        (with the reason and both tails) or skipped (time budget), ``command``, ``seconds``."""
        record = {"name": name, "command": " ".join(shell_quote(c) for c in cmd)}
        left = self.budget - self.elapsed()
        if left <= 0:
            return {**record, "status": "skipped", "reason": "time budget"}
        limit = min(timeout, max(left, GRACE))
        start = time.monotonic()
        with open(self.log(name, "out"), "w") as out, open(self.log(name, "err"), "w") as err:
            # its own session: main.py's loader workers and spawned ranks end with it
            proc = subprocess.Popen(cmd, cwd=REPO, env=self.env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=err, start_new_session=True)
            try:
                code = proc.wait(limit)
            except BaseException:  # the timeout, or Ctrl-C in this process
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                if sys.exc_info()[0] is not subprocess.TimeoutExpired:
                    raise
                code = None
        record.update(seconds=round(time.monotonic() - start, 2), returncode=code,
                      status="passed" if code == 0 else "failed")
        if code is None and limit < timeout:
            record.update(status="skipped", reason=f"time budget: stopped after {limit:.0f} s")
        elif code is None:
            record["reason"] = f"timed out after {limit:.0f} s"
        elif code:
            record["reason"] = f"exit status {code}"
        if code != 0:
            self.attach_tails(record)
        return record

    def log(self, name: str, stream: str) -> str:
        return os.path.join(self.logs, f"{name}.{stream}")

    def text(self, name: str, stream: str = "out") -> str:
        try:
            with open(self.log(name, stream), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def attach_tails(self, record: dict, chars: int = 3000) -> None:
        record["stdout_tail"] = self.text(record["name"], "out")[-chars:]
        record["stderr_tail"] = self.text(record["name"], "err")[-chars:]


def shell_quote(arg: str) -> str:
    return arg if re.fullmatch(r"[\w@%+=:,./-]+", arg) else "'" + arg.replace("'", "'\\''") + "'"


def fail(record: dict, reason: str) -> dict:
    return {**record, "status": "failed", "reason": reason}


def skipped(name: str, reason: str, **fields) -> dict:
    return {"name": name, **fields, "status": "skipped", "reason": reason}


def probe() -> dict:
    """What this interpreter sees: versions, GPUs (name, memory in bytes), CPU cores."""
    import torch
    import torchvision

    info = {"python": platform.python_version(), "platform": platform.platform(),
            "cpu_cores": len(os.sched_getaffinity(0)), "torch": torch.__version__,
            "torchvision": torchvision.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
            "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0}
    info["gpus"] = [{"name": p.name, "memory_bytes": p.total_memory}
                    for p in map(torch.cuda.get_device_properties, range(info["gpu_count"]))]
    try:  # the CUDA driver API version (12080 = 12.8), not the nvidia-smi driver version
        api = torch._C._cuda_getDriverVersion() if info["gpu_count"] else None
        info["cuda_driver_api"] = f"{api // 1000}.{api % 1000 // 10}" if api else None
    except (AttributeError, RuntimeError):
        info["cuda_driver_api"] = None
    for key, module in (("dali", "nvidia.dali"), ("lmdb", "lmdb"), ("pytest", "pytest")):
        try:
            info[key] = getattr(importlib.import_module(module), "__version__", "installed")
        except Exception:  # DALI fails in many ways when its CUDA libraries do not match
            info[key] = None
    return info


def has_module(name: str) -> bool:
    """Whether this interpreter can import ``name`` (without importing it)."""
    return importlib.util.find_spec(name) is not None


def _module_of(wheel: str) -> str:
    """The module a wheel's file name provides (``lmdb-3.0.0-...whl`` -> ``lmdb``)."""
    name = wheel.split("-")[0].lower()
    return {"nvidia_nvimgcodec_cu13": "nvidia.nvimgcodec"}.get(name, name)


def install(runner: Runner, wheels: list[str], site: str) -> list[dict]:
    """Install into ``site`` (and put it on the commands' ``PYTHONPATH``) each of ``wheels``
    whose module this interpreter cannot import (lmdb, pytest and its dependencies); without
    pip, unpack them there. Returns the install record, or [] when nothing is missing."""
    # a wheel's file name starts with its normalised distribution name, mostly its module name
    wanted = [w for w in wheels if not has_module(_module_of(os.path.basename(w)))]
    if not wanted:
        return []
    shutil.rmtree(site, ignore_errors=True)
    runner.add_path(site)
    names = [os.path.basename(w).split("-")[0] for w in wanted]
    if has_module("pip"):
        return [{**runner.run("install", [
            sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
            "--disable-pip-version-check", "--target", site, *wanted], INSTALL_TIMEOUT),
            "installed": names}]
    # no pip: a wheel without scripts is a zip to put on sys.path as it is
    for wheel in wanted:
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(site)
    return [{"name": "install", "command": f"unzip {' '.join(wanted)} -d {site}",
             "status": "passed", "installed": names}]


def environment(runner: Runner, s) -> tuple[dict, dict]:
    """Section 1: :func:`probe` in a subprocess (so this process never holds a CUDA context)
    and nvidia-smi's driver version. Returns (machine facts, check record); no CUDA GPU is a
    failure unless ``s.dry_run``."""
    rec = runner.run("environment", [sys.executable, "benchmarks/gpu_check.py", "--probe"],
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
    if not s.dry_run and not machine["gpu_count"]:
        rec = fail(rec, "torch sees no CUDA GPU (use --dry-run for the CPU check)")
        runner.attach_tails(rec)  # torch's CUDA initialisation warning, if any
    return machine, rec


def list_images(root: str) -> list[tuple[str, str]]:
    """(class, file path) of every non-hidden file one level below ``root``'s class folders."""
    found = []
    for cls in sorted(os.listdir(root)):
        folder = os.path.join(root, cls)
        if cls.startswith(".") or not os.path.isdir(folder):
            continue
        found += [(cls, os.path.join(folder, f)) for f in sorted(os.listdir(folder))
                  if not f.startswith(".") and os.path.isfile(os.path.join(folder, f))]
    return found


def prepare_data(runner: Runner, s, machine: dict,
                 lmdb_timeout: float) -> tuple[SimpleNamespace, list[dict]]:
    """Link each sample image k times into ``OUT/data/train`` so one epoch holds warm-up +
    steps + 4 batches (no epoch ends inside the timed steps; also enough for the distributed
    run), then convert it and val to LMDB. Returns (paths, check records)."""
    world = 2 if s.dry_run else max(machine.get("gpu_count", 1), 1)
    need = max(s.warmup + s.steps + 4, 2 * world + 2) * s.batch
    copies = math.ceil(need / len(s.images))
    root = os.path.join(s.out, "data")
    shutil.rmtree(root, ignore_errors=True)
    data = SimpleNamespace(train=os.path.join(root, "train"), val=s.val_src, lmdb=None,
                           reason=None, lmdb_reason=None)
    records = [{"name": "replicate", "status": "passed", "images": copies * len(s.images),
                "copies": copies, "sample_images": len(s.images), "train": data.train}]
    try:
        for cls, path in s.images:
            os.makedirs(os.path.join(data.train, cls), exist_ok=True)
            stem, ext = os.path.splitext(os.path.basename(path))
            for k in range(copies):
                os.symlink(path, os.path.join(data.train, cls, f"{stem}_{k:04d}{ext}"))
    except OSError as exc:
        data.reason = data.lmdb_reason = "not available: the sample could not be linked"
        return data, [fail(records[0], f"cannot link {path}: {exc.strerror or exc}")]
    if not machine.get("lmdb"):
        data.lmdb_reason = "not available: lmdb not installed"
        return data, records + [skipped("lmdb-convert", data.lmdb_reason)]
    lmdb = os.path.join(root, "lmdb")
    code = ("import sys, folder2lmdb; [folder2lmdb.convert(a, b, workers=%d, progress=False) "
            "for a, b in zip(sys.argv[1::2], sys.argv[2::2])]" % machine["cpu_cores"])
    rec = runner.run("lmdb-convert", [sys.executable, "-c", code, data.train,
                                      os.path.join(lmdb, "train"), data.val,
                                      os.path.join(lmdb, "val")], lmdb_timeout)
    if rec["status"] == "passed":
        data.lmdb = lmdb
    else:
        data.lmdb_reason = f"not available: LMDB conversion {rec['status']}"
    return data, records + [rec]
