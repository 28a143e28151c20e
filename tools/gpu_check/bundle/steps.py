"""An offline bundle split into steps (``make gpu-bundle STEP_SIZE=64M``), each of which fits,
with the repository's files, one transfer of that size: ``BUNDLE/steps/N`` (hard links of the
bundle's files) and its ``STEP.json``.

Step 1 holds ``wheels/`` and the sample, everything rows 1-4 need and nothing of DALI, so it
stands alone. The later steps hold DALI's wheels (first fit) and its ~190 MiB wheel in parts
(:mod:`.parts`) filling the room left; the last step installs DALI and runs the rest.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

from ..cli import InputError
from .parts import MANIFEST, split

MARGIN, MIN_PART, MANIFEST_ROOM = 2 << 20, 1 << 20, 4096  # bytes: for later commits, STEP.json
DALI_WHEELS = "wheels-dali"


def size(text: str) -> int:
    """Bytes of ``64M``, ``64MiB``, ``1G``, ``500K`` or a plain number (K, M, G: powers of
    1024). Raises :class:`InputError`."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)(?:i?B)?\s*", text or "", re.I)
    if not found:
        raise InputError(f"--step-size {text}: expected a size such as 64M")
    return int(float(found.group(1)) * 1024 ** " KMG".index(found.group(2).upper() or " "))


def repository_files(repo: str) -> list[str]:
    """Relative paths of the repository's files a copy to the host holds: tracked, and
    untracked ones git does not ignore. Raises :class:`InputError` without git."""
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
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(path)
               for f in files)


def lay_out_steps(out: str, repo_bytes: int, step_bytes: int) -> list[dict]:
    """Lay ``out`` out as ``OUT/steps/1``, ``2``, ..., each at most ``step_bytes`` with
    ``repo_bytes`` and :data:`MARGIN`; returns ``{"step", "bytes", "files"}`` per step.
    Raises :class:`InputError` when step 1 does not fit."""
    room = step_bytes - MARGIN - repo_bytes
    first = [os.path.join("wheels", n) for n in sorted(os.listdir(os.path.join(out, "wheels")))]
    first.append("sample")
    need = sum(folder_bytes(os.path.join(out, x)) for x in first)
    if need > room:
        raise InputError(f"step 1 needs {need / 2**20:.1f} MiB beside the repository's "
                         f"{repo_bytes / 2**20:.1f}, over --step-size less a 2 MiB margin: "
                         "a larger --step-size or fewer --images")
    shutil.rmtree(os.path.join(out, "steps"), ignore_errors=True)
    steps = [first] + dali_steps(out, room)
    for number, files in enumerate(steps, 1):
        for rel in files:
            link_tree(os.path.join(out, rel), os.path.join(out, "steps", str(number), rel))
    shutil.rmtree(os.path.join(out, "parts"), ignore_errors=True)  # the parts live in steps/
    sizes = [repo_bytes + folder_bytes(os.path.join(out, "steps", str(n))) + 1024
             for n in range(1, len(steps) + 1)]
    bundle = os.urandom(6).hex()
    for number in range(1, len(steps) + 1):
        with open(os.path.join(out, "steps", str(number), "STEP.json"), "w") as f:
            json.dump({"step": number, "steps": len(steps), "bundle": bundle,
                       "size": step_bytes, "bytes": sizes, "files": steps}, f)
    return [{"step": n, "files": files, "bytes": b}
            for n, (files, b) in enumerate(zip(steps, sizes), 1)]


def dali_steps(out: str, room: int) -> list[list[str]]:
    """The steps after the first: DALI's small wheels first fit, a wheel too large for a step
    cut into parts filling the room left, step after step."""
    folder = os.path.join(out, DALI_WHEELS)
    names = sorted(n for n in os.listdir(folder) if n.endswith(".whl")) \
        if os.path.isdir(folder) else []
    if not names:
        return []
    small = [n for n in names if os.path.getsize(os.path.join(folder, n)) <= room // 2]
    big = [n for n in names if n not in small]
    steps, lefts = [[os.path.join("parts", MANIFEST)] if big else []], [room - MANIFEST_ROOM]
    for name in small:  # first fit: the earliest step with room
        k = next((k for k, x in enumerate(lefts) if x >= os.path.getsize(
            os.path.join(folder, name))), len(lefts))
        if k == len(lefts):
            steps, lefts = steps + [[]], lefts + [room]
        steps[k].append(os.path.join(DALI_WHEELS, name))
        lefts[k] -= os.path.getsize(os.path.join(folder, name))
    for name in big:  # parts fill each step's room left, in order, then new steps
        open_steps = [k for k, x in enumerate(lefts) if x >= MIN_PART]
        parts = split(os.path.join(folder, name), os.path.join(out, "parts"), part_bytes=room,
                      first=[lefts[k] for k in open_steps])
        for n, part in enumerate(parts):
            k = open_steps[n] if n < len(open_steps) else len(steps)
            if k == len(steps):
                steps, lefts = steps + [[]], lefts + [room]
            steps[k].append(os.path.join("parts", os.path.basename(part)))
            lefts[k] -= os.path.getsize(part)
    return steps


def link_tree(src: str, dst: str) -> None:
    """``dst`` as a hard-linked (else copied) copy of the file or folder ``src``, merged into
    what is there (a file there is replaced); symlinks, to folders too, stay links."""
    pairs = [(src, dst)] if not os.path.isdir(src) or os.path.islink(src) else [
        (os.path.join(d, n), os.path.join(dst, os.path.relpath(os.path.join(d, n), src)))
        for d, dirs, names in os.walk(src)
        for n in names + [x for x in dirs if os.path.islink(os.path.join(d, x))]]
    for a, b in pairs:
        os.makedirs(os.path.dirname(b), exist_ok=True)
        if os.path.lexists(b):
            os.remove(b)
        if os.path.islink(a):
            os.symlink(os.readlink(a), b)
            continue
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)


def missing_files(stash: str, info: dict, upto: int) -> list[str]:
    """The files of steps 1 .. ``upto`` (``info``: a ``STEP.json``) not in ``stash``."""
    return [f"{rel} (step {n})" for n, files in enumerate(info["files"][:upto], 1)
            for rel in files if not os.path.lexists(os.path.join(stash, rel))]


def steps_text(out: str, steps: list[dict], repo: str) -> list[str]:
    """The steps, as lines: what to copy to the host and the command to run there."""
    rel = os.path.relpath(out, repo)
    lines = [f"gpu-bundle: {len(steps)} steps; on the GPU host, from the repository, run the "
             "steps in order, on one host, with the same --out (docs/gpu-check.md):"]
    lines += [f"  step {s['step']}: copy {rel}/steps/{s['step']} ({s['bytes'] / 2**20:.1f} MiB "
              f"with the repository), then: python3 -m tools.gpu_check --step {s['step']} "
              "[--budget T]" for s in steps]
    return lines
