"""The bundle laid out as the lease's device calls (``.gpu-bundle/calls/N``, hard links of the
bundle's files; docs/gpu-check.md), each at most 64 MiB with the repository's files.

Call 1 carries ``wheels/`` and the sample, everything rows 1-4 need, so that it stands alone.
Later calls carry DALI's dependencies (first fit) and its ~190 MiB wheel in parts
(:mod:`.wheel_parts`); the first of them also the manifest and the list of DALI's whole wheels.
Each call's ``CALL`` file holds its number, the number of calls, the bundle's id and every
call's bytes.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

from ..lease.calls import CALL_FILE
from ..runner import REPO
from ..settings import InputError
from .wheel_parts import MANIFEST, split

# 64 MiB per call with the repository's files; the margin leaves room for later commits and the
# CALL file; a part under MIN_PART is not worth a place; MANIFEST_ROOM holds SHA256SUMS.
CALL_BYTES, CALL_MARGIN, MIN_PART, MANIFEST_ROOM = 64 << 20, 2 << 20, 1 << 20, 4096
LEASE_COMMAND = "python3 -m tools.gpu_check --lease"
# DALI's wheels, and the list of those that travel whole (DALI is installed once all came)
DALI_WHEELS, DALI_LIST = "wheels-dali", "WHEELS"


def sent_files(repo: str) -> list[str]:
    """Relative paths of what the device tool sends with every call: the repository's tracked
    files and untracked ones git does not ignore. Raises :class:`InputError` without git."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], cwd=repo, capture_output=True,
                                check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise InputError(f"git ls-files in {repo} failed ({exc}): the bytes per call are "
                         "counted from git's file list") from None
    return [p for p in listed.decode().split("\0") if p and os.path.lexists(os.path.join(repo, p))]


def carried_bytes(repo: str) -> int:
    """Bytes of :func:`sent_files`."""
    return sum(os.lstat(os.path.join(repo, p)).st_size for p in sent_files(repo))


def folder_bytes(path: str) -> int:
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(path)
               for f in files)


def lay_out_calls(out: str, repo_bytes: int, call_bytes: int = CALL_BYTES) -> list[dict]:
    """Lay ``out`` out as ``OUT/calls/1``, ``2``, ..., each at most ``call_bytes`` with
    ``repo_bytes`` and :data:`CALL_MARGIN`; returns ``{"call", "bytes", "files"}`` per call.
    Raises :class:`InputError` when call 1 does not fit."""
    room = call_bytes - CALL_MARGIN - repo_bytes
    first = [os.path.join("wheels", n) for n in sorted(os.listdir(os.path.join(out, "wheels")))]
    first.append("sample")
    need = sum(folder_bytes(os.path.join(out, x)) for x in first)
    if need > room:
        raise InputError(f"call 1 needs {need >> 20} MiB, over one call's {room >> 20} MiB: "
                         "fewer --images")
    calls = [first] + dali_calls(out, room)
    shutil.rmtree(os.path.join(out, "calls"), ignore_errors=True)
    for number, files in enumerate(calls, 1):
        for rel in files:
            link_tree(os.path.join(out, rel), os.path.join(out, "calls", str(number), rel))
    sizes = [repo_bytes + folder_bytes(os.path.join(out, "calls", str(n))) + 1024
             for n in range(1, len(calls) + 1)]
    bundle = os.urandom(6).hex()
    for number, files in enumerate(calls, 1):
        with open(os.path.join(out, "calls", str(number), CALL_FILE), "w") as f:
            json.dump({"call": number, "calls": len(calls), "bundle": bundle, "bytes": sizes,
                       "files": files}, f)
    return [{"call": n, "files": files, "bytes": size}
            for n, (files, size) in enumerate(zip(calls, sizes), 1)]


def dali_calls(out: str, room: int) -> list[list[str]]:
    """The calls after the first: small wheels first fit, a wheel too large for a call cut
    into parts filling the room left, call after call."""
    later = os.path.join(out, DALI_WHEELS)
    names = sorted(n for n in os.listdir(later) if n.endswith(".whl")) \
        if os.path.isdir(later) else []
    if not names:
        return []
    small = [n for n in names if os.path.getsize(os.path.join(later, n)) <= room // 2]
    big = [n for n in names if n not in small]
    with open(os.path.join(later, DALI_LIST), "w") as f:
        f.write("".join(n + "\n" for n in small))
    calls = [[os.path.join(DALI_WHEELS, DALI_LIST)] + ([os.path.join("parts", MANIFEST)]
                                                      if big else [])]
    lefts = [room - MANIFEST_ROOM]
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
    return calls


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
    """The device calls to make, as lines (docs/gpu-check.md)."""
    rel = os.path.relpath(out, REPO)
    lines = ["gpu-bundle: the lease's device calls (docs/gpu-check.md); each later one only if "
             "the previous call's last line says NEXT, at once (the machine goes back after "
             "30 s idle), then give_back:"]
    for call in calls:
        left = "" if call["call"] == 1 else " --lease-left <budget_left_s of the last reply>"
        lines.append(f"  {call['call']}. carry [\"{rel}/calls/{call['call']}\"]  timeout_s 540  "
                     f"command: {LEASE_COMMAND}{left}   ({call['bytes'] / 2**20:.1f} MiB with "
                     "the repository)")
    return lines
