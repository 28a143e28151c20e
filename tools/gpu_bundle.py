"""Prepare ``.gpu-bundle/`` (``make gpu-bundle``): what ``make gpu-check`` needs on a bare GPU
machine (its Python with torch and torchvision, no network) beside the source tree.

    python -m tools.gpu_bundle                       # images generated (tools/datagen.py)
    python -m tools.gpu_bundle --data ~/imagenet     # 100 images of DIR/train

Writes ``OUT/sample/train/<class>/*`` (``--images`` files of ``--data DIR/train``, one per
class in class order, then a second per class..., or generated ImageNet-sized JPEGs when no
``--data`` is given; one line says which),
``OUT/sample/val`` (a relative link to ``train``, valid wherever the tree is copied) and
``OUT/wheels/`` (binary wheels for CPython ``--python-version``, manylinux x86_64): lmdb,
pytest and its dependencies, nvImageCodec, and NVIDIA DALI for torch's CUDA major (``--cuda``,
default this torch's) with the dependencies pip resolves for it, less numpy (torch's machine
has it). ``gpu_check.py`` installs only the wheels that machine lacks.

Everything is also laid out as the lease plan's device calls (``OUT/calls/N``, hard links;
docs/gpu-check.md): call 1 carries ``wheels/`` (lmdb, pytest, nvImageCodec, nvJPEG: rows 1-4)
and the sample, DALI's own dependencies (``OUT/wheels-dali/``) fill the calls first fit, and
DALI's wheel (~190 MiB), too large for one call of at most 64 MiB with the repository, is cut
into parts (``OUT/parts/``, sha256 manifest: ``tools/wheel_parts.py``) filling each call's room
in order; the calls are printed with their bytes. ``--no-dali`` leaves DALI out (one call),
whose rows are then not proven. Exit status 0, 1 when pip fails (its message is shown), 2 for
bad input (one line).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import itertools
import os
import re
import shutil
import subprocess
import sys

from decode.gpu import nvjpeg_pip_package

from .wheel_parts import MANIFEST, split

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# the GPU machine's torch brings numpy; the wheel would only add 16 MB
ALREADY_THERE = ("numpy",)
GENERATED = dict(per_class=10, min_size=320, max_size=500, noise=60, shapes=3)
# The device tool sends at most 64 MiB per call, the repository's files included; the margin
# leaves room for commits made after the bundle. A part smaller than MIN_PART is not worth a
# place in the first call; MANIFEST_ROOM: SHA256SUMS (one line per part and wheel).
CALL_BYTES, CALL_MARGIN, MIN_PART, MANIFEST_ROOM = 64 << 20, 2 << 20, 1 << 20, 4096
LEASE_COMMAND = "python3 -m tools.gpu_check --lease"
# DALI and the wheels only it needs, and the list of those that travel whole (the lease
# installs DALI once every one of them and every part of its wheel has come)
DALI_WHEELS, DALI_LIST = "wheels-dali", "WHEELS"


class InputError(Exception):
    """Bad --data / --images / --cuda: one line, exit status 2."""


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default=os.path.join(REPO, ".gpu-bundle"), help="bundle folder "
                   "(replaced)")
    p.add_argument("--data", help="image folder with train/<class>/ (default: generate images)")
    p.add_argument("--images", type=int, default=100,
                   help="files taken from --data (one per class first); generated: always "
                   "10 classes x 10 images")
    p.add_argument("--cuda", help="CUDA major of the GPU machine's torch (default: this torch's, "
                   "else 13)")
    p.add_argument("--no-dali", action="store_true", help="leave out DALI (~190 MiB)")
    p.add_argument("--python-version", default="3.12", help="CPython of the GPU machine")
    return p


def pinned(name: str) -> str:
    """``name==version`` of the distribution installed here, else ``name``."""
    try:
        return f"{name}=={importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        return name


def local_cuda_major() -> str:
    try:
        import torch
    except ImportError:
        return "13"
    return (torch.version.cuda or "13").split(".")[0]


def wheel_specs(cuda: str, dali: bool) -> list[str]:
    """Requirement strings to download: versions of this machine's packages where they are
    for the same CUDA major, else pip's choice (DALI pins its own CUDA libraries)."""
    same = cuda == local_cuda_major()
    specs = [pinned("lmdb"), pinned("pytest")]
    codec = f"nvidia-nvimgcodec-cu{cuda}"
    specs.append(pinned(codec) if same else codec)
    # nvImageCodec declares nvJPEG only as an optional extra: without it every GPU decode of
    # --decode-device cuda falls back to the CPU, so it is always in the bundle
    nvjpeg = nvjpeg_pip_package(cuda)
    specs.append(pinned(nvjpeg) if same else nvjpeg)
    if dali:
        name = f"nvidia-dali-cuda{cuda}0"
        installed = [pinned(d) for d in ("nvidia-dali-cuda130", "nvidia-dali-cuda120")
                     if "==" in pinned(d)]
        version = installed[0].split("==")[1] if installed else None
        specs.append(f"{name}=={version}" if version else name)
    return specs


def pip_command(specs: list[str], wheels: str, python_version: str) -> list[str]:
    """``pip download`` of ``specs`` and their dependencies as binary wheels for CPython
    ``python_version`` on manylinux x86_64, into ``wheels``."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
           "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    return cmd + ["-d", wheels, *specs]


def copy_sample(data: str, train: str, images: int) -> str:
    """Copy ``images`` files of ``DATA/train/<class>/`` into ``train``: the first file of each
    class in sorted order, then the second of each, ...; returns the line that says so.
    Raises :class:`InputError` when there is no such folder or image."""
    source = os.path.join(data, "train")
    if not os.path.isdir(source):
        raise InputError(f"--data {data}: no train/ folder")
    files = {}
    for name in sorted(os.listdir(source)):
        folder = os.path.join(source, name)
        if not name.startswith(".") and os.path.isdir(folder):
            files[name] = sorted(f for f in os.listdir(folder) if not f.startswith(".")
                                 and os.path.isfile(os.path.join(folder, f)))
    rounds = range(max(map(len, files.values()), default=0))
    picked = list(itertools.islice(((name, names[k]) for k in rounds
                                    for name, names in files.items() if k < len(names)), images))
    if not picked:
        raise InputError(f"--data {data}: no images in {source}/<class>/")
    for name, file in picked:
        os.makedirs(os.path.join(train, name), exist_ok=True)
        shutil.copy2(os.path.join(source, name, file), os.path.join(train, name, file))
    classes = len({name for name, _ in picked})
    return f"gpu-bundle: images: {len(picked)} files in {classes} classes from {source}"


def generate_sample(train: str) -> str:
    """Generate ImageNet-sized JPEGs (``tools/datagen.py``) into ``train``; returns the line
    that says so."""
    from .datagen import make_split

    g = GENERATED
    make_split(train, 10, g["per_class"], seed=0, min_size=g["min_size"],
               max_size=g["max_size"], noise=g["noise"], shapes=g["shapes"])
    return (f"gpu-bundle: images: {10 * g['per_class']} generated JPEGs ({g['min_size']}-"
            f"{g['max_size']} px, tools/datagen.py; pass DATA=DIR for real images)")


def folder_mib(path: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path)
               for f in files if not os.path.islink(os.path.join(d, f))) / 2**20


def build(args) -> int:
    """Write the bundle; returns the exit status. Raises :class:`InputError`."""
    if args.images < 1:
        raise InputError(f"--images {args.images}: must be >= 1")
    cuda = args.cuda or local_cuda_major()
    if not re.fullmatch(r"1[1-9]", cuda):
        raise InputError(f"--cuda {cuda}: expected a CUDA major such as 12 or 13")
    if args.data and not os.path.isdir(args.data):
        raise InputError(f"--data {args.data}: no such directory")
    out = os.path.abspath(args.out)
    shutil.rmtree(out, ignore_errors=True)
    train, wheels = os.path.join(out, "sample", "train"), os.path.join(out, "wheels")
    os.makedirs(train)
    os.makedirs(wheels)
    print(copy_sample(args.data, train, args.images) if args.data else generate_sample(train),
          flush=True)
    os.symlink("train", os.path.join(out, "sample", "val"))
    specs = wheel_specs(cuda, not args.no_dali)
    base, dali = [x for x in specs if "dali" not in x], [x for x in specs if "dali" in x]
    print(f"gpu-bundle: wheels for CPython {args.python_version}, CUDA {cuda}: "
          f"{' '.join(specs)} and their dependencies", flush=True)
    # DALI and what it alone pulls in (nvCOMP, nvTIFF, nvJPEG2000, ...) in wheels-dali/: the
    # lease carries them in the calls after the first and installs them with DALI
    for wanted, folder in ((base, wheels), (dali, os.path.join(out, DALI_WHEELS))):
        if not wanted:
            continue
        os.makedirs(folder, exist_ok=True)
        if subprocess.run(pip_command(wanted, folder, args.python_version)).returncode != 0:
            print("gpu-bundle: pip download failed (see above)", file=sys.stderr)
            return 1
        for name in os.listdir(folder):
            if name.split("-")[0].lower() in ALREADY_THERE or (
                    folder != wheels and os.path.exists(os.path.join(wheels, name))):
                os.remove(os.path.join(folder, name))
    calls = lay_out_calls(out, carried_bytes(REPO))
    print(f"gpu-bundle: {out}: {folder_mib(os.path.join(out, 'wheels')):.0f} MiB of wheels "
          f"({len(os.listdir(wheels))}), {len(calls)} lease calls", flush=True)
    print("\n".join(calls_text(out, calls)))
    return 0


def carried_bytes(repo: str) -> int:
    """Bytes the device tool sends with every call besides what it carries: the repository's
    tracked files and its untracked ones that git does not ignore (``git ls-files``). Raises
    :class:`InputError` without git."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], cwd=repo, capture_output=True,
                                check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise InputError(f"git ls-files in {repo} failed ({exc}): the bytes per call are "
                         "counted from git's file list") from None
    paths = (os.path.join(repo, p) for p in listed.decode().split("\0") if p)
    return sum(os.lstat(p).st_size for p in paths if os.path.lexists(p))


def folder_bytes(path: str) -> int:
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(path)
               for f in files)


def lay_out_calls(out: str, repo_bytes: int, call_bytes: int = CALL_BYTES) -> list[dict]:
    """Lay the bundle out as ``OUT/calls/1``, ``OUT/calls/2``, ...: what each device call of
    the lease plan carries (docs/gpu-check.md), hard links of ``OUT``'s files. Call 1 carries
    ``wheels/`` (what rows 1-4 need), the sample and the manifests; ``wheels-dali/``'s small
    wheels fill the calls in order, and each wheel too large for a call (DALI's) is cut into
    parts (``tools/wheel_parts.py``) that fill the room left, call after call. Every call is
    at most ``call_bytes`` with ``repo_bytes`` and :data:`CALL_MARGIN` for commits made after
    the bundle. Raises :class:`InputError` when call 1's own files do not fit. Returns
    ``{"call", "bytes", "files"}`` per call (bytes with the repository's)."""
    room = call_bytes - CALL_MARGIN - repo_bytes
    later = os.path.join(out, DALI_WHEELS)
    names = sorted(os.listdir(later)) if os.path.isdir(later) else []
    small = [n for n in names if os.path.getsize(os.path.join(later, n)) <= room // 2]
    big = [n for n in names if n not in small]
    first = ([os.path.join("wheels", n) for n in sorted(os.listdir(os.path.join(out, "wheels")))]
             + ["sample"] + ([os.path.join(DALI_WHEELS, DALI_LIST)] if names else [])
             + ([os.path.join("parts", MANIFEST)] if big else []))
    if names:
        with open(os.path.join(later, DALI_LIST), "w") as f:
            f.write("".join(n + "\n" for n in small))
    calls, left = [first], room - MANIFEST_ROOM - sum(
        folder_bytes(os.path.join(out, x)) if os.path.isdir(os.path.join(out, x))
        else os.path.getsize(os.path.join(out, x)) for x in first if not x.endswith(
            (MANIFEST, DALI_LIST)))
    if left < 0:
        raise InputError(f"call 1 needs {(room - left) >> 20} MiB, over one call's "
                         f"{room >> 20} MiB: fewer --images")
    lefts = [left]
    for name in small:  # first fit: the earliest call with room
        size = os.path.getsize(os.path.join(later, name))
        k = next((k for k, x in enumerate(lefts) if x >= size), len(lefts))
        if k == len(lefts):
            calls, lefts = calls + [[]], lefts + [room]
        calls[k].append(os.path.join(DALI_WHEELS, name))
        lefts[k] -= size
    for name in big:  # parts fill each call's room left, in call order, then new calls
        open_calls = [k for k, x in enumerate(lefts) if x >= MIN_PART]
        parts = split(os.path.join(later, name), os.path.join(out, "parts"), part_bytes=room,
                      first=[lefts[k] for k in open_calls])
        os.remove(os.path.join(later, name))
        for n, part in enumerate(parts):
            k = open_calls[n] if n < len(open_calls) else len(calls)
            if k == len(calls):
                calls, lefts = calls + [[]], lefts + [room]
            calls[k].append(os.path.join("parts", os.path.basename(part)))
            lefts[k] -= os.path.getsize(part)
    shutil.rmtree(os.path.join(out, "calls"), ignore_errors=True)
    result = []
    for number, files in enumerate(calls, 1):
        folder = os.path.join(out, "calls", str(number))
        for rel in files:
            link_tree(os.path.join(out, rel), os.path.join(folder, rel))
        result.append({"call": number, "files": files,
                       "bytes": repo_bytes + folder_bytes(folder)})
    return result


def link_tree(src: str, dst: str) -> None:
    """``dst`` as a hard-linked copy of the file or folder ``src`` (symlinks kept as links)."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if os.path.isdir(src) and not os.path.islink(src):
        shutil.copytree(src, dst, symlinks=True, copy_function=os.link)
    elif os.path.islink(src):
        os.symlink(os.readlink(src), dst)
    else:
        os.link(src, dst)


def calls_text(out: str, calls: list[dict]) -> list[str]:
    """The device calls of the lease plan (docs/gpu-check.md): back to back, each the same
    command, each carrying its folder of ``OUT/calls``."""
    rel = os.path.relpath(out, REPO)
    lines = ["gpu-bundle: the lease's device calls, back to back, nothing read between them "
             "(the machine goes back after 30 s idle):"]
    for call in calls:
        lines.append(f"  {call['call']}. carry [\"{rel}/calls/{call['call']}\"]  timeout_s 540  "
                     f"command: {LEASE_COMMAND}   ({call['bytes'] / 2**20:.1f} MiB with the "
                     "repository)")
    return lines


def main_cli(argv=None) -> int:
    """Console entry: 0 when the bundle is written, 1 when pip fails, 2 for bad input."""
    args = get_args_parser().parse_args(argv)
    try:
        return build(args)
    except (InputError, OSError) as exc:
        print(f"gpu_bundle.py: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main_cli())
