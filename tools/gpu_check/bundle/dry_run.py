"""The offline bundle's steps run here on the CPU backends (``make gpu-dry-run``) as a user
runs them on a host: a copy of the repository, each step's folder copied in, ``python -m
tools.gpu_check --dry-run --step N`` in order with one state folder. It proves each step's
bytes within its size and its seconds (here, and on an H100 host: :func:`.plan.gpu_seconds`),
step 1 with rows 1-4 and no DALI file, one archive per step, no failed row, every judged share
<= 100%, the wheels installed into a clean prefix with this environment's own copies hidden
(:data:`HIDE`). Exit status 0 when all holds, 1 otherwise, 2 for bad input."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import sysconfig
import tempfile

from ..check import read_json
from ..plan import all_rows, select
from ..runner import REPO, InputError, Runner
from .install import DALI_WHEEL, dist_name, installed_in
from .steps import folder_bytes, repository_bytes, repository_files

# Distributions a GPU host's Python with torch holds already: left visible.
HOST_HAS = {"numpy", "packaging", "pytest", "pluggy", "iniconfig", "pygments",
            "typing_extensions", "six", "wheel", "pyyaml"}
# sitecustomize of the steps' processes: the hidden modules and distributions (for pip too)
# are found nowhere under this environment's site-packages
HIDE = """\
import importlib.abc, importlib.machinery, os, re, sys
_MODULES = tuple(filter(None, os.environ["GPU_CHECK_HIDE_MODULES"].split(",")))
_DISTS = set(os.environ["GPU_CHECK_HIDE_DISTS"].split(","))
_FROM = os.environ["GPU_CHECK_HIDE_FROM"]
def _here(path):
    return os.path.realpath(str(path or ".")).startswith(_FROM)
class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if not any(name == m or name.startswith(m + ".") for m in _MODULES):
            return None
        kept = [p for p in path or sys.path if not _here(p)]
        spec = importlib.machinery.PathFinder.find_spec(name, kept, target)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return spec
_found = importlib.machinery.PathFinder.find_distributions
def _find(*args, **kwargs):
    return (d for d in _found(*args, **kwargs) if not (_here(getattr(d, "_path", None)) and
            re.sub(r"[-_.]+", "_", d.metadata["Name"] or "").lower() in _DISTS))
importlib.machinery.PathFinder.find_distributions = staticmethod(_find)
sys.meta_path.insert(0, _Hide())
"""
HERE_LIMIT = 3600.0  # s of one step here, on shared CPU cores


def main_cli(argv=None) -> int:
    """Every step in order; 0 when all holds, 1 otherwise, 2 for bad input."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", default=os.path.join(REPO, ".gpu-bundle"), help="the bundle")
    p.add_argument("--host", help="the host's folder (kept; default: a temporary one)")
    p.add_argument("--rows", nargs="+", metavar="PATTERN", help="only these rows")
    args = p.parse_args(argv)
    try:
        if not os.path.isdir(args.bundle):
            raise InputError(f"--bundle {args.bundle}: no such directory (make gpu-bundle "
                             "writes it)")
        return dry_run(os.path.abspath(args.bundle), args.host, args.rows)
    except (InputError, OSError) as exc:
        print(f"gpu-dry-run: error: {exc}", file=sys.stderr)
        return 2


def dry_run(bundle: str, host: str | None, rows: list[str] | None) -> int:
    """Every step in order; returns the exit status."""
    steps_dir = os.path.join(bundle, "steps")
    numbers = sorted(int(n) for n in os.listdir(steps_dir) if n.isdigit()) \
        if os.path.isdir(steps_dir) else [None]
    root = os.path.abspath(host) if host else tempfile.mkdtemp(prefix="gpu-dry-run-")
    repo = os.path.join(root, "repo")  # the repository's files, as a copy to the host holds
    shutil.rmtree(repo, ignore_errors=True)
    # .gpu-bundle is never the repository's (a link to it, which git lists, would let the
    # steps' copies below write into the bundle itself)
    for rel in [p for p in repository_files(REPO) if p.split("/")[0] != ".gpu-bundle"]:
        os.makedirs(os.path.dirname(os.path.join(repo, rel)), exist_ok=True)
        shutil.copy2(os.path.join(REPO, rel), os.path.join(repo, rel), follow_symlinks=False)
    env, fate = hide_layer(root, bundle)
    runner = Runner(root)
    runner.cwd = repo
    results = [run_step(runner, bundle, number, rows, env) for number in numbers]
    report = json.load(open(os.path.join(root, "state", "report.json")))
    problems = judge(results, report, rows) + install_problems(report, fate, os.path.join(
        root, "state", "site"))
    with open(os.path.join(root, "dry-run.json"), "w") as f:
        json.dump({"steps": results, "problems": problems, "wheels": fate}, f, indent=1)
    print("\n".join(summary_lines(results, problems, fate, root)), flush=True)
    return 1 if problems else 0


def run_step(runner: Runner, bundle: str, number: int | None, rows: list[str] | None,
             env: dict) -> dict:
    """Copy step ``number`` (None: the whole bundle) into the host's repository
    (``runner.cwd``) and run it; its bytes, seconds and rows."""
    src = os.path.join(bundle, "steps", str(number)) if number else bundle
    dst = os.path.join(runner.cwd, ".gpu-bundle", *(["steps", str(number)] if number else []))
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns("steps"))
    info = json.load(open(os.path.join(src, "STEP.json"))) if number else {}
    state = os.path.join(os.path.dirname(runner.logs), "state")
    rec = runner.run(f"step-{number or 'all'}", [
        sys.executable, "-m", "tools.gpu_check", "--dry-run", "--out", state,
        *(["--step", str(number)] if number else []), *(["--rows", *rows] if rows else [])],
        HERE_LIMIT, env)
    # a row recorded again (a pair's GPU row judged by its CPU row) counts once
    mine = list({r["name"]: r for r in read_json(os.path.join(state, "rows.jsonl"), lines=True)
                 if r.get("step") == number}.values())
    archive = os.path.join(state, f"gpu-check-step{number}.tar.gz" if number else
                           "gpu-check.tar.gz")
    return {"step": number, "steps": info.get("steps", 1), "returncode": rec["returncode"],
            "bytes": repository_bytes(REPO) + folder_bytes(src) if number else None,
            "size": info.get("size"), "files": (info.get("files") or [[]])[(number or 1) - 1],
            "seconds": rec["seconds"],
            "gpu_seconds": round(5.0 + sum(r.get("gpu_seconds") or 0 for r in mine), 1),
            "rows": [(r["name"], r["group"], r["status"]) for r in mine],
            "archive": archive if os.path.isfile(archive) else None,
            "logs": [runner.log(rec["name"], stream) for stream in ("out", "err")],
            "command": rec["command"]}


def judge(results: list[dict], report: dict, rows: list[str] | None) -> list[str]:
    """What does not hold: sizes, step 1's rows and files, archives, exit statuses, failed
    rows, judged shares over 100%."""
    problems = []
    for r in results:
        where = f"step {r['step'] or 'all'}"
        if r["size"] and r["bytes"] > r["size"]:
            problems.append(f"{where}: {r['bytes'] / 2**20:.1f} MiB with the repository (at "
                            f"most {r['size'] / 2**20:.1f})")
        if r["returncode"] not in (0, 1):  # 1: a failed row, named below
            problems.append(f"{where}: exit status {r['returncode']} ({', '.join(r['logs'])})")
        if not r["archive"]:
            problems.append(f"{where}: no archive")
    first = results[0]
    if first["step"] == 1 and first["steps"] > 1:
        problems += [f"step 1 holds a DALI file: {f}" for f in first["files"] if "dali" in f]
        problems += [f"step 1 ran {name} (group {group})" for name, group, _ in first["rows"]
                     if group > 4]
        ran = {name for name, _, _ in first["rows"]}
        problems += [f"step 1: row {r.name} of group {r.group} did not run" for r in
                     select(all_rows(), rows) if r.group <= 4 and not r.gpu_only
                     and r.name not in ran]
    problems += [f"row {x['name']} failed: {x.get('reason', '')[:200]}"
                 for x in report["rows"] if x["status"] == "failed"]
    return problems + [f"share {name}: judged {x['judged']:.3f} > 100%"
                       for name, x in report["shares"].items() if (x["judged"] or 0) > 1]


def hide_layer(root: str, bundle: str) -> tuple[dict, dict]:
    """The steps' environment (:data:`HIDE` hiding this environment's copies of what the
    bundle installs) and the wheels by fate: ``installed`` here, ``visible``
    (:data:`HOST_HAS`), ``checked`` (another interpreter's: name and tag, any ``problem``)."""
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename

    here, fate = set(sys_tags()), {"installed": [], "visible": [], "checked": []}
    for name in [os.path.join(d, n) for d in ("wheels", "wheels-dali") if os.path.isdir(
            os.path.join(bundle, d)) for n in sorted(os.listdir(os.path.join(bundle, d)))
            if n.endswith(".whl")]:
        tags = parse_wheel_filename(os.path.basename(name))[3]
        if dist_name(name) in HOST_HAS or tags & here:
            fate["visible" if dist_name(name) in HOST_HAS else "installed"].append(name)
        else:
            fate["checked"].append({"wheel": name, "problem": next(
                (None for t in tags if t.interpreter.startswith(("cp3", "py3")) and
                 t.platform.startswith("manylinux") and t.platform.endswith("x86_64")),
                "not a CPython manylinux x86_64 wheel")})
    os.makedirs(os.path.join(root, "hide"), exist_ok=True)
    with open(os.path.join(root, "hide", "sitecustomize.py"), "w") as f:
        f.write(HIDE)
    # DALI's module is hidden until the install (step 1 runs without it); the others' copies
    # here come after the install's prefix on the path
    dali = any(DALI_WHEEL.match(dist_name(w)) for w in fate["installed"])
    return {"PYTHONPATH": os.path.join(root, "hide"), "GPU_CHECK_HIDE_MODULES": "nvidia.dali"
            if dali else "",
            "GPU_CHECK_HIDE_DISTS": ",".join(sorted(map(dist_name, fate["installed"]))),
            "GPU_CHECK_HIDE_FROM": os.path.realpath(sysconfig.get_paths()["purelib"])}, fate


def install_problems(report: dict, fate: dict, site: str) -> list[str]:
    """What the install got wrong: a wheel installable here missing from ``site``, or
    nvImageCodec and DALI imported, or DALI's libnvimgcodec mapped, from anywhere else."""
    ran, there, problems = {x["name"]: x for x in report["rows"]}, installed_in(site), []
    installed = " ".join(fate["installed"])
    problems += [f"install: {wheel} not installed into {site}" for wheel in fate["installed"]
                 if dist_name(wheel) not in there and ("install-dali" in ran or
                                                       wheel.startswith("wheels/"))]
    for row, key, wheel in (("environment", "nvimgcodec_file", "nvidia_nvimgcodec"),
                            ("environment-dali", "dali_file", "nvidia_dali")):
        path = ((ran.get(row) or {}).get("machine") or {}).get(key)
        if row in ran and wheel in installed and not (path or "").startswith(site):
            problems.append(f"{row}: {key[:-5]} imported from {path}, not {site}")
    libraries = (ran.get("dali-gpu-decode") or {}).get("libraries") or []
    if "nvidia_dali" in installed and "dali-gpu-decode" in ran and not any(
            "libnvimgcodec" in p and p.startswith(site) for p in libraries):
        problems.append(f"dali-gpu-decode: DALI mapped no libnvimgcodec from {site}")
    return problems + [f"wheel {c['wheel']}: {c['problem']}" for c in fate["checked"]
                       if c["problem"]]


def summary_lines(results: list[dict], problems: list[str], fate: dict, root: str) -> list[str]:
    lines = ["gpu-dry-run: step | MiB with the repository (at most) | seconds here | GPU-host "
             "seconds | rows run | archive"]
    lines += [" | ".join((f"  {r['step'] or 'all'}", f"{r['bytes'] / 2**20:.1f} "
                          f"({r['size'] / 2**20:.0f})" if r["size"] else "-",
                          f"{r['seconds']:.0f}", f"{r['gpu_seconds']:.0f}", str(len(r["rows"])),
                          os.path.basename(r["archive"] or "-"))) for r in results]
    lines.append(f"gpu-dry-run: install: {len(fate['installed'])} wheels by pip into a clean "
                 f"prefix with this environment's copies hidden, {len(fate['visible'])} left "
                 f"to the host's own, {len(fate['checked'])} checked by name and tag; GPU-host "
                 f"seconds in all: {sum(r['gpu_seconds'] for r in results):.0f}")
    lines += [f"gpu-dry-run: PROBLEM: {p}" for p in problems]
    lines.append(f"gpu-dry-run: {'every step holds' if not problems else 'NOT every step holds'}"
                 f"; details in {root}/dry-run.json, the state and archives in {root}/state")
    return lines


if __name__ == "__main__":
    sys.exit(main_cli())
