"""The bundle's wheels that the host's Python lacks, installed by pip into one prefix whose
packages folder goes first on every command's ``PYTHONPATH``: DALI beside nvImageCodec and
nvJPEG, so that DALI's libraries find them by their relative run paths."""
from __future__ import annotations

import glob
import os
import re
import sys

from ..runner import Runner, fail, skipped

INSTALL_TIMEOUT = 300  # s: DALI's 199 MB wheel unpacks in well under a minute
DALI_WHEEL = re.compile(r"nvidia_dali(?:_[a-z]+)?_cuda(\d+?)0$")


def dist_name(wheel: str) -> str:
    """The normalised distribution name of a wheel file (``nvidia_dali_cuda130``)."""
    return re.sub(r"[-_.]+", "_", os.path.basename(wheel).split("-")[0]).lower()


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


def install(runner: Runner, wheels: list[str], site: str, name: str = "install") -> list[dict]:
    """Install the ``wheels``' distributions into the prefix ``site`` with pip (``--no-index
    --no-deps``): one this interpreter (or ``site``) already has, whatever its version, is left
    alone, so the host's torch and nvidia packages are never replaced. A DALI wheel for another
    CUDA major than torch's gets a skipped ``dali-wheel`` record. Returns the records."""
    dali = [w for w in wheels if DALI_WHEEL.match(dist_name(w))]
    cuda = torch_cuda() if dali else None  # importing torch takes seconds: only when needed
    wrong = {w: dali_wheel_mismatch(w, cuda) for w in dali if dali_wheel_mismatch(w, cuda)}
    records = [skipped("dali-wheel", why) for why in wrong.values()]
    wanted = [w for w in wheels if w not in wrong]
    if not wanted:
        return records
    before = installed_in(packages_folder(site))
    # --no-compile: byte-compiling DALI costs a minute of the host's time
    record = runner.run(name, [
        sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile",
        "--disable-pip-version-check", "--prefix", site,
        *sorted({"--find-links=" + os.path.dirname(os.path.abspath(w)) for w in wanted}),
        *sorted({dist_name(w) for w in wanted})], INSTALL_TIMEOUT)
    if "No module named pip" in runner.text(name, "err"):
        record = fail(record, "pip is not installed for this Python: install it (python3 -m "
                      "ensurepip --user, or the system's python3-pip package), then run again")
    folder = packages_folder(site)
    if record["status"] == "passed" and installed_in(folder):
        share_namespace(folder, "nvidia")
        runner.add_path(folder)
    return records + [{**record, "installed": sorted(installed_in(folder) - before),
                       "site": site}]


def packages_folder(prefix: str) -> str | None:
    """The ``site-packages`` (Debian: ``dist-packages``) folder pip made under ``prefix``."""
    found = glob.glob(os.path.join(prefix, "lib*", "python3*", "*-packages")) + glob.glob(
        os.path.join(prefix, "local", "lib*", "python3*", "*-packages"))
    return found[0] if found else None


def installed_in(folder: str | None) -> set[str]:
    """Normalised names of the distributions in packages ``folder`` (its ``*.dist-info``)."""
    return {dist_name(n) for n in glob.glob(os.path.join(folder, "*.dist-info"))} if folder \
        else set()


def share_namespace(site: str, package: str) -> None:
    """Make ``site/package`` extend its ``__path__`` over every ``package`` on ``sys.path``
    (``pkgutil.extend_path``), so the host's own ``nvidia/...`` (torch's CUDA libraries) stay
    visible: some ``nvidia-*`` wheels ship ``nvidia/__init__.py``, and a regular package hides
    every namespace portion of the same name."""
    folder = os.path.join(site, package)
    if os.path.isdir(folder):
        with open(os.path.join(folder, "__init__.py"), "w") as f:
            f.write("__path__ = __import__('pkgutil').extend_path(__path__, __name__)\n")
