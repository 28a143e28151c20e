"""The lease plan rehearsed on this machine (``make gpu-rehearse``, ``python -m
tools.gpu_check --rehearse``; docs/gpu-check.md): the device calls of a borrowed GPU made here
one after another, the same command each, the CPU backends standing in (``--dry-run``:
``--no-accel``, nvImageCodec's CPU backend for ``--decode-device``, DALI's CPU backend), with
the borrowed machine's limits checked:

* bytes per call: the repository's files (tracked, and untracked ones git does not ignore)
  plus what the call carries, at most 64 MiB;
* seconds: each row's work measured here (its processes' CPU seconds) and scaled to an H100
  (``_gpu_plan.gpu_seconds``); each call at most 540 s so scaled (its wall seconds here are
  shown, not judged: 2 cores shared with other jobs); the lease, start-up and per-call
  overhead included, at most 15 minutes, rows 1-5 within 13;
* ``$OUT`` after each call (a fresh folder per call, as on the device): at most 8 files of at
  most 16 MiB, at most 2 folders deep. With ``OUT`` set in the environment the last call's
  files are left there: what would come back.

The machine is a temporary folder (``--state DIR`` to keep it): a copy of the repository's
files, ``.gpu-bundle/calls/N`` carried in per call, the lease's state folder, one ``$OUT`` per
call. Exit status 0 when every limit holds and no row failed, 1 otherwise, 2 for bad input.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from . import _gpu_plan as plan
from ._gpu_lease import ARCHIVE, read_rows
from ._gpu_runner import REPO
from .gpu_bundle import carried_bytes, folder_bytes

CALL_BYTES, CALL_LIMIT = 64 << 20, 540.0
# a call here may wait far longer than on 16 idle cores for the same work (2 cores shared by
# other jobs): it is stopped only after this, and judged by its scaled seconds
HERE_LIMIT = 3000.0
OUT_FILES, OUT_FILE_BYTES, OUT_DEPTH = 8, 16 << 20, 2


def rehearse_main(args) -> int:
    """See the module; returns the exit status."""
    bundle = os.path.abspath(args.bundle or os.path.join(REPO, ".gpu-bundle"))
    calls_dir = os.path.join(bundle, "calls")
    calls = sorted((int(n) for n in os.listdir(calls_dir) if n.isdigit()), key=int) \
        if os.path.isdir(calls_dir) else []
    if not calls:
        print(f"gpu_check.py --rehearse: error: no lease calls in {calls_dir} (make gpu-bundle "
              "writes them)", file=sys.stderr)
        return 2
    root = os.path.abspath(args.state) if args.state else tempfile.mkdtemp(prefix="gpu-rehearse-")
    repo = copy_repository(os.path.join(root, "repo"))
    repo_bytes = carried_bytes(REPO)
    results = []
    for number in calls:
        results.append(rehearse_call(root, repo, os.path.join(calls_dir, str(number)), number,
                                     repo_bytes, args.rows))
    rows = read_rows(os.path.join(root, "state", "rows.jsonl"))
    planned = ["install", "environment", "data"] + [
        r.name for r in plan.select(plan.plan_rows(), args.rows)]
    summary = judge(results, rows, planned)
    if os.environ.get("OUT"):
        leave_in_out(results[-1]["out"], os.environ["OUT"])
        summary["out"] = check_out(os.environ["OUT"])
        summary["ok"] = summary["ok"] and not summary["out"]["problems"]
    with open(os.path.join(root, "rehearsal.json"), "w") as f:
        json.dump({"calls": results, "rows": rows, "summary": summary}, f, indent=1)
    print("\n".join(summary_lines(results, summary, root)), flush=True)
    return 0 if summary["ok"] else 1


def copy_repository(target: str) -> str:
    """The files the device tool sends (``git ls-files``), copied into ``target``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    shutil.rmtree(target, ignore_errors=True)
    for rel in filter(None, listed):
        src, dst = os.path.join(REPO, rel), os.path.join(target, rel)
        if os.path.lexists(src):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(src, dst, follow_symlinks=False)
    return target


def rehearse_call(root: str, repo: str, carried: str, number: int, repo_bytes: int,
                  rows: list[str] | None) -> dict:
    """One device call: carry ``carried`` into the copy, run the lease command with a fresh
    ``$OUT`` and the device's limit, check what it left there."""
    target = os.path.join(repo, ".gpu-bundle", "calls", str(number))
    shutil.copytree(carried, target, symlinks=True)
    out = os.path.join(root, f"out-{number}")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    cmd = [sys.executable, "-m", "tools.gpu_check", "--lease", "--dry-run",
           "--state", os.path.join(root, "state"), *(["--rows", *rows] if rows else [])]
    started = time.monotonic()
    with open(os.path.join(root, f"call-{number}.log"), "w") as log:
        try:
            code = subprocess.run(cmd, cwd=repo, env={**os.environ, "OUT": out},
                                  stdout=log, stderr=subprocess.STDOUT,
                                  timeout=HERE_LIMIT).returncode
        except subprocess.TimeoutExpired:
            code = None
    return {"call": number, "bytes": repo_bytes + folder_bytes(carried),
            "seconds": round(time.monotonic() - started, 1), "returncode": code,
            "out": out, "out_check": check_out(out)}


def check_out(folder: str) -> dict:
    """What ``folder`` would send back, against the device tool's limits."""
    files, problems = [], []
    for d, dirs, names in os.walk(folder):
        depth = os.path.relpath(d, folder).count(os.sep) + (d != folder)
        if depth > OUT_DEPTH:
            problems.append(f"{d}: deeper than {OUT_DEPTH} folders")
        files += [os.path.join(d, n) for n in names]
    if len(files) > OUT_FILES:
        problems.append(f"{len(files)} files (at most {OUT_FILES})")
    problems += [f"{f}: {os.path.getsize(f) >> 20} MiB (at most {OUT_FILE_BYTES >> 20})"
                 for f in files if os.path.getsize(f) > OUT_FILE_BYTES]
    return {"files": [os.path.relpath(f, folder) for f in files],
            "bytes": sum(os.path.getsize(f) for f in files), "problems": problems}


def leave_in_out(source: str, out: str) -> None:
    """The last call's returned files into ``out`` (replacing an earlier rehearsal's archive)."""
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(source):
        shutil.copy2(os.path.join(source, name), os.path.join(out, name))


def judge(results: list[dict], rows: list[dict], planned: list[str]) -> dict:
    """Seconds per call scaled to an H100, the lease's total with the start and each call's
    overhead, rows 1-5's end, and every limit's verdict (``problems``; ``ok``): each of
    ``planned`` (the set-up and the selected rows) must have run."""
    problems = []
    for r in results:
        r["gpu_seconds"] = round(sum(x.get("gpu_seconds") or 0 for x in rows
                                     if x.get("call") == r["call"]), 1)
        if r["bytes"] > CALL_BYTES:
            problems.append(f"call {r['call']}: {r['bytes'] / 2**20:.1f} MiB (at most 64)")
        if r["returncode"] is None:
            problems.append(f"call {r['call']}: still running after {HERE_LIMIT:.0f} s here")
        elif r["returncode"] not in (0, 1):  # 1: a row failed, named below
            problems.append(f"call {r['call']}: exit status {r['returncode']} (call-"
                            f"{r['call']}.log)")
        if r["gpu_seconds"] > CALL_LIMIT:
            problems.append(f"call {r['call']}: {r['gpu_seconds']:.0f} s on an H100 (at most "
                            f"{CALL_LIMIT:.0f})")
        problems += [f"call {r['call']}: $OUT: {p}" for p in r["out_check"]["problems"]]
    total = plan.START_SECONDS + sum(r["gpu_seconds"] + plan.CALL_OVERHEAD for r in results)
    core_calls = [x["call"] for x in rows if x.get("group", 9) <= 5] or [0]
    core = plan.START_SECONDS + sum(x.get("gpu_seconds") or 0 for x in rows
                                    if x.get("group", 9) <= 5) + plan.CALL_OVERHEAD * max(core_calls)
    if total > plan.LEASE_SECONDS:
        problems.append(f"lease: {total:.0f} s (at most {plan.LEASE_SECONDS:.0f})")
    if core > plan.CORE_DEADLINE:
        problems.append(f"rows 1-5 end at {core:.0f} s (at most {plan.CORE_DEADLINE:.0f})")
    failed = [x["name"] for x in rows if x["status"] == "failed"]
    problems += [f"row {name} failed" for name in failed]
    ran = {x["name"] for x in rows}
    problems += [f"row {name} never ran" for name in planned if name not in ran]
    return {"total_gpu_seconds": round(total, 1), "core_gpu_seconds": round(core, 1),
            "problems": problems, "ok": not problems}


def summary_lines(results: list[dict], summary: dict, root: str) -> list[str]:
    lines = ["gpu-rehearse: call | MiB sent | seconds here | H100 seconds | $OUT files"]
    for r in results:
        lines.append(f"  {r['call']} | {r['bytes'] / 2**20:.1f} | {r['seconds']:.0f} | "
                     f"{r['gpu_seconds']:.0f} | {len(r['out_check']['files'])}")
    lines.append(f"gpu-rehearse: lease {summary['total_gpu_seconds']:.0f} s of "
                 f"{plan.LEASE_SECONDS:.0f} on an H100 (start {plan.START_SECONDS:.0f} s and "
                 f"{plan.CALL_OVERHEAD:.0f} s per call included); rows 1-5 end at "
                 f"{summary['core_gpu_seconds']:.0f} s (at most {plan.CORE_DEADLINE:.0f})")
    lines += [f"gpu-rehearse: PROBLEM: {p}" for p in summary["problems"]]
    lines.append(f"gpu-rehearse: {'the plan fits' if summary['ok'] else 'the plan does NOT fit'}"
                 f"; details in {os.path.join(root, 'rehearsal.json')}, the archive "
                 f"{ARCHIVE} of each call in {root}/out-N")
    return lines
