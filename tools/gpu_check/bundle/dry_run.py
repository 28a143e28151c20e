"""The offline bundle's steps run here on the CPU backends (``make gpu-dry-run``) as on a host:
a copy of the repository, each step's folder copied in, ``python -m tools.gpu_check --dry-run
--step N`` in order with one state folder. It proves each step's bytes within its size and its
seconds (here, and on an H100 host: :func:`.plan.gpu_seconds`), step 1 with rows 1-4 and no
DALI file, one archive per step, no failed row, every judged share <= 100%."""
import argparse
import json
import os
import shutil
import sys
import tempfile

from ..check import read_json
from ..plan import select
from ..runner import REPO, InputError, Runner
from .steps import folder_bytes, repository_bytes, repository_files

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
    """Every step in order, then a line per step and the problems; returns the exit status."""
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
    runner = Runner(root, cwd=repo)
    results = [run_step(runner, bundle, number, rows) for number in numbers]
    report = read_json(os.path.join(root, "state", "report.json"))
    problems = judge(results, report, rows)
    with open(os.path.join(root, "dry-run.json"), "w") as f:
        json.dump({"steps": results, "problems": problems}, f, indent=1)
    lines = ["gpu-dry-run: step | MiB with the repository (at most) | seconds here | GPU-host "
             "seconds | rows run | archive"]
    lines += [" | ".join((f"  {r['step'] or 'all'}", f"{r['bytes'] / 2**20:.1f} "
                          f"({r['size'] / 2**20:.0f})" if r["size"] else "-",
                          f"{r['seconds']:.0f}", f"{r['gpu_seconds']:.0f}", str(len(r["rows"])),
                          os.path.basename(r["archive"] or "-"))) for r in results]
    lines.append(f"gpu-dry-run: GPU-host seconds in all: "
                 f"{sum(r['gpu_seconds'] for r in results):.0f}")
    lines += [f"gpu-dry-run: PROBLEM: {p}" for p in problems]
    lines.append(f"gpu-dry-run: {'every step holds' if not problems else 'NOT every step holds'}"
                 f"; details in {root}/dry-run.json, the state and archives in {root}/state")
    print("\n".join(lines), flush=True)
    return 1 if problems else 0


def run_step(runner: Runner, bundle: str, number: int | None, rows: list[str] | None) -> dict:
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
        HERE_LIMIT)
    # a row recorded again (a pair's GPU row judged by its CPU row) counts once
    rows_run = read_json(os.path.join(state, "rows.jsonl")) or []
    mine = list({r["name"]: r for r in rows_run if r.get("step") == number}.values())
    archive = os.path.join(state, f"gpu-check-step{number}.tar.gz" if number else
                           "gpu-check.tar.gz")
    return {"step": number, "steps": info.get("steps", 1), "returncode": rec["returncode"],
            "bytes": repository_bytes(REPO) + folder_bytes(src) if number else None,
            "size": info.get("size"), "files": (info.get("files") or [[]])[(number or 1) - 1],
            "seconds": rec["seconds"], "command": rec["command"],
            "gpu_seconds": round(5.0 + sum(r.get("gpu_seconds") or 0 for r in mine), 1),
            "rows": [(r["name"], r["group"], r["status"]) for r in mine],
            "archive": archive if os.path.isfile(archive) else None,
            "logs": [runner.log(rec["name"], stream) for stream in ("out", "err")]}


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
    one = results[0]
    if one["step"] == 1 and one["steps"] > 1:
        problems += [f"step 1 holds a DALI file: {f}" for f in one["files"] if "dali" in f]
        want = {r.name for r in select(rows, dry_run=True)[0]}
        ran = {name for name, group, _ in one["rows"] if group}  # group 0: the set-up
        problems += [f"step 1 ran {name}, not a row of step 1" for name in sorted(ran - want)]
        problems += [f"step 1: row {name} did not run" for name in sorted(want - ran)]
    problems += [f"row {x['name']} failed: {x.get('reason', '')[:200]}"
                 for x in report["rows"] if x["status"] == "failed"]
    return problems + [f"share {name}: judged {x['judged']:.3f} > 100%"
                       for name, x in report["shares"].items() if (x["judged"] or 0) > 1]


if __name__ == "__main__":
    sys.exit(main_cli())
