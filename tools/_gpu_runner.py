"""Running ``gpu_check.py``'s commands: timeouts, a shared time budget, logs, the
environment probe and bundle install that come before everything else, and the data (the
replicated sample and its LMDBs).

Times are seconds. A command's record is a dict with ``name``, ``command`` (shell-quoted),
``status`` (passed / failed / timed out / skipped), ``reason`` unless passed, ``seconds``,
``returncode`` and, when it did not pass, ``stdout_tail`` / ``stderr_tail``. "timed out" is
its own status: a check slower than its limit (a cold ``torch.compile``, say) proves nothing
either way, so it is reported as not proven, not as a failure.
"""
from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import importlib.util
import math
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from types import SimpleNamespace

from ._gpu_report import last_json

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRACE = 60.0  # seconds a command started near the end of the budget may still run
# the bundle's DALI wheel is ~190 MiB: pip unpacks it in well under a minute, 300 s on slow disks
INSTALL_TIMEOUT, PROBE_TIMEOUT, SMI_TIMEOUT = 300, 120, 30
# Top-level folders of wheels that several distributions share (nvidia/dali, nvidia/nvimgcodec):
# the module a wheel provides is one level further down.
_SHARED_TOP = ("nvidia",)
_DALI_WHEEL = re.compile(r"nvidia_dali(?:_[a-z]+)?_cuda(\d+?)0$")


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

    def run(self, name: str, cmd: list[str], timeout: float, env: dict | None = None) -> dict:
        """Run ``cmd`` (stdout/stderr to ``logs/NAME.out|.err``, ``env`` added to the
        environment) for at most ``timeout`` s, or less when the budget runs out. Returns a
        record: ``status`` passed (exit 0), failed (with the reason and both tails) or skipped
        (time budget), ``command``, ``seconds``."""
        record = {"name": name, "command": " ".join(shell_quote(c) for c in cmd)}
        left = self.budget - self.elapsed()
        if left <= 0:
            return {**record, "status": "skipped", "reason": "time budget"}
        limit = min(timeout, max(left, GRACE))
        start, used = time.monotonic(), _children_cpu()
        with open(self.log(name, "out"), "w") as out, open(self.log(name, "err"), "w") as err:
            # its own session: main.py's loader workers and spawned ranks end with it
            proc = subprocess.Popen(cmd, cwd=REPO, env={**self.env, **(env or {})}, stdin=subprocess.DEVNULL,
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
                      cpu_seconds=round(_children_cpu() - used, 2),
                      status="passed" if code == 0 else "failed")
        if code is None and limit < timeout:
            record.update(status="skipped", reason=f"time budget: stopped after {limit:.0f} s")
        elif code is None:
            record.update(status="timed out", reason=f"still running after its {limit:.0f} s "
                          "limit (slow, not failed: rerun it with --only and a larger --budget)")
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


def _children_cpu() -> float:
    """User + system CPU seconds of every finished child process tree so far (a command's
    processes are reaped by it, and it by :meth:`Runner.run`): the delta around one command is
    its work, whatever else shares the machine's cores."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


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
    info["cuda_driver_api"] = cuda_driver_api()
    for key, module in (("dali", "nvidia.dali"), ("lmdb", "lmdb"), ("pytest", "pytest")):
        try:
            info[key] = getattr(importlib.import_module(module), "__version__", "installed")
        except Exception:  # DALI fails in many ways when its CUDA libraries do not match
            info[key] = None
    return info


def cuda_driver_api() -> str | None:
    """The CUDA version the installed driver supports ("13.0"), from ``cuDriverGetVersion``
    in libcuda (needs no ``cuInit``; torch 2.14 exposes it only through the optional
    ``cuda.bindings``); None without a driver."""
    try:
        version = ctypes.c_int(0)
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return f"{version.value // 1000}.{version.value % 1000 // 10}" if version.value else None


def has_module(name: str) -> bool:
    """Whether this interpreter can import ``name`` (without importing it). False, not an
    exception, where a parent package is missing (``nvidia.nvimgcodec`` without any
    ``nvidia`` package, as with conda's or a source-built torch) or broken."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def has_pip() -> bool:
    """Whether pip is installed, from its metadata. Not :func:`has_module`: setuptools'
    ``_distutils_hack`` answers a ``find_spec("pip")`` by switching its ``distutils`` shim off
    for the rest of the process, so a later ``torch.compile`` in the same process (the test
    suite) got the standard library's distutils and failed inside setuptools."""
    return has_distribution("pip")


def has_distribution(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def wheel_module(wheel: str) -> str:
    """The module a wheel provides, from its file list: the top-level package named like the
    distribution, else one level below a shared top (``nvidia/dali`` -> ``nvidia.dali``),
    else its first top-level module. Raises ``OSError``/``zipfile.BadZipFile`` for a bad file."""
    dist = os.path.basename(wheel).split("-")[0].lower()
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    tops = sorted({n.split("/")[0] for n in names} - {""})
    modules = [t[:-3] if t.endswith(".py") else t for t in tops
               if not t.endswith((".dist-info", ".data"))]
    if dist in modules:
        return dist
    for top in _SHARED_TOP:
        below = sorted({n.split("/")[1] for n in names
                        if n.startswith(top + "/") and n.count("/") > 1})
        if below:
            return f"{top}.{below[0]}"
    return modules[0] if modules else dist


def wheel_is_missing(wheel: str) -> bool:
    """Whether this interpreter lacks what ``wheel`` provides: its distribution is not
    installed and (outside ``nvidia/``) its module is not importable. Under ``nvidia/`` only the
    distribution tells: ``nvidia-nvjpeg`` (DALI's GPU JPEG decoder) shares ``nvidia/cu13`` with
    torch's CUDA wheels, so that module is there without it."""
    dist = os.path.basename(wheel).split("-")[0]
    module = wheel_module(wheel)
    if has_distribution(dist):
        return False
    return module.split(".")[0] in _SHARED_TOP or not has_module(module)


def dali_wheel_mismatch(wheel: str, cuda: str | None) -> str | None:
    """Why a DALI wheel of the bundle cannot serve this torch (built for CUDA ``cuda``), or
    None: DALI's CUDA major must be torch's (``loaders.pipelines.dali.environment.check_dali_wheel``)."""
    match = _DALI_WHEEL.match(os.path.basename(wheel).split("-")[0].lower())
    if not match or not cuda or cuda.split(".")[0] == match.group(1):
        return None
    return (f"{os.path.basename(wheel)} is for CUDA {match.group(1)}, torch here for CUDA "
            f"{cuda} (make gpu-bundle CUDA={cuda.split('.')[0]})")


def torch_cuda() -> str | None:
    """``torch.version.cuda`` of this interpreter, None without torch or CUDA build."""
    try:
        import torch
    except Exception:  # a broken torch is reported by the environment probe
        return None
    return torch.version.cuda


def install(runner: Runner, wheels: list[str], site: str, name: str = "install") -> list[dict]:
    """Install into ``site`` (and put it on the commands' ``PYTHONPATH``) each of ``wheels``
    that this interpreter lacks (:func:`wheel_is_missing`: lmdb, pytest and its dependencies,
    nvImageCodec, DALI and its dependencies); without pip, unpack them there. A DALI wheel for
    another CUDA major than torch's is left out with a ``dali-wheel`` record (skipped: DALI is
    then not proven). ``name``: the install record's. Returns the records, [] when nothing is
    missing."""
    records = []
    dali = [w for w in wheels if _DALI_WHEEL.match(os.path.basename(w).split("-")[0].lower())]
    cuda = torch_cuda() if dali else None  # importing torch takes seconds: only when needed
    for wheel in [w for w in dali if dali_wheel_mismatch(w, cuda)]:
        records.append(skipped("dali-wheel", dali_wheel_mismatch(wheel, cuda)))
        wheels = [w for w in wheels if w != wheel]
    wanted = [w for w in wheels if wheel_is_missing(w)]
    if not wanted:
        return records
    shutil.rmtree(site, ignore_errors=True)
    runner.add_path(site)
    names = [os.path.basename(w).split("-")[0] for w in wanted]
    if has_pip():
        # --no-compile: byte-compiling DALI's and nvImageCodec's files costs a minute of a
        # borrowed machine for modules imported a few times
        record = runner.run(name, [
            sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
            "--no-compile", "--disable-pip-version-check", "--target", site, *wanted],
            INSTALL_TIMEOUT)
    else:  # no pip: a wheel without scripts is a zip to put on sys.path as it is
        for wheel in wanted:
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(site)
        record = {"name": name, "command": f"unzip {' '.join(wanted)} -d {site}",
                  "status": "passed"}
    share_namespace(site, "nvidia")
    return records + [{**record, "installed": names}]


def share_namespace(site: str, package: str) -> None:
    """Make ``site/package`` (when installed there) extend its ``__path__`` with every other
    ``package`` folder on ``sys.path`` (``pkgutil.extend_path``), so that ``site``'s modules,
    first on ``PYTHONPATH``, are the ones imported while the machine's own ``nvidia/...``
    (torch's CUDA libraries) stay visible: some ``nvidia-*`` wheels (nvImageCodec's, say) ship
    ``nvidia/__init__.py``, and a regular package found anywhere on the path hides every
    namespace portion of the same name, so the bundle's DALI would not be the one imported."""
    folder = os.path.join(site, package)
    if os.path.isdir(folder):
        with open(os.path.join(folder, "__init__.py"), "w") as f:
            f.write("__path__ = __import__('pkgutil').extend_path(__path__, __name__)\n")


def environment(runner: Runner, s) -> tuple[dict, dict]:
    """Section 1: :func:`probe` in a subprocess (so this process never holds a CUDA context)
    and nvidia-smi's driver version. Returns (machine facts, check record); no CUDA GPU is a
    failure unless ``s.dry_run``."""
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
