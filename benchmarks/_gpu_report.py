"""Reading main.py's outputs and writing ``report.json`` / ``report.md`` for ``gpu_check.py``.

Speeds are images/s, times seconds, memory bytes (GiB in report.md); ratios are plain
fractions in JSON and percentages in report.md. Nothing here runs a command.
"""
from __future__ import annotations

import json
import math
import os
import re

STEADY, FALLBACK = "steady_images_per_sec", "train_images_per_sec"
SECTION_ORDER = ("environment", "setup", "pytest", "training", "compile", "loaders", "nccl",
                 "resolution", "internal")
STATUSES = ("passed", "failed", "timed out", "skipped")
_PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)")


def read_metrics(rundir: str) -> list[dict]:
    """The records of ``RUNDIR/metrics.jsonl``; [] if it is missing (unparsable lines skipped)."""
    try:
        with open(os.path.join(rundir, "metrics.jsonl")) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return [r for r in records if isinstance(r, dict)]


def read_speed(rundir: str) -> dict:
    """Training images/s of the run's last epoch record: ``images_per_sec`` is main.py's
    ``steady_images_per_sec`` (after ``--benchmark-warmup`` steps, summed over ranks) or, when
    that is missing or null, ``train_images_per_sec`` with ``includes_warmup`` True;
    ``speed_key`` names the key used. Also ``data_time_fraction``, ``epoch_seconds``,
    ``val_acc1`` and ``train_loss``. Raises ValueError when metrics.jsonl has no usable record,
    or when its training loss is not finite (diverged weights train at full speed too)."""
    records = [r for r in read_metrics(rundir) if r.get(FALLBACK) is not None]
    if not records:
        raise ValueError("no epoch record with images/s in metrics.jsonl")
    last = records[-1]
    key = STEADY if last.get(STEADY) is not None else FALLBACK
    loss = last.get("train_loss")
    if loss is not None and not math.isfinite(loss):
        raise ValueError(f"train loss {loss}: the weights diverged")
    return {"images_per_sec": last[key], "speed_key": key, "includes_warmup": key == FALLBACK,
            "data_time_fraction": last.get("data_time_fraction"),
            "epoch_seconds": last.get("epoch_seconds"), "val_acc1": last.get("val_acc1"),
            "train_loss": loss}


def last_json(text: str) -> dict | None:
    """The last line of ``text`` that is a JSON object, or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


def parse_pytest(text: str) -> dict:
    """``counts`` (passed, failed, skipped, deselected, error, ...) from pytest's final summary
    line, ``failed_tests`` (node ids of FAILED/ERROR lines) and ``summary_line``."""
    summary = next((line.strip(" =") for line in reversed(text.splitlines())
                    if _PYTEST_COUNT.search(line) and re.search(r"\bin [\d.]+s", line)), "")
    counts = dict.fromkeys(("passed", "failed", "skipped", "error"), 0) if summary else {}
    counts.update({("error" if word.startswith("error") else word): int(n)
                   for n, word in _PYTEST_COUNT.findall(summary)})
    failed = [m.group(2) for m in re.finditer(r"^(FAILED|ERROR) (\S+)", text, re.M)]
    return {"counts": counts, "failed_tests": failed, "summary_line": summary}


def ratio(row: dict | None, base: dict | None) -> float | None:
    """``row``'s images/s over ``base``'s (both passed), to 3 decimals; else None."""
    if not row or not base or row.get("status") != "passed" or base.get("status") != "passed":
        return None
    if not row.get("images_per_sec") or not base.get("images_per_sec"):
        return None
    return round(row["images_per_sec"] / base["images_per_sec"], 3)


def find(rows: list[dict], model: str, loader: str, compiled: bool = False) -> dict | None:
    return next((r for r in rows if r.get("model") == model and r.get("loader") == loader
                 and r.get("compile", False) == compiled), None)


def real_loader_rows(rows: list[dict], model: str) -> list[dict]:
    """The passed real (not synthetic) loader rows of ``model`` without --compile."""
    return [r for r in rows if r.get("model") == model and r.get("loader") != "synthetic"
            and not r.get("compile") and r.get("status") == "passed" and r.get("images_per_sec")]


def best_loader(rows: list[dict], model: str) -> dict | None:
    """The fastest passed real (not synthetic) loader row of ``model`` without --compile."""
    return max(real_loader_rows(rows, model), key=lambda r: r["images_per_sec"], default=None)


def target(rows: list[dict], model: str, min_ratio: float, dry_run: bool,
           loader_rows: list[dict] | None = None) -> dict:
    """Whether ``model``'s best loader reaches ``min_ratio`` of synthetic (``met``: None when
    not measured or in a dry run, whose CPU figures say nothing about a GPU).

    A loader's share is its training row's, capped by its ``--benchmark-data`` images/s over
    synthetic training's where ``loader_rows`` has it: the timed steps start with up to
    workers x 4 batches the DataLoader queued during start-up, so a loader slower than the
    GPU can look as fast (the first H100 run: folder 99% of synthetic in training, 62% alone)."""
    synthetic = find(rows, model, "synthetic")
    alone_rows = {x["name"]: x for x in loader_rows or []}  # loader-NAME: main.py's own -j
    shares = []
    for row in real_loader_rows(rows, model):
        if not row.get("ratio_to_synthetic"):
            continue
        alone_share = ratio(alone_rows.get(f"loader-{row['loader']}"), synthetic)
        shares.append((min(row["ratio_to_synthetic"], alone_share or float("inf")),
                       row["loader"], alone_share))
    share, loader, alone_share = max(shares, default=(None, None, None))
    result = {"model": model, "min_ratio": min_ratio, "best_loader": loader,
              "best_ratio": share, "loader_only_ratio": alone_share,
              "met": None if share is None or dry_run else share >= min_ratio}
    if dry_run:
        result["note"] = "not judged in a dry run (CPU)"
    elif share is not None and alone_share is None:
        result["note"] = "training rows only (no loader-only figure to cap them)"
    return result


def settings_of(s) -> dict:
    return {"batch_size": s.batch, "warmup_steps": s.warmup, "timed_steps": s.steps,
            "workers": s.workers, "models": s.models, "sections": sorted(s.only),
            "extra_flags": s.sizes + s.accel}


def rows_of(report: dict):
    for name in SECTION_ORDER:
        yield from report["sections"].get(name, [])


def not_proven(report: dict) -> list[dict]:
    """``{"name", "reason"}`` of each check that proves nothing: skipped (not installed, not
    available, time budget), timed out, or passed with GPU tests that pytest skipped."""
    out = []
    for row in rows_of(report):
        skipped_tests = (row.get("counts") or {}).get("skipped")
        if row["status"] in ("skipped", "timed out"):
            out.append({"name": row["name"], "reason": status_of(row)})
        elif row["status"] == "passed" and skipped_tests:
            out.append({"name": row["name"], "reason": f"{skipped_tests} GPU tests skipped"})
    return out


def finish(report: dict, seconds: float) -> dict:
    """Add ``seconds`` (the whole check), ``summary`` (counts per status, ``timed_out`` for
    "timed out", and ``not_proven``) and ``not_proven`` (the rows, see :func:`not_proven`)."""
    statuses = [row["status"] for row in rows_of(report)]
    report["seconds"] = round(seconds, 1)
    report["not_proven"] = not_proven(report)
    report["summary"] = {k.replace(" ", "_"): statuses.count(k) for k in STATUSES}
    report["summary"]["not_proven"] = len(report["not_proven"])
    return report


def exit_status(report: dict) -> int:
    """1 when a check failed; else 3 when one is not proven on a GPU (never in a dry run,
    which checks this script on the CPU); else 0."""
    if report["summary"]["failed"]:
        return 1
    return 3 if report["summary"]["not_proven"] and not report["dry_run"] else 0


def counts_text(c: dict) -> str:
    return (f"{c['passed']} checks passed, {c['failed']} failed, {c['timed_out']} timed out, "
            f"{c['skipped']} not run")


def proof_text(report: dict) -> str:
    """One line: whether the run proves the GPU path, and what it leaves unproven."""
    missing = report.get("not_proven") or []
    names = ", ".join(f"{x['name']} ({x['reason']})" for x in missing[:6]) + (
        f", and {len(missing) - 6} more" if len(missing) > 6 else "")
    if report["dry_run"]:
        return "dry run on the CPU: checks this script, proves nothing about a GPU"
    if report["summary"]["failed"]:
        return "GPU path NOT proven: a check failed" + (f"; also not run: {names}" if names else "")
    if missing:
        return f"GPU path NOT proven: {len(missing)} checks skipped or timed out: {names}"
    return "GPU path proven: every check ran and passed"


def summary_text(report: dict, out: str) -> str:
    c, t = report["summary"], report.get("target") or {}
    line = (f"gpu-check: {counts_text(c)} in {report['seconds']:.0f} s; "
            f"report: {os.path.join(out, 'report.md')}\n{proof_text(report)}")
    return line + ("\n" + target_text(t) if t else "")


def target_text(t: dict) -> str:
    verdict = {True: "met", False: "NOT met", None: t.get("note", "not measured")}[t.get("met")]
    best = f" (best: {t['best_loader']} at {pct(t['best_ratio'])})" if t.get("best_loader") else ""
    return (f"target: {t['model']} best loader >= {pct(t['min_ratio'])} of synthetic: "
            f"{verdict}{best}")


def progress_line(elapsed: float, row: dict) -> str:
    what = row["name"]
    detail = row.get("reason", "")
    if row.get("images_per_sec"):
        detail = f"{row['images_per_sec']:.1f} images/s" + (
            f", {pct(row['ratio_to_synthetic'])} of synthetic"
            if row.get("ratio_to_synthetic") is not None else "")
    return f"[{elapsed:5.0f} s] {what}: {row['status']}" + (f" ({detail})" if detail else "")


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def num(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def write(out: str, report: dict) -> None:
    """Write ``OUT/report.json`` and ``OUT/report.md``."""
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(markdown(report))


def markdown(report: dict) -> str:
    parts = [header_md(report), environment_md(report), pytest_md(report), training_md(report),
             loaders_md(report), nccl_md(report), resolution_md(report), setup_md(report),
             not_proven_md(report), failures_md(report), commands_md(report)]
    return "\n\n".join(p for p in parts if p) + "\n"


def machine_line(m: dict) -> str:
    if not m:
        return "unknown (the environment probe failed)"
    gpus = ", ".join(f"{g['name']} ({g['memory_bytes'] / 2**30:.1f} GiB)" for g in m["gpus"])
    gpus = f"{len(m['gpus'])}x {gpus}, driver {m.get('driver') or '-'}, CUDA {m['cuda']}" \
        if m["gpus"] else "no GPU"
    return (f"{gpus}; torch {m['torch']}, torchvision {m['torchvision']}, DALI "
            f"{m.get('dali') or 'not installed'}; {m['cpu_cores']} CPU cores; "
            f"Python {m['python']}")


def header_md(r: dict) -> str:
    s, c = r["settings"], r["summary"]
    lines = [f"# GPU check{' (dry run on CPU)' if r['dry_run'] else ''}", "",
             f"- Machine: {machine_line(r.get('machine') or {})}",
             f"- Run: {r['started']}, {r['seconds']:.0f} s (budget {r['budget_seconds']:.0f} s)",
             f"- Settings: -b {s['batch_size']}, {s['warmup_steps']} warm-up + "
             f"{s['timed_steps']} timed steps, -j {s['workers']}"
             + (f", {' '.join(s['extra_flags'])}" if s["extra_flags"] else ""),
             f"- Result: {counts_text(c)}", f"- {proof_text(r)}"]
    if r.get("target"):
        lines.append(f"- {target_text(r['target'])}")
    return "\n".join(lines)


def table(head: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def status_of(row: dict) -> str:
    return row["status"] + (f": {row['reason']}" if row.get("reason") else "")


def environment_md(r: dict) -> str:
    m = r.get("machine") or {}
    keys = [("GPUs", "; ".join(f"{g['name']}, {g['memory_bytes'] / 2**30:.1f} GiB"
                               for g in m.get("gpus", [])) or "none"),
            ("driver", m.get("driver") or "- (no nvidia-smi)"),
            ("CUDA driver API", m.get("cuda_driver_api")), ("CUDA (torch)", m.get("cuda")),
            ("cuDNN", m.get("cudnn")), ("torch", m.get("torch")),
            ("torchvision", m.get("torchvision")), ("DALI", m.get("dali") or "not installed"),
            ("lmdb", m.get("lmdb") or "not installed"),
            ("pytest", m.get("pytest") or "not installed"), ("CPU cores", m.get("cpu_cores")),
            ("Python", m.get("python")), ("platform", m.get("platform"))]
    rows = r["sections"].get("environment", [])
    return "## 1. Environment\n\n" + table(["", ""], [[k, "-" if v is None else v]
                                                     for k, v in keys]) + \
        "".join(f"\n\nProbe: {status_of(row)}" for row in rows if row["status"] != "passed")


def pytest_md(r: dict) -> str:
    rows = r["sections"].get("pytest")
    if not rows:
        return ""
    parts = ["## 2. GPU tests (`pytest -m gpu`, one run per file)"]
    for p in rows:
        text = f"- {p['name']}: {status_of(p)}"
        if p.get("summary_line"):
            text += f"; pytest said: `{p['summary_line']}`"
        parts.append(text + "".join(f"\n  - failing: `{t}`" for t in p.get("failed_tests", [])))
    return "\n\n".join(parts[:1]) + "\n\n" + "\n".join(parts[1:])


def not_proven_md(r: dict) -> str:
    rows = r.get("not_proven")
    if not rows:
        return ""
    head = ("## Not proven on a GPU" + (" (dry run: nothing is)" if r["dry_run"] else "")
            + "\n\nSkipped or timed out; a passed row elsewhere proves nothing for these:\n\n")
    return head + "\n".join(f"- {x['name']}: {x['reason']}" for x in rows)


def loader_alone_share(r: dict, row: dict) -> float | None:
    """A real loader's training row's bound: its section-4 row (``loader-LOADER``, main.py's
    own ``-j``) over the images/s of the row model's synthetic training; None for synthetic
    data, ``--compile`` rows or where either figure is missing."""
    if row.get("loader") in (None, "synthetic") or row.get("compile"):
        return None
    alone = {x.get("name"): x for x in r["sections"].get("loaders", [])}
    synthetic = find(r["sections"].get("training", []), row.get("model"), "synthetic")
    return ratio(alone.get(f"loader-{row['loader']}"), synthetic)


def training_md(r: dict) -> str:
    rows = r["sections"].get("training", []) + [
        x for x in r["sections"].get("compile", []) if x.get("model")]
    if not rows and not r["sections"].get("compile"):
        return ""
    alone = [loader_alone_share(r, x) for x in rows]
    body = [[x["model"], x["loader"], "yes" if x.get("compile") else "",
             num(x.get("images_per_sec")) + ("*" if x.get("includes_warmup") else ""),
             pct(x.get("ratio_to_synthetic")), pct(share), pct(x.get("speedup")),
             pct(x.get("data_time_fraction")), status_of(x)] for x, share in zip(rows, alone)]
    text = ("## 3. Training images/s through main.py\n\n"
            + table(["model", "loader", "--compile", "images/s", "vs synthetic",
                     "loader alone vs synthetic", "vs without --compile", "data wait",
                     "status"], body))
    if any(share is not None for share in alone):
        text += ("\n\nA training row's timed steps begin with the batches its loader queued "
                 "while the model was set up (up to workers x 4), so a loader slower than the "
                 "GPU can show near 100% of synthetic there; the same loader alone "
                 "(section 4) bounds its steady share.")
    if any(x.get("includes_warmup") for x in rows):
        text += (f"\n\n\\* includes warm-up: main.py wrote no `{STEADY}`, so this is "
                 f"`{FALLBACK}` over the whole epoch")
    for x in r["sections"].get("compile", []):
        if not x.get("model"):
            text += f"\n\n--compile: {status_of(x)}"
    return text


def resolution_md(r: dict) -> str:
    rows = r["sections"].get("resolution")
    if not rows:
        return ""
    body = [[x["model"], x["loader"], x.get("res"), num(x.get("images_per_sec")),
             pct(x.get("speedup")), pct(x.get("data_time_fraction")), status_of(x)] for x in rows]
    return ("## 6. Progressive resizing: training at a low resolution vs 224 px\n\n"
            + table(["model", "loader", "px", "images/s", "vs 224 px", "data wait", "status"],
                    body))


def loaders_md(r: dict) -> str:
    rows = r["sections"].get("loaders")
    if not rows:
        return ""
    synthetic = find(r["sections"].get("training", []), r["settings"]["models"][0], "synthetic")
    body = [[x["loader"], num(x.get("images_per_sec")), x.get("workers", "-"),
             pct(ratio(x, synthetic)), status_of(x)] for x in rows]
    return ("## 4. Loader-only images/s (`main.py --benchmark-data`)\n\n"
            + table(["loader", "images/s", "workers", f"vs {r['settings']['models'][0]} "
                     "synthetic training", "status"], body))


def nccl_md(r: dict) -> str:
    rows = r["sections"].get("nccl")
    if not rows:
        return ""
    x = rows[0]
    text = "## 5. Distributed (`--multiprocessing-distributed`)\n\n" + table(
        ["world size", "backend", "process group", "val top-1", "seconds", "status"],
        [[x.get("world_size", "-"), x.get("backend", "-"),
          "joined" if x.get("process_group") else "-", num(x.get("val_acc1")),
          num(x.get("seconds")), status_of(x)]])
    return text + (f"\n\n{x['note']}" if x.get("note") else "")


def setup_md(r: dict) -> str:
    rows = r["sections"].get("setup")
    if not rows:
        return ""
    detail = {"replicate": lambda x: f"{x['sample_images']} images linked {x['copies']}x "
                                     f"= {x['images']:,} training images"}
    return "## Setup\n\n" + table(["step", "status", "detail"], [
        [x["name"], status_of(x), detail.get(x["name"], lambda x: num(x.get("seconds")) + " s"
                                             if x.get("seconds") else "")(x)] for x in rows])


def failures_md(r: dict) -> str:
    failed = [x for x in rows_of(r) if x["status"] == "failed"]
    if not failed:
        return ""
    parts = ["## Failures (full output in logs/)"]
    for x in failed:
        tail = "\n".join((x.get("stderr_tail") or x.get("stdout_tail") or "").splitlines()[-8:])
        parts.append(f"### {x['name']}: {x.get('reason', '')}"
                     + (f"\n\n```\n{tail}\n```" if tail.strip() else ""))
    return "\n\n".join(parts)


def commands_md(r: dict) -> str:
    rows = [x for x in rows_of(r) if x.get("command")]
    return "## Commands (run from the repository root)\n\n" + "\n".join(
        f"- {x['name']} ({x['status']}, {num(x.get('seconds'))} s):\n  `{x['command']}`"
        for x in rows)
