"""The lease plan rehearsed on this machine (``make gpu-rehearse``, ``--rehearse``;
docs/gpu-check.md): the device calls made one after another as a lead makes them, on the CPU
backends (``--dry-run``), checking the borrowed machine's limits: at most 64 MiB per call; the
install (:func:`hide_layer`); machine time scaled to an H100 (:func:`charge`): the lease within
15 minutes, call 1 back within 8 with its set-up and rows within 7 (targets, reported); ``$OUT``
after each call (:func:`check_out`). The machine is a temporary folder (``--state DIR`` keeps
it). Exit status 0 when every limit holds and no row failed, 1 otherwise, 2 for bad input.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

from . import plan
from .calls import CALL_FILE, read_rows
from ..machine.install import dist_name, wheel_module
from ..machine.layout import carried_bytes, folder_bytes, sent_files
from ..runner import REPO

CALL_BYTES, CALL_LIMIT, HERE_LIMIT = 64 << 20, 540.0, 3000.0
OUT_FILES, OUT_FILE_BYTES, OUT_DEPTH = 8, 16 << 20, 2
# Distributions the GPU machine's image holds (the device tool's package list): left visible.
MACHINE_HAS = {"numpy", "packaging", "pytest", "pluggy", "iniconfig", "pygments",
               "typing_extensions", "six", "wheel", "pyyaml"}
# sitecustomize of the rehearsal's processes: the hidden modules and distributions are found
# nowhere under this environment's site-packages
HIDE = """\
import importlib.abc, importlib.machinery, importlib.metadata, os, re, sys
_MODULES = tuple(os.environ["GPU_CHECK_HIDE_MODULES"].split(","))
_DISTS = set(os.environ["GPU_CHECK_HIDE_DISTS"].split(","))
_FROM = os.environ["GPU_CHECK_HIDE_FROM"]
def _kept(paths):
    return [p for p in paths if not os.path.realpath(p or ".").startswith(_FROM)]
class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if not any(name == m or name.startswith(m + ".") for m in _MODULES):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, _kept(path or sys.path), target)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return spec
_found = importlib.machinery.PathFinder.find_distributions
def _find(context=importlib.metadata.DistributionFinder.Context()):
    if context.name and re.sub(r"[-_.]+", "_", context.name).lower() in _DISTS:
        context = importlib.metadata.DistributionFinder.Context(
            name=context.name, path=_kept(context.path))
    return _found(context)
importlib.machinery.PathFinder.find_distributions = staticmethod(_find)
sys.meta_path.insert(0, _Hide())
"""


def rehearse_main(args) -> int:
    """Returns the exit status."""
    bundle = os.path.abspath(args.bundle or os.path.join(REPO, ".gpu-bundle"))
    calls_dir = os.path.join(bundle, "calls")
    calls = sorted(int(n) for n in os.listdir(calls_dir) if n.isdigit()) \
        if os.path.isdir(calls_dir) else []
    if not calls:
        print(f"gpu_check --rehearse: error: no lease calls in {calls_dir} (make gpu-bundle "
              "writes them)", file=sys.stderr)
        return 2
    root = os.path.abspath(args.state) if args.state else tempfile.mkdtemp(prefix="gpu-rehearse-")
    repo = copy_repository(os.path.join(root, "repo"))
    env, wheels = hide_layer(root, bundle)
    clock = {"used": plan.START_SECONDS + (plan.FALLBACK_SECONDS if args.fallback_start else 0)}
    results, beyond = [], False
    for number in calls:
        lease_left = None if number == 1 else plan.LEASE_SECONDS - clock["used"]
        # once a lead would give the machine back, the calls go on to rehearse what they
        # carry (DALI's install), outside the lease's clock
        beyond = beyond or bool(results) and not lead_goes_on(results[-1], lease_left)
        results.append(rehearse_call(root, repo, os.path.join(calls_dir, str(number)), number,
                                     None if beyond else lease_left, args.rows, env))
        rows = read_rows(os.path.join(root, "state", "rows.jsonl"))
        results[-1]["beyond_lease"] = beyond
        charge(results[-1], rows, clock if not beyond else dict(clock))
    rows = read_rows(os.path.join(root, "state", "rows.jsonl"))
    summary = judge(results, rows, clock, args, wheels, os.path.join(root, "state", "site"))
    if os.environ.get("OUT"):
        shutil.copytree(results[-1]["out"], os.environ["OUT"], dirs_exist_ok=True)
        summary["out"] = check_out(os.environ["OUT"])
        summary["ok"] = summary["ok"] and not summary["out"]["problems"]
    with open(os.path.join(root, "rehearsal.json"), "w") as f:
        json.dump({"calls": results, "rows": rows, "summary": summary}, f, indent=1)
    print("\n".join(summary_lines(results, summary, root)), flush=True)
    return 0 if summary["ok"] else 1


def copy_repository(target: str) -> str:
    """The files the device tool sends (:func:`.layout.sent_files`) copied into ``target``."""
    shutil.rmtree(target, ignore_errors=True)
    for rel in sent_files(REPO):
        os.makedirs(os.path.dirname(os.path.join(target, rel)), exist_ok=True)
        shutil.copy2(os.path.join(REPO, rel), os.path.join(target, rel), follow_symlinks=False)
    return target


def hide_layer(root: str, bundle: str) -> tuple[dict, dict]:
    """The calls' environment, with :data:`HIDE` as ``sitecustomize`` hiding this
    environment's copies of what the bundle installs, and the bundle's wheels by fate:
    ``installed`` here into a clean ``--target``, ``visible`` (:data:`MACHINE_HAS`) and
    ``checked`` (another interpreter's, e.g. ``cp312``: name and tag, with any ``problem``)."""
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename

    here = set(sys_tags())
    names = [os.path.join(d, n) for d in ("wheels", "wheels-dali") if os.path.isdir(
        os.path.join(bundle, d)) for n in sorted(os.listdir(os.path.join(bundle, d)))
        if n.endswith(".whl")]
    parts = os.path.join(bundle, "parts", "SHA256SUMS")
    names += [os.path.join("parts", n.split()[1]) for n in open(parts) if ".part" not in n] \
        if os.path.isfile(parts) else []
    fate = {"installed": [], "visible": [], "checked": []}
    modules = []
    for name in names:
        tags = parse_wheel_filename(os.path.basename(name))[3]
        if dist_name(name) in MACHINE_HAS:
            fate["visible"].append(name)
        elif tags & here:
            fate["installed"].append(name)
            path = os.path.join(bundle, name)
            modules.append(wheel_module(path) if os.path.isfile(path) else "nvidia.dali")
        else:
            fate["checked"].append({"wheel": name, "problem": next(
                (None for t in tags if t.interpreter in ("cp312", "py3") and
                 t.platform.startswith("manylinux") and t.platform.endswith("x86_64")),
                "not a CPython 3.12 manylinux x86_64 wheel")})
    folder = os.path.join(root, "hide")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
        f.write(HIDE)
    env = {"PYTHONPATH": folder, "GPU_CHECK_HIDE_MODULES": ",".join(sorted(set(modules))),
           "GPU_CHECK_HIDE_DISTS": ",".join(sorted({dist_name(n) for n in fate["installed"]})),
           "GPU_CHECK_HIDE_FROM": os.path.realpath(sysconfig.get_paths()["purelib"])}
    return env, fate


def rehearse_call(root: str, repo: str, carried: str, number: int, lease_left: float | None,
                  rows: list[str] | None, env: dict) -> dict:
    """One device call: carry ``carried`` into the copy, run the lease command with a fresh
    ``$OUT`` and ``--lease-left``; check what it left in ``$OUT``."""
    target = os.path.join(repo, ".gpu-bundle", "calls", str(number))
    shutil.copytree(carried, target, symlinks=True)
    out = os.path.join(root, f"out-{number}")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    cmd = [sys.executable, "-m", "tools.gpu_check", "--lease", "--dry-run",
           "--state", os.path.join(root, "state"), *(["--rows", *rows] if rows else []),
           *(["--lease-left", f"{lease_left:.0f}"] if lease_left is not None else [])]
    started = time.monotonic()
    log = os.path.join(root, f"call-{number}.log")
    with open(log, "w") as f:
        try:
            code = subprocess.run(cmd, cwd=repo, env={**os.environ, **env, "OUT": out},
                                  stdout=f, stderr=subprocess.STDOUT,
                                  timeout=HERE_LIMIT).returncode
        except subprocess.TimeoutExpired:
            code = None
    with open(log, errors="replace") as f:
        last = (f.read().strip().splitlines() or [""])[-1]
    with open(os.path.join(carried, CALL_FILE)) as f:
        declared = json.load(f)["bytes"][number - 1]
    return {"call": number, "bytes": carried_bytes(REPO) + folder_bytes(carried),
            "declared_bytes": declared, "lease_left": lease_left,
            "seconds": round(time.monotonic() - started, 1), "returncode": code, "out": out,
            "out_check": check_out(out), "last_line": last, "command": " ".join(cmd[1:])}


def lead_goes_on(previous: dict, lease_left: float) -> bool:
    """Whether a lead makes the next call: the previous one's last line says ``NEXT`` and
    its need is covered by the time the lender reports left."""
    need = re.search(r"NEXT: .* budget_left_s >= (\d+)", previous["last_line"])
    previous["lead"] = ("next call" if need and lease_left >= float(need.group(1))
                        else f"give_back ({lease_left:.0f} s left, "
                        f"{need.group(1) if need else '-'} needed)")
    return previous["lead"] == "next call"


def charge(result: dict, rows: list[dict], clock: dict) -> None:
    """Machine seconds of one call, scaled to an H100: a gap before each later call, its
    upload, its command (:data:`.plan.CALL_OVERHEAD` and its rows)."""
    command = plan.CALL_OVERHEAD + sum(x.get("gpu_seconds") or 0 for x in rows
                                       if x.get("call") == result["call"])
    result["upload_seconds"] = round(plan.upload_seconds(result["bytes"]), 1)
    result["gap_seconds"] = plan.GAP_SECONDS if result["call"] > 1 else 0.0
    result["gpu_seconds"] = round(command, 1)
    clock["used"] += result["gap_seconds"] + result["upload_seconds"] + command
    result["back_at"] = round(clock["used"], 1)


def check_out(folder: str) -> dict:
    """What ``folder`` would send back, against the device tool's limits (at most 8 files of
    16 MiB, 2 folders deep)."""
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


def judge(results: list[dict], rows: list[dict], clock: dict, args, fate: dict,
          site: str) -> dict:
    """Every limit's verdict (``problems``; ``ok``) and the clock's figures: when call 1 is
    back and what its set-up and rows took, the lease's end with the closing idle."""
    problems = []
    inside = [r for r in results if not r["beyond_lease"]]
    for r in results:
        where = f"call {r['call']}" + (" (beyond the lease)" if r["beyond_lease"] else "")
        if r["bytes"] > CALL_BYTES:
            problems.append(f"{where}: {r['bytes'] / 2**20:.1f} MiB (at most 64)")
        if r["returncode"] not in (0, 1):  # 1: a row failed, named below
            problems.append(f"{where}: exit status {r['returncode']} (call-{r['call']}.log)")
        if r["gpu_seconds"] > CALL_LIMIT and not r["beyond_lease"]:
            problems.append(f"{where}: {r['gpu_seconds']:.0f} s on an H100 (at most 540)")
        problems += [f"{where}: $OUT: {p}" for p in r["out_check"]["problems"]]
    start = plan.START_SECONDS + (plan.FALLBACK_SECONDS if args.fallback_start else 0)
    first = results[0]
    total = clock["used"] + plan.CLOSE_SECONDS
    missed = []  # targets, not limits: reported, the verdict stands on the limits
    if first["back_at"] > plan.CALL1_DEADLINE and not args.fallback_start:
        missed.append(f"call 1 back at {first['back_at']:.0f} s (target "
                      f"{plan.CALL1_DEADLINE:.0f}, start included)")
    if first["gpu_seconds"] > plan.CALL1_WALL:
        missed.append(f"call 1's set-up and rows: {first['gpu_seconds']:.0f} s (target "
                      f"{plan.CALL1_WALL:.0f})")
    if total > plan.LEASE_SECONDS:
        problems.append(f"lease: {total:.0f} s (at most {plan.LEASE_SECONDS:.0f})")
    ran = {x["name"]: x for x in rows}
    lease_calls = {r["call"] for r in inside}
    stopped = "dali" in ran or len(inside) < len(results)  # DALI given up by the time rule
    for row in plan.select(plan.plan_rows(), args.rows):
        if row.name not in ran and row.group <= 5:
            problems.append(f"row {row.name} never ran")
        elif row.group == 5 and not stopped and ran[row.name]["call"] not in lease_calls:
            problems.append(f"row {row.name} ran beyond the lease")
    problems += [f"row {x['name']} failed: {x.get('reason', '')[:200]}" for x in rows
                 if x["status"] == "failed"]
    problems += layout_problems(ran, fate, site)
    return {"start_seconds": start, "call1_back_at": first["back_at"],
            "call1_seconds": first["gpu_seconds"], "total_gpu_seconds": round(total, 1),
            "dali": ("given up by the lease's time rule (rehearsed beyond it)" if stopped
                     else "ran within the lease" if "install-dali" in ran else "not carried"),
            "wheels": fate, "missed": missed, "problems": problems, "ok": not problems}


def layout_problems(ran: dict, fate: dict, site: str) -> list[str]:
    """What the install got wrong: a wheel installable here missing from ``site`` after the
    calls that carried it, or nvImageCodec and DALI imported from anywhere but ``site``."""
    from ..machine.install import installed_in

    there, problems = installed_in(site), []
    for wheel in fate["installed"]:  # call 1's wheels/, and DALI's once its calls came
        if dist_name(wheel) not in there and ("install-dali" in ran
                                              or wheel.startswith("wheels/")):
            problems.append(f"install: {wheel} not installed into {site}")
    for row, key, wheel in (("environment", "nvimgcodec_file", "nvidia_nvimgcodec"),
                            ("environment-dali", "dali_file", "nvidia_dali")):
        path = ((ran.get(row) or {}).get("machine") or {}).get(key)
        if row in ran and wheel in " ".join(fate["installed"]) and not (path or "").startswith(
                site):
            problems.append(f"{row}: {key[:-5]} imported from {path}, not {site}")
    libraries = (ran.get("dali-gpu-decode") or {}).get("libraries") or []
    if "dali-gpu-decode" in ran and not any("libnvimgcodec" in p and p.startswith(site)
                                            for p in libraries):
        problems.append(f"dali-gpu-decode: DALI mapped no libnvimgcodec from {site}")
    problems += [f"wheel {c['wheel']}: {c['problem']}" for c in fate["checked"] if c["problem"]]
    return problems


def summary_lines(results: list[dict], summary: dict, root: str) -> list[str]:
    lines = ["gpu-rehearse: call | MiB sent | --lease-left | seconds here | H100 s: gap + "
             "upload + command = back at | $OUT files | then"]
    for r in results:
        left = "-" if r["lease_left"] is None else f"{r['lease_left']:.0f}"
        lines.append(f"  {r['call']} | {r['bytes'] / 2**20:.1f} | {left} | {r['seconds']:.0f} | "
                     f"{r['gap_seconds']:.0f} + {r['upload_seconds']:.0f} + "
                     f"{r['gpu_seconds']:.0f} = {r['back_at']:.0f} | "
                     f"{len(r['out_check']['files'])} | {r.get('lead', 'give_back')}"
                     + (" | beyond the lease" if r["beyond_lease"] else ""))
    w = summary["wheels"]
    lines.append(f"gpu-rehearse: install: {len(w['installed'])} wheels into a clean --target "
                 f"with this environment's copies hidden, {len(w['visible'])} left to the "
                 f"machine's own, {len(w['checked'])} checked by name and tag")
    lines.append(f"gpu-rehearse: start {summary['start_seconds']:.0f} s; call 1 back at "
                 f"{summary['call1_back_at']:.0f} s (target {plan.CALL1_DEADLINE:.0f}), its "
                 f"set-up and rows {summary['call1_seconds']:.0f} s (target "
                 f"{plan.CALL1_WALL:.0f}); DALI: {summary['dali']}; the lease ends at "
                 f"{summary['total_gpu_seconds']:.0f} s with {plan.CLOSE_SECONDS:.0f} s of "
                 f"closing idle (at most {plan.LEASE_SECONDS:.0f})")
    lines += [f"gpu-rehearse: TARGET MISSED: {p}" for p in summary["missed"]]
    lines += [f"gpu-rehearse: PROBLEM: {p}" for p in summary["problems"]]
    lines.append(f"gpu-rehearse: {'the plan fits' if summary['ok'] else 'the plan does NOT fit'}"
                 f"; details in {os.path.join(root, 'rehearsal.json')}, each call's archive "
                 f"in {root}/out-N")
    return lines
