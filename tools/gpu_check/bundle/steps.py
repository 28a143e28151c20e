"""The offline bundle on its way to the host and there: its steps (``make gpu-bundle
STEP_SIZE=64M``), ``BUNDLE/steps/N`` (hard links) and its ``STEP.json``, each fitting with the
repository's files one transfer of that size; DALI's ~190 MiB wheel in parts ``NAME.partNN``
with a ``sha256sum``-format manifest, so that a part lost or damaged on the way is one line
naming it, never a broken install. On the host, the wheels its Python lacks are installed by
pip into one prefix whose packages folder goes first on every command's ``PYTHONPATH``: DALI
beside nvImageCodec and nvJPEG, so that DALI's libraries find them by their run paths."""
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

from ..runner import InputError, Runner, fail, skipped

MARGIN, MIN_PART, MANIFEST_ROOM = 2 << 20, 1 << 20, 4096  # bytes: for later commits, STEP.json
DALI_WHEELS, MANIFEST = "wheels-dali", "SHA256SUMS"
INSTALL_TIMEOUT = 300  # s: DALI's 199 MB wheel unpacks in well under a minute
DALI_WHEEL = re.compile(r"nvidia_dali(?:_[a-z]+)?_cuda(\d+?)0$")


def repository_files(repo: str) -> list[str]:
    """The files a copy of the repository holds (git's tracked and not ignored ones),
    relative. Raises :class:`InputError` without git."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], cwd=repo, capture_output=True,
                                check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise InputError(f"git ls-files in {repo} failed ({exc}): a step's bytes count the "
                         "repository's files from git's list") from None
    return [p for p in listed.decode().split("\0") if p and os.path.lexists(os.path.join(repo, p))]


def repository_bytes(repo: str) -> int:
    return sum(os.lstat(os.path.join(repo, p)).st_size for p in repository_files(repo))


def folder_bytes(path: str) -> int:
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(path)
               for f in files) if os.path.isdir(path) else os.path.getsize(path)


def lay_out_steps(out: str, repo_bytes: int, step_bytes: int) -> list[dict]:
    """``OUT/steps/1``, ``2``, ..., each at most ``step_bytes`` with ``repo_bytes`` and
    :data:`MARGIN`: step 1 the wheels and the sample, then DALI's small wheels first fit and a
    wheel over half a step in parts filling the room left, step after step; ``{"step", "bytes",
    "files"}`` of each. Raises :class:`InputError` when step 1 does not fit."""
    room = step_bytes - MARGIN - repo_bytes
    first = [os.path.join("wheels", n) for n in sorted(os.listdir(os.path.join(out, "wheels")))]
    need = sum(folder_bytes(os.path.join(out, x)) for x in first + ["sample"])
    if need > room:
        raise InputError(f"step 1 needs {need / 2**20:.1f} MiB beside the repository's "
                         f"{repo_bytes / 2**20:.1f}, over --step-size less a 2 MiB margin: "
                         "a larger --step-size")
    shutil.rmtree(os.path.join(out, "steps"), ignore_errors=True)
    dali = os.path.join(out, DALI_WHEELS)
    names = sorted(n for n in os.listdir(dali) if n.endswith(".whl")) if os.path.isdir(dali) else []
    big = [n for n in names if os.path.getsize(os.path.join(dali, n)) > room // 2]
    steps = [first + ["sample"], [os.path.join("parts", MANIFEST)] if big else []]
    lefts = [0, room - MANIFEST_ROOM]  # step 1 is full

    def put(rel: str, k: int) -> None:
        if k == len(steps):
            steps.append([])
            lefts.append(room)
        steps[k].append(rel)
        lefts[k] -= os.path.getsize(os.path.join(out, rel))

    for name in [n for n in names if n not in big]:
        size = os.path.getsize(os.path.join(dali, name))
        put(os.path.join(DALI_WHEELS, name), next((k for k, x in enumerate(lefts) if x >= size),
                                                  len(lefts)))
    for name in big:
        open_steps = [k for k, x in enumerate(lefts) if x >= MIN_PART]
        parts = split(os.path.join(dali, name), os.path.join(out, "parts"), room,
                      [lefts[k] for k in open_steps])
        for n, part in enumerate(parts):
            put(os.path.relpath(part, out), open_steps[n] if n < len(open_steps) else len(steps))
    steps = steps if names else steps[:1]
    folders = [os.path.join(out, "steps", str(n)) for n in range(1, len(steps) + 1)]
    for folder, files in zip(folders, steps):
        for rel in files:
            link_tree(os.path.join(out, rel), os.path.join(folder, rel))
    shutil.rmtree(os.path.join(out, "parts"), ignore_errors=True)  # the parts live in steps/
    sizes = [repo_bytes + folder_bytes(folder) + 1024 for folder in folders]
    bundle = os.urandom(6).hex()
    for number, folder in enumerate(folders, 1):
        with open(os.path.join(folder, "STEP.json"), "w") as f:
            json.dump({"step": number, "steps": len(steps), "bundle": bundle,
                       "size": step_bytes, "bytes": sizes, "files": steps}, f)
    return [{"step": n, "files": files, "bytes": b}
            for n, (files, b) in enumerate(zip(steps, sizes), 1)]


def link_tree(src: str, dst: str) -> None:
    """The file or folder ``src`` hard-linked (else copied) into ``dst``, replacing a file
    there; symlinks stay links."""
    def link(a: str, b: str) -> None:
        if os.path.lexists(b):
            os.remove(b)
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    if os.path.isdir(src) and not os.path.islink(src):
        shutil.copytree(src, dst, symlinks=True, copy_function=link, dirs_exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        link(src, dst)


def missing_files(stash: str, info: dict, upto: int) -> list[str]:
    """The files of steps 1 .. ``upto`` (``info``: a ``STEP.json``) not in ``stash``."""
    return [f"{rel} (step {n})" for n, files in enumerate(info["files"][:upto], 1)
            for rel in files if not os.path.lexists(os.path.join(stash, rel))]


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def split(wheel: str, folder: str, part_bytes: int, first: list[int] = ()) -> list[str]:
    """Cut ``wheel`` into ``folder/NAME.partNN``, part k at most ``first[k]`` bytes (room left
    in earlier steps), then ``part_bytes``; their and the wheel's sha256 appended to
    ``folder/SHA256SUMS``. Returns the parts' paths in order."""
    os.makedirs(folder, exist_ok=True)
    name, parts = os.path.basename(wheel), []
    with open(wheel, "rb") as src:
        while data := src.read(first[len(parts)] if len(parts) < len(first) else part_bytes):
            parts.append(os.path.join(folder, f"{name}.part{len(parts):02d}"))
            with open(parts[-1], "wb") as out:
                out.write(data)
    with open(os.path.join(folder, MANIFEST), "a") as f:
        f.writelines(f"{sha256(p)}  {os.path.basename(p)}\n" for p in parts + [wheel])
    return parts


def join_parts(folder: str, out: str) -> tuple[list[str], list[dict]]:
    """Each wheel of ``folder/SHA256SUMS`` joined from its parts into ``out`` and checked: the
    wheels' paths and the ``parts`` record, failed naming a manifest not read or not in
    sha256sum's format, a part missing or damaged, or a whole that does not match; ([], [])
    without a manifest."""
    path, joined = os.path.join(folder, MANIFEST), []
    if not os.path.isfile(path):
        return [], []
    try:
        with open(path) as f:
            rows = [line.split() for line in f if line.strip()]
        if any(len(row) != 2 or len(row[0]) != 64 for row in rows):
            raise ValueError(f"{path}: not a sha256sum listing")
        manifest = {name.lstrip("*"): digest for digest, name in rows}
        os.makedirs(out, exist_ok=True)
        for wheel in sorted(name for name in manifest if ".part" not in name):
            parts = sorted(n for n in manifest if n.startswith(wheel + ".part"))
            if not parts:
                raise ValueError(f"{folder}: no parts of {wheel} in {MANIFEST}")
            joined.append(os.path.join(out, wheel))
            with open(joined[-1], "wb") as dst:
                for path in [os.path.join(folder, part) for part in parts]:
                    if not os.path.isfile(path):
                        raise ValueError(f"{path}: missing (copy every step's files to the "
                                         "host before the last step)")
                    if sha256(path) != manifest[os.path.basename(path)]:
                        raise ValueError(f"{path}: damaged (its sha256 differs from {MANIFEST})")
                    with open(path, "rb") as src:
                        shutil.copyfileobj(src, dst)
            if sha256(joined[-1]) != manifest[wheel]:
                raise ValueError(f"{joined[-1]}: reassembled, but its sha256 differs from "
                                 f"{MANIFEST}")
    except (ValueError, OSError) as exc:
        return [], [fail({"name": "parts"}, str(exc))]
    return joined, [{"name": "parts", "status": "passed",
                     "joined": [os.path.basename(w) for w in joined]}]


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


def install(runner: Runner, wheels: list[str], site: str, name: str = "install",
            parts: str | None = None) -> tuple[list[dict], dict]:
    """Install the ``wheels``' distributions, and those joined from ``parts`` (beside
    ``site``), into the prefix ``site`` with pip (``--no-index --no-deps``): one this
    interpreter (or ``site``) already has, whatever its version, is left alone, so the host's
    torch and nvidia packages are never replaced. A DALI wheel for another CUDA major than
    torch's gets a skipped ``dali-wheel`` record. Returns the records and the set-up row's
    ``installed`` and ``bytes``."""
    joined, records = join_parts(parts, os.path.join(os.path.dirname(site), "wheels-joined")) \
        if parts else ([], [])
    wheels = wheels + joined
    # importing torch takes seconds: only for a DALI wheel
    cuda = torch_cuda() if any(DALI_WHEEL.match(dist_name(w)) for w in wheels) else None
    wrong = {w: why for w in wheels if (why := dali_wheel_mismatch(w, cuda))}
    records += [skipped("dali-wheel", why) for why in wrong.values()]
    wanted = [w for w in wheels if w not in wrong]
    fields = {"reason": "nothing missing", "installed": [],
              "bytes": sum(map(os.path.getsize, wheels))}
    if not wanted:
        return records, fields
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
    record.update(installed=sorted(installed_in(folder) - before), site=site)
    if record["installed"]:
        del fields["reason"]
    return records + [record], {**fields, "installed": record["installed"]}


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
