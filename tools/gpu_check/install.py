"""The bundle's wheels installed on a bare GPU machine: only what its Python lacks, all into one
folder (``--target``) that goes first on every command's ``PYTHONPATH``, DALI and its
dependencies into the same folder as nvImageCodec and nvJPEG, so that DALI's libraries find
nvImageCodec's by their relative run paths, whatever was imported before."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import sys
import time
import zipfile

from .runner import Runner, skipped

INSTALL_TIMEOUT = 300  # s: DALI's 199 MB wheel unpacks in well under a minute
# Top-level folders that several distributions share (nvidia/dali, nvidia/nvimgcodec): the
# module a wheel provides is one level further down.
SHARED_TOP = ("nvidia",)
DALI_WHEEL = re.compile(r"nvidia_dali(?:_[a-z]+)?_cuda(\d+?)0$")


def dist_name(wheel: str) -> str:
    """The normalised distribution name of a wheel file (``nvidia_dali_cuda130``)."""
    return re.sub(r"[-_.]+", "_", os.path.basename(wheel).split("-")[0]).lower()


def wheel_module(wheel: str) -> str:
    """The module a wheel provides, from its file list: the top-level package named like the
    distribution, else one level below a shared top (``nvidia/dali`` -> ``nvidia.dali``),
    else its first top-level module. Raises ``OSError``/``zipfile.BadZipFile``."""
    dist = dist_name(wheel)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    tops = sorted({n.split("/")[0] for n in names} - {""})
    modules = [t[:-3] if t.endswith(".py") else t for t in tops
               if not t.endswith((".dist-info", ".data"))]
    if dist in modules:
        return dist
    for top in SHARED_TOP:
        below = sorted({n.split("/")[1] for n in names
                        if n.startswith(top + "/") and n.count("/") > 1})
        if below:
            return f"{top}.{below[0]}"
    return modules[0] if modules else dist


def has_module(name: str) -> bool:
    """Whether this interpreter can import ``name`` (without importing it); False, not an
    exception, where a parent package is missing or broken (no ``nvidia`` package at all, as
    with conda's or a source-built torch)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def has_distribution(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def has_pip() -> bool:
    """Whether pip is installed, from its metadata, not by :func:`has_module`: setuptools'
    ``_distutils_hack`` answers ``find_spec("pip")`` by switching its ``distutils`` shim off
    for the rest of the process, which broke a later ``torch.compile`` in the same process."""
    return has_distribution("pip")


def wheel_is_missing(wheel: str) -> bool:
    """Whether this interpreter lacks what ``wheel`` provides: its distribution is not
    installed and (outside ``nvidia/``) its module is not importable. Under ``nvidia/`` only
    the distribution tells: ``nvidia-nvjpeg`` shares ``nvidia/cu13`` with torch's CUDA wheels."""
    if has_distribution(os.path.basename(wheel).split("-")[0]):
        return False
    module = wheel_module(wheel)
    return module.split(".")[0] in SHARED_TOP or not has_module(module)


def dali_wheel_mismatch(wheel: str, cuda: str | None) -> str | None:
    """Why a DALI wheel cannot serve this torch (built for CUDA ``cuda``), or None: DALI's
    CUDA major must be torch's."""
    match = DALI_WHEEL.match(dist_name(wheel))
    if not match or not cuda or cuda.split(".")[0] == match.group(1):
        return None
    return (f"{os.path.basename(wheel)} is for CUDA {match.group(1)}, torch here for CUDA "
            f"{cuda} (make gpu-bundle CUDA={cuda.split('.')[0]})")


def torch_cuda() -> str | None:
    """``torch.version.cuda`` of this interpreter, None without torch or a CUDA build."""
    try:
        import torch
    except Exception:  # a broken torch is reported by the environment probe
        return None
    return torch.version.cuda


def installed_in(site: str) -> set[str]:
    """Normalised names of the distributions installed in ``site`` (its ``*.dist-info``)."""
    names = os.listdir(site) if os.path.isdir(site) else []
    return {dist_name(n) for n in names if n.endswith(".dist-info")}


def install(runner: Runner, wheels: list[str], site: str, name: str = "install") -> list[dict]:
    """Install into ``site`` each of ``wheels`` that this interpreter and ``site`` lack
    (:func:`wheel_is_missing`), with pip (``--no-index --no-deps --no-compile --target``) into
    a fresh folder that is then merged into ``site`` (so a second install adds to the first;
    without pip the wheels are unpacked), and put ``site`` first on the commands'
    ``PYTHONPATH``. A DALI wheel for another CUDA major than torch's is left out with a
    skipped ``dali-wheel`` record. Returns the records, [] when nothing is missing."""
    records = []
    dali = [w for w in wheels if DALI_WHEEL.match(dist_name(w))]
    cuda = torch_cuda() if dali else None  # importing torch takes seconds: only when needed
    for wheel in [w for w in dali if dali_wheel_mismatch(w, cuda)]:
        records.append(skipped("dali-wheel", dali_wheel_mismatch(wheel, cuda)))
        wheels = [w for w in wheels if w != wheel]
    there = installed_in(site)
    wanted = [w for w in wheels if dist_name(w) not in there and wheel_is_missing(w)]
    if not wanted:
        return records
    fresh = site + ".new"
    shutil.rmtree(fresh, ignore_errors=True)
    if has_pip():  # --no-compile: byte-compiling DALI costs a minute of a borrowed machine
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
    """Make ``site/package`` extend its ``__path__`` with every other ``package`` folder on
    ``sys.path`` (``pkgutil.extend_path``), so ``site``'s modules, first on ``PYTHONPATH``, are
    imported while the machine's own ``nvidia/...`` (torch's CUDA libraries) stay visible:
    some ``nvidia-*`` wheels ship ``nvidia/__init__.py``, and a regular package found anywhere
    on the path hides every namespace portion of the same name."""
    folder = os.path.join(site, package)
    if os.path.isdir(folder):
        with open(os.path.join(folder, "__init__.py"), "w") as f:
            f.write("__path__ = __import__('pkgutil').extend_path(__path__, __name__)\n")


def join_parts(folder: str, out: str) -> tuple[list[str], list[dict]]:
    """The wheels carried in parts in ``folder`` (:mod:`tools.gpu_check.wheel_parts`: DALI's,
    which no single 64 MiB transfer carries), reassembled and checked into ``out``, and the
    ``parts`` record: passed, failed (a part missing or damaged: named) or none when
    ``folder`` holds no manifest."""
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
