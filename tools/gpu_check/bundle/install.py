"""The bundle's wheels that the host's Python lacks, installed into one folder first on every
command's ``PYTHONPATH``: DALI beside nvImageCodec and nvJPEG, so that DALI's libraries find
them by their relative run paths whatever was imported before."""
from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import re
import shutil
import sys
import time
import zipfile

from ..runner import Runner, skipped

INSTALL_TIMEOUT = 300  # s: DALI's 199 MB wheel unpacks in well under a minute
DALI_WHEEL = re.compile(r"nvidia_dali(?:_[a-z]+)?_cuda(\d+?)0$")


def dist_name(wheel: str) -> str:
    """The normalised distribution name of a wheel file (``nvidia_dali_cuda130``)."""
    return re.sub(r"[-_.]+", "_", os.path.basename(wheel).split("-")[0]).lower()


def wheel_module(wheel: str) -> str:
    """The module a wheel provides, from its file list: the top-level package named like the
    distribution, else one below ``nvidia/``, which several share (``nvidia/dali`` ->
    ``nvidia.dali``), else its first top-level module. Raises ``OSError``/``BadZipFile``."""
    dist = dist_name(wheel)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    tops = sorted({n.split("/")[0] for n in names} - {""})
    modules = [t[:-3] if t.endswith(".py") else t for t in tops
               if not t.endswith((".dist-info", ".data"))]
    if dist in modules:
        return dist
    below = sorted({n.split("/")[1] for n in names if n.startswith("nvidia/") and n.count("/") > 1})
    return f"nvidia.{below[0]}" if below else modules[0] if modules else dist


def has_module(name: str) -> bool:
    """Whether this interpreter can import ``name`` (without importing it); False also where a
    parent package is missing or broken (no ``nvidia`` with conda's torch)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def has_distribution(name: str) -> bool:
    """Whether distribution ``name`` is installed, from its metadata (not ``find_spec``:
    setuptools' ``_distutils_hack`` answers ``find_spec("pip")`` by switching its shim off,
    which breaks a later ``torch.compile``)."""
    try:
        return importlib.metadata.distribution(name) is not None
    except importlib.metadata.PackageNotFoundError:
        return False


def wheel_is_missing(wheel: str) -> bool:
    """Whether ``wheel``'s distribution is not installed and (outside ``nvidia/``, where
    ``nvidia-nvjpeg`` shares ``nvidia/cu13`` with torch's wheels) its module not importable."""
    if has_distribution(os.path.basename(wheel).split("-")[0]):
        return False
    module = wheel_module(wheel)
    return module.split(".")[0] == "nvidia" or not has_module(module)


def dali_wheel_mismatch(wheel: str, cuda: str | None) -> str | None:
    """Why a DALI wheel cannot serve a torch built for CUDA ``cuda`` (another major), or None."""
    match = DALI_WHEEL.match(dist_name(wheel))
    if not match or not cuda or cuda.split(".")[0] == match.group(1):
        return None
    return (f"{os.path.basename(wheel)} is for CUDA {match.group(1)}, torch here for CUDA "
            f"{cuda} (make gpu-bundle CUDA={cuda.split('.')[0]})")


def torch_cuda() -> str | None:
    """``torch.version.cuda`` of this interpreter, None without torch or a CUDA build."""
    try:
        return __import__("torch").version.cuda
    except Exception:  # a broken torch is reported by the environment probe
        return None


def installed_in(site: str) -> set[str]:
    """Normalised names of the distributions installed in ``site`` (its ``*.dist-info``)."""
    return {dist_name(n) for n in glob.glob(os.path.join(site, "*.dist-info"))}


def install(runner: Runner, wheels: list[str], site: str, name: str = "install") -> list[dict]:
    """Install into ``site`` the ``wheels`` that this interpreter and ``site`` lack, with pip
    (else unpacked) into a fresh folder merged into ``site`` (so installs add up), and put
    ``site`` first on the commands' ``PYTHONPATH``. A DALI wheel for another CUDA major than
    torch's gets a skipped ``dali-wheel`` record. Returns the records, [] if nothing is missing."""
    dali = [w for w in wheels if DALI_WHEEL.match(dist_name(w))]
    cuda = torch_cuda() if dali else None  # importing torch takes seconds: only when needed
    wrong = {w: dali_wheel_mismatch(w, cuda) for w in dali if dali_wheel_mismatch(w, cuda)}
    records = [skipped("dali-wheel", why) for why in wrong.values()]
    there = installed_in(site)
    wanted = [w for w in wheels if w not in wrong and dist_name(w) not in there
              and wheel_is_missing(w)]
    if not wanted:
        return records
    fresh = site + ".new"
    shutil.rmtree(fresh, ignore_errors=True)
    # --no-compile: byte-compiling DALI costs a minute of the host's time
    if has_distribution("pip"):
        record = runner.run(name, [
            sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
            "--no-compile", "--disable-pip-version-check", "--target", fresh, *wanted],
            INSTALL_TIMEOUT)
    else:  # a wheel without scripts is a zip to put on sys.path as it is
        for wheel in wanted:
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(fresh)
        record = {"name": name, "command": f"unzip {' '.join(wanted)} -d {fresh}",
                  "status": "passed"}
    if record["status"] == "passed":
        record["kept_existing"] = merge_tree(fresh, site)
        share_namespace(site, "nvidia")
        runner.add_path(site)
    shutil.rmtree(fresh, ignore_errors=True)
    return records + [{**record, "installed": [dist_name(w) for w in wanted], "site": site}]


def merge_tree(source: str, target: str) -> list[str]:
    """Move every file of ``source`` into ``target`` at the same relative path, keeping a
    file ``target`` already has; returns the relative paths of those kept."""
    kept = []
    for folder, _, files in os.walk(source):
        rel = os.path.relpath(folder, source)
        os.makedirs(os.path.join(target, rel), exist_ok=True)
        for file in files:
            dst = os.path.join(target, rel, file)
            if os.path.lexists(dst):
                kept.append(os.path.normpath(os.path.join(rel, file)))
            else:
                os.replace(os.path.join(folder, file), dst)
    return kept


def share_namespace(site: str, package: str) -> None:
    """Make ``site/package`` extend its ``__path__`` over every ``package`` on ``sys.path``
    (``pkgutil.extend_path``), so the host's own ``nvidia/...`` (torch's CUDA libraries)
    stay visible: some ``nvidia-*`` wheels ship ``nvidia/__init__.py``, and a regular package
    hides every namespace portion of the same name."""
    folder = os.path.join(site, package)
    if os.path.isdir(folder):
        with open(os.path.join(folder, "__init__.py"), "w") as f:
            f.write("__path__ = __import__('pkgutil').extend_path(__path__, __name__)\n")


def join_parts(folder: str, out: str) -> tuple[list[str], list[dict]]:
    """The wheels cut into parts in ``folder`` (:mod:`.steps`), reassembled and checked
    into ``out``, and the ``parts`` record (failed names a missing or damaged part); ([], [])
    when ``folder`` holds no manifest."""
    from .steps import MANIFEST, PartsError, reassemble

    if not os.path.isfile(os.path.join(folder, MANIFEST)):
        return [], []
    started, wheels = time.perf_counter(), []
    try:
        wheels = reassemble(folder, out)
        rec = {"status": "passed", "joined": [os.path.basename(w) for w in wheels]}
    except (PartsError, OSError) as exc:
        rec = {"status": "failed", "reason": str(exc)}
    return wheels, [{"name": "parts", **rec, "seconds": time.perf_counter() - started}]
