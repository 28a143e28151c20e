"""The lease's calls on the borrowed machine: which call this is (the carried ``CALL`` file),
what earlier calls left in the state folder (``lease.json``), and the one archive of results
that comes back under ``$OUT``."""
from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import time

CALL_FILE = "CALL"  # in each .gpu-bundle/calls/N: {"call", "calls", "bundle", "bytes", "files"}
LOG_BYTES = 1 << 20  # of each log in the archive: its last MiB


def carried_call(calls: str) -> dict | None:
    """The ``CALL`` record carried into ``calls`` (the highest number if several), or None."""
    found = []
    for number in os.listdir(calls) if os.path.isdir(calls) else []:
        path = os.path.join(calls, number, CALL_FILE)
        if os.path.isfile(path):
            with open(path) as f:
                found.append(json.load(f))
    return max(found, key=lambda c: c["call"], default=None)


def start_call(state: str, carried: dict | None, lease_left: float | None) -> dict:
    """Record this call in ``STATE/lease.json`` and return it: ``call`` (the carried number,
    else one after the last recorded), ``calls``, ``bundle`` (its id), ``bytes`` (per call),
    ``started`` (wall seconds), ``lease_left``, ``first`` (start of the lease's first call
    here), ``new`` (no earlier call of this bundle ran here) and ``lost`` (:func:`lost_state`)."""
    path = os.path.join(state, "lease.json")
    calls = json.load(open(path)) if os.path.isfile(path) else []
    carried = carried or {"call": len(calls) + 1, "calls": 1, "bundle": None, "bytes": []}
    here = [c for c in calls if c.get("bundle") == carried["bundle"]]
    call = {"call": carried["call"], "calls": carried["calls"], "bundle": carried["bundle"],
            "bytes": carried.get("bytes", []), "files": carried.get("files", []),
            "started": time.time(), "lease_left": lease_left}
    call["lost"], call["new"] = lost_state(here, call), not here
    call["first"] = here[0]["started"] if here and not call["lost"] else call["started"]
    with open(path, "w") as f:
        json.dump(calls + [{k: v for k, v in call.items() if k not in ("first", "new")}], f)
    return call


def lost_state(before: list[dict], call: dict) -> str | None:
    """Why this machine lacks what calls 1 .. ``call`` - 1 of the bundle left (``before``: those
    it recorded), or None when every earlier call ran here."""
    done = {c["call"] for c in before}
    missing = [k for k in range(1, call["call"]) if k not in done]
    if not missing:
        return None
    since = f"since call {missing[0]}" if done else "a fresh machine"
    return (f"machine lost ({since}): call {call['call']} found no state of call"
            f"{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} here: their "
            "wheels installed, data, rows and carried files (DALI's parts among them) are "
            "gone; their archives came back with their replies")


def clear_state(state: str) -> None:
    """Remove everything in ``state`` but ``lease.json``."""
    for name in os.listdir(state):
        path = os.path.join(state, name)
        if name == "lease.json":
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)


def stash(calls: str, bundle: str) -> list[str]:
    """Move every file carried in ``calls/N/`` into ``bundle`` (same relative paths), so no
    later call's carry replaces it; returns their relative paths."""
    moved = []
    for number in sorted(os.listdir(calls)) if os.path.isdir(calls) else []:
        root = os.path.join(calls, number)
        for folder, _, files in os.walk(root):
            for name in files:
                rel = os.path.relpath(os.path.join(folder, name), root)
                target = os.path.join(bundle, rel)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                if os.path.lexists(target):
                    os.remove(target)
                shutil.move(os.path.join(folder, name), target)
                moved.append(rel)
        shutil.rmtree(root, ignore_errors=True)
    return moved


def read_rows(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def write_archive(state: str, target: str) -> None:
    """One ``tar.gz`` at ``target`` (written beside it, then renamed): rows, reports, calls,
    each log's last :data:`LOG_BYTES` and each run's ``metrics.jsonl``."""
    names = ["rows.jsonl", "report.json", "report.md", "lease.json"]
    for folder, sub in (("logs", ""), ("runs", "metrics.jsonl")):
        root = os.path.join(state, folder)
        for d, _, files in sorted(os.walk(root)) if os.path.isdir(root) else []:
            names += [os.path.relpath(os.path.join(d, f), state) for f in sorted(files)
                      if not sub or f == sub]
    os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
    partial = target + ".partial"
    with tarfile.open(partial, "w:gz") as tar:
        for name in names:
            path = os.path.join(state, name)
            if not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                size = os.path.getsize(path)
                f.seek(max(0, size - LOG_BYTES))
                data = f.read()
            info = tarfile.TarInfo(os.path.join("gpu-check", name))
            info.size, info.mtime = len(data), int(os.path.getmtime(path))
            tar.addfile(info, io.BytesIO(data))
    os.replace(partial, target)
