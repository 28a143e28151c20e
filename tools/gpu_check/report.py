"""The check's one report: the rows judged (shares of synthetic, the targets, what is not
proven, the exit status), ``report.json`` and ``report.md``, archived with the logs after
every row. Speeds are images/s; ratios are fractions."""
import glob
import json
import os
import tarfile
import time

STATUSES = ("passed", "failed", "timed out", "skipped")
# The targets: ResNet-50's best loader (and each loader's share) at >= 95% of synthetic, the
# share capped by the loader alone; --decode-device cuda alone >= 10,000 images/s with 4
# workers, DALI reading the LMDB alone >= 15,000.
TARGET_SHARE = 0.95
LOADER_TARGETS = {"loader-gpudecode-j4": 10000.0, "loader-gpudecode-j4-160px": 10000.0,
                  "loader-dali-lmdb": 15000.0, "loader-dali-lmdb-160px": 15000.0}
LOG_BYTES = 1 << 20  # of each log in the archive: its last MiB


def ratio(row: dict | None, base: dict | None) -> float | None:
    """``row``'s images/s over ``base``'s (both passed), to 3 decimals; else None."""
    if all(x and x.get("status") == "passed" and x.get("images_per_sec") for x in (row, base)):
        return round(row["images_per_sec"] / base["images_per_sec"], 3)
    return None


def judged(rec: dict, bound: str | None, done: dict, dry_run: bool = False) -> dict:
    """A passed training ``rec`` with its ``speedup`` (``--compile`` over eager, 160 over 224
    px) and share of synthetic (of the loader alone: ``bound``): ``ratio_to_synthetic`` and
    ``share_spread`` (the larger step spread); failed when a real loader's share exceeds 1 by
    more than it: data-fed training cannot beat synthetic (it timed a queue filled before the
    clock). Dry: only a ``note``. ``done``: the records by name."""
    if rec.get("status") != "passed" or not rec.get("model"):
        return rec
    name, px = rec["name"], "-160px" if rec.get("res") else ""
    if rec.get("compile"):  # over eager; a loader's also a share of compiled synthetic
        rec.setdefault("speedup", ratio(rec, done.get(name.replace("-compile", ""))))
        if rec.get("loader") != "synthetic":
            rec["ratio_to_synthetic"] = ratio(rec, done.get(
                f"train-{rec['model']}-synthetic-compile"))
    elif rec.get("loader") != "synthetic":
        rec.setdefault("base", f"train-{rec['model']}-synthetic{px}")
        rec.update({"bound": bound} if bound else {})
        synthetic = done.get(rec["base"]) or {}
        rec["ratio_to_synthetic"] = share = ratio(rec, synthetic)
        spread = max(rec.get("spread") or 0.0, synthetic.get("spread") or 0.0)
        rec.update({"share_spread": spread} if share is not None else {})
        why = f"{pct(share)} of synthetic, beyond the steps' spread of {pct(spread)}: not a " \
              "steady-state figure"
        if share is not None and share > 1 + spread:
            rec = {**rec, "note": why + " (dry run: not judged)"} if dry_run else {
                **rec, "status": "failed", "reason": why}
    if px and name[:-len(px)] in done:
        rec["speedup"] = ratio(rec, done.get(name[:-len(px)]))
    return rec


def share_of(by: dict, row: dict) -> dict:
    """A training ``row``'s share of its ``base`` (synthetic) row among ``by`` name: ``raw``,
    ``alone`` (of its ``bound``, the loader alone) and ``judged``: the raw share capped by the
    loader alone's (where known) and by 1."""
    base = by.get(row.get("base"))
    raw, alone = ratio(row, base), ratio(by.get(row.get("bound")), base)
    return {"raw": raw, "alone": alone, "judged": None if raw is None else min(
        raw, 1.0, raw if alone is None else alone)}


def best_loader(rows: list[dict], model: str) -> dict | None:
    """``model``'s fastest passed real-data training row at 224 px without ``--compile``."""
    real = [r for r in rows if r.get("model") == model and r.get("loader") not in
            (None, "synthetic") and not r.get("compile") and r.get("res") is None
            and r.get("status") == "passed" and r.get("images_per_sec")]
    return max(real, key=lambda r: r["images_per_sec"], default=None)


def target(shares: dict, model: str, dry_run: bool) -> dict:
    """Whether ``model``'s best loader at 224 px reaches :data:`TARGET_SHARE` of synthetic
    (``met``: None when not measured or in a dry run), judged by :func:`share_of` (``shares``
    by row): whatever a warm-up leaves queued, the loader alone bounds what it can feed."""
    head = f"train-{model}-"
    share, loader, alone = max([(x["judged"], name[len(head):], x["alone"]) for name, x in
                                shares.items() if name.startswith(head) and x["judged"]
                                and not name.endswith("-160px")], default=(None, None, None))
    result = {"model": model, "min_ratio": TARGET_SHARE, "best_loader": loader,
              "best_ratio": share, "loader_only_ratio": alone,
              "met": None if share is None or dry_run else share >= TARGET_SHARE}
    if dry_run:
        result["note"] = "not judged in a dry run (CPU)"
    elif share is not None and alone is None:
        result["note"] = "training rows only (no loader-only figure to cap them)"
    return result


def not_proven(rows: list[dict]) -> list[dict]:
    """``{"name", "reason"}`` of each row skipped, timed out, or passed with GPU tests that
    pytest skipped."""
    return [{"name": row["name"], "reason": status_of(row) if row["status"] != "passed" else
             f"{row['counts']['skipped']} GPU tests skipped"} for row in rows
            if row["status"] in ("skipped", "timed out") or row["status"] == "passed"
            and (row.get("counts") or {}).get("skipped")]


def exit_status(report: dict) -> int:
    """1 when a row failed; else 3 when one is not proven on a GPU (not in a dry run); else 0."""
    if report["summary"]["failed"]:
        return 1
    return 3 if report["summary"]["not_proven"] and not report["dry_run"] else 0


def machine_of(by: dict) -> dict:
    """The host's facts: the ``environment`` record's, DALI's of ``environment-dali``."""
    return {**(by.get("environment") or {}).get("machine", {}), **{
        k: v for k, v in (by.get("environment-dali") or {}).get("machine", {}).items()
        if k.startswith("dali")}}


def build(s, rows: list[dict], interrupted: bool = False) -> dict:
    """The report of ``rows`` (every record so far, this step's and earlier ones')."""
    by, step = {r["name"]: r for r in rows}, s.step_info
    pending, missing = step and step["step"] < step["steps"], not_proven(rows)
    statuses = [r["status"] for r in rows]
    shares = {r["name"]: {**share_of(by, r), "spread": r.get("share_spread"),
                          "decoder": r.get("decoder"), "status": r["status"]}
              for r in rows if r.get("base") and not r.get("compile")}
    return {
        "tool": "gpu-check", "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "dry_run": s.dry_run, "budget_seconds": s.budget, "interrupted": interrupted,
        "step": step and {k: step.get(k) for k in ("step", "steps", "bundle", "bytes", "size")},
        "settings": {"batch_size": s.batch, "warmup_steps": s.warmup, "timed_steps": s.steps,
                     "workers": s.workers, "rows": s.rows, "extra_flags": s.sizes + s.accel},
        "machine": machine_of(by), "rows": rows,
        "left_out": [r["name"] for r in rows if r.get("left_out")],
        "not_run": [r.name for r in s.later if r.name not in by] if pending else [],
        "gpu_seconds": round(sum(r.get("gpu_seconds") or 0 for r in rows), 1),
        "loaders": {name: {"images_per_sec": by.get(name, {}).get("images_per_sec")
                           if by.get(name, {}).get("status") == "passed" else None,
                           "target": goal} for name, goal in LOADER_TARGETS.items()},
        "shares": shares, "target": target(shares, "resnet50", s.dry_run),
        "not_proven": missing, "summary": {  # timed_out: "timed out"
            **{k.replace(" ", "_"): statuses.count(k) for k in STATUSES},
            "not_proven": len(missing)}}


def write(s, rows: list[dict], archive: str, interrupted: bool = False) -> dict:
    """The report of ``rows`` as ``OUT/report.json`` and ``OUT/report.md``, then ``archive``
    (written beside, renamed): the reports, rows, steps, each log's last :data:`LOG_BYTES` and
    each run's ``metrics.jsonl``. Returns the report."""
    out, report = s.out, build(s, rows, interrupted)
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(markdown(report))
    names = ["rows.jsonl", "report.json", "report.md", "steps.json", *sorted(
        os.path.relpath(p, out) for p in glob.glob(os.path.join(out, "logs", "*"))
        + glob.glob(os.path.join(out, "runs", "*", "metrics.jsonl")))]
    with tarfile.open(archive + ".partial", "w:gz") as tar:
        for name in [n for n in names if os.path.isfile(os.path.join(out, n))]:
            info = tar.gettarinfo(os.path.join(out, name), os.path.join("gpu-check", name))
            with open(os.path.join(out, name), "rb") as f:
                f.seek(max(0, info.size - LOG_BYTES))
                info.size = min(info.size, LOG_BYTES)
                tar.addfile(info, f)
    os.replace(archive + ".partial", archive)
    return report


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def num(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def status_of(row: dict) -> str:
    return row["status"] + (f": {row['reason']}" if row.get("reason") else "")


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
    if report.get("not_run"):
        return f"GPU path NOT proven yet: {len(report['not_run'])} rows wait for later steps"
    return "GPU path proven: every check ran and passed"


def target_text(t: dict) -> str:
    verdict = {True: "met", False: "NOT met", None: t.get("note", "not measured")}[t.get("met")]
    best = f" (best: {t['best_loader']} at {pct(t['best_ratio'])})" if t.get("best_loader") else ""
    return (f"target: {t['model']} best loader >= {pct(t['min_ratio'])} of synthetic: "
            f"{verdict}{best}")


def progress_line(elapsed: float, row: dict) -> str:
    detail = row.get("reason", "")
    if row.get("images_per_sec"):
        detail = f"{row['images_per_sec']:.1f} images/s" + (
            f", {pct(row['ratio_to_synthetic'])} of synthetic"
            if row.get("ratio_to_synthetic") is not None else "")
    return f"[{elapsed:5.0f} s] {row['name']}: {row['status']}" + (f" ({detail})" * bool(detail))


def summary_text(report: dict, archive: str) -> str:
    step = report.get("step")
    where = f"step {step['step']} of {step['steps']}: " if step else ""
    lines = [f"gpu-check: {where}{counts_text(report['summary'])}; report {archive}",
             proof_text(report)]
    if report["left_out"]:
        lines.append(f"left out by the time budget: {', '.join(report['left_out'])}")
    if step and step["step"] < step["steps"]:
        lines.append(f"next: step {step['step'] + 1} (python -m tools.gpu_check --step "
                     f"{step['step'] + 1}, the same --out); DALI's rows run in step "
                     f"{step['steps']}")
    return "\n".join(lines + [target_text(report["target"])])


def table(head: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def markdown(r: dict) -> str:
    failed = [x for x in r["rows"] if x["status"] == "failed"]
    parts = [header_md(r), figures_md(r), rows_md(r), r["left_out"] and (
        "## Left out by the time budget\n\nIn order, each longer than the time left when its "
        "turn came: " + ", ".join(r["left_out"])), r["not_run"] and (
        "## Waiting for the later steps\n\n" + ", ".join(r["not_run"])), r["not_proven"] and (
        "## Not proven on a GPU" + (" (dry run: nothing is)" if r["dry_run"] else "")
        + "\n\nSkipped or timed out; a passed row elsewhere proves nothing for these:\n\n"
        + "\n".join(f"- {x['name']}: {x['reason']}" for x in r["not_proven"])),
        failed and "## Failures (full output in logs/)", *map(failure_md, failed),
        "## Commands (run from the repository root)\n\n" + "\n".join(
            f"- {x['name']} ({x['status']}, {num(x.get('seconds'))} s):\n  `{x['command']}`"
            for x in r["rows"] if x.get("command"))]
    return "\n\n".join(p for p in parts if p) + "\n"


def failure_md(x: dict) -> str:
    tail = "\n".join((x.get("stderr_tail") or x.get("stdout_tail") or "").splitlines()[-8:])
    return f"### {x['name']}: {x.get('reason', '')}" + (f"\n\n```\n{tail}\n```" * bool(
        tail.strip()))


def header_md(r: dict) -> str:
    s, m, step, dry = r["settings"], r.get("machine") or {}, r.get("step"), r["dry_run"]
    gpus = (f"{len(m['gpus'])}x " + ", ".join(f"{g['name']} ({g['memory_bytes'] / 2**30:.1f} "
                                              "GiB)" for g in m["gpus"])) if m.get("gpus") \
        else "no GPU"
    libs = ", ".join(f"{k} {m.get(k) or 'not installed'}" for k in (
        "torch", "torchvision", "dali", "nvimgcodec", "lmdb", "pytest"))
    lines = ["# GPU check" + " (dry run on the CPU: proves this script, not a GPU)" * dry, "",
             f"- Host: {gpus}; driver {m.get('driver') or '-'} "
             f"(CUDA {m.get('cuda_driver_api') or '-'}), CUDA {m.get('cuda') or '-'}, cuDNN "
             f"{m.get('cudnn') or '-'}; {libs}; GPU decoder "
             f"{(m.get('decoder') or {}).get('library') or '-'}; {m.get('cpu_cores', '-')} CPU "
             f"cores; Python {m.get('python', '-')} on {m.get('platform', '-')}",
             f"- Run: {r['started']}" + (f", step {step['step']} of {step['steps']}" if step
                                          else "")
             + (f", time budget {r['budget_seconds']:.0f} s" if r["budget_seconds"] else "")
             + f"; the rows' seconds on the GPU host{' (H100, scaled from CPU seconds)' * dry}: "
             f"{r['gpu_seconds']:.0f}",
             f"- Settings: -b {s['batch_size']}, {s['warmup_steps']} warm-up + "
             f"{s['timed_steps']} timed steps past the pipeline's ready batches, -j "
             f"{s['workers']} {' '.join(s['extra_flags'])}",
             f"- Result: {counts_text(r['summary'])}", f"- {proof_text(r)}",
             f"- {target_text(r['target'])}"]
    return "\n".join(lines + ["- Interrupted: the rows below are those that finished"]
                     * bool(r.get("interrupted")))


def figures_md(r: dict) -> str:
    text = "## Figures against the targets\n\n" + table(
        ["loader alone", "images/s", "target"],
        [[n, num(x["images_per_sec"]), f">= {x['target']:,.0f}"] for n, x in r["loaders"].items()])
    body = [[name, pct(x["raw"]), pct(x["alone"]), pct(x["judged"]), pct(x["spread"]),
             x["decoder"] or "-", x["status"], f">= {pct(TARGET_SHARE)}"]
            for name, x in r["shares"].items()]
    if body:
        text += ("\n\nEach training row's share of synthetic training: judged = the training "
                 "share capped by the loader alone's share (which no queue biases) and by "
                 "100%; a training share above 100% by more than the rows' step spread "
                 "fails on a GPU.\n\n" + table(["training row", "vs synthetic", "loader alone",
                                                "judged", "spread", "decoder", "status",
                                                "target"], body))
    return text + ("\n\nDry run: CPU figures on shared cores, whose load moves each run's "
                   "images/s; a share above 100% is noted, not judged." if r["dry_run"] else "")


def rows_md(r: dict) -> str:
    body = [[x["name"], x.get("group", "-"), x.get("step") or "-", status_of(x)[:160],
             num(x.get("images_per_sec")) + ("*" if x.get("includes_warmup") else ""),
             pct(x.get("ratio_to_synthetic")), x.get("workers", x.get("jobs", "-")),
             x.get("res", ""), x.get("decoder", ""), num(x.get("seconds")),
             num(x.get("gpu_seconds"))] for x in r["rows"]]
    return ("## Every row, in the order run\n\nWhy each figure: main.py's stage table, bound "
            "and advice in the row's log, `logs/ROW.out`.\n\n" + table(
        ["row", "group", "step", "status", "images/s", "vs synthetic", "-j", "px", "decoder",
         "seconds", "GPU-host seconds"], body)
        + ("\n\n\\* includes warm-up: main.py wrote no `steady_images_per_sec`, so this is "
           "`train_images_per_sec` over the whole epoch" if any(
               x.get("includes_warmup") for x in r["rows"]) else ""))
