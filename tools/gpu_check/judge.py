"""Reading main.py's outputs and judging them: shares of synthetic, the targets, what is not
proven, the exit status. Speeds are images/s, times seconds; ratios are fractions. Nothing
here runs a command; :mod:`.report` writes what it finds.
"""
from __future__ import annotations

import json
import math
import os
import re

STEADY, FALLBACK = "steady_images_per_sec", "train_images_per_sec"
STATUSES = ("passed", "failed", "timed out", "skipped")
# The targets: ResNet-50's best loader (and each loader's share) at >= 95% of synthetic, the
# share capped by the loader alone; --decode-device cuda alone >= 10,000 images/s with 4
# workers, DALI reading the LMDB alone >= 15,000.
TARGET_SHARE = 0.95
LOADER_TARGETS = {"loader-gpudecode-j4": 10000.0, "loader-gpudecode-j4-160px": 10000.0,
                  "loader-dali-lmdb": 15000.0, "loader-dali-lmdb-160px": 15000.0}
# The bound line engine.report.bounds ends main.py's stage table with (then its "  try" lines).
_BOUND_LINE = re.compile(r"^  (data-bound|model-bound|loader alone):")
_PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)")


def read_metrics(rundir: str) -> list[dict]:
    """The records of ``RUNDIR/metrics.jsonl``; [] if it is missing (unparsable lines skipped)."""
    try:
        with open(os.path.join(rundir, "metrics.jsonl")) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    return [r for r in map(_json, lines) if isinstance(r, dict)]


def _json(line: str):
    try:
        return json.loads(line)
    except ValueError:
        return None


def read_speed(rundir: str) -> dict:
    """The last epoch record's figures: ``images_per_sec`` is main.py's ``steady_images_per_sec``
    (past ``--benchmark-warmup``, summed over ranks), else ``train_images_per_sec`` with
    ``includes_warmup``; with ``spread`` and ``stages``. Raises ValueError without such a record
    or for a loss that is not finite (diverged weights train at full speed too)."""
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
            "train_loss": loss, "spread": step_spread(last), "stages": stage_figures(last)}


def step_spread(record: dict) -> float | None:
    """(p90 - p50) / p50 of a run's step times (engine.report.bounds' ``stages_step_ms_*``: CUDA
    events on a GPU, waits excluded), None where main.py wrote none. It bounds how far two
    runs' mean images/s differ by chance."""
    p50, p90 = record.get("stages_step_ms_p50"), record.get("stages_step_ms_p90")
    return round((p90 - p50) / p50, 4) if p50 and p90 is not None else None


def over_synthetic(row: dict, synthetic: dict | None, dry_run: bool = False) -> dict:
    """``row`` (a training row) with ``ratio_to_synthetic`` and ``share_spread`` (the larger
    :func:`step_spread` of the two, 0 where unknown); failed when a real loader's ratio exceeds
    1 by more than that spread, since data-fed training cannot beat synthetic (it timed a
    queue filled before the clock). A dry run (shared CPU cores) only gets a ``note``."""
    row["ratio_to_synthetic"] = ratio(row, synthetic)
    if row.get("loader") in (None, "synthetic") or row["ratio_to_synthetic"] is None:
        return row
    spread = max(row.get("spread") or 0.0, (synthetic or {}).get("spread") or 0.0)
    row["share_spread"] = spread
    if row["ratio_to_synthetic"] > 1 + spread:
        why = (f"{pct(row['ratio_to_synthetic'])} of synthetic, beyond the steps' spread of "
               f"{pct(spread)}: not a steady-state figure")
        return {**row, "note": why + " (dry run: not judged)"} if dry_run else {
            **row, "status": "failed", "reason": why}
    return row


def capped(share: float | None, alone: float | None) -> float | None:
    """A loader's share of synthetic as judged: its training share, capped by its loader-alone
    share (where known) and by 1."""
    if share is None:
        return None
    return min(share, alone if alone is not None else share, 1.0)


def share_of(by: dict, row: dict) -> dict:
    """The share of a training ``row`` (with ``base``, its synthetic row's name, and ``bound``,
    its loader-alone row's) among the records ``by`` name: ``raw`` (training over synthetic),
    ``alone`` (loader alone over synthetic), ``judged`` (:func:`capped`)."""
    base = by.get(row.get("base"))
    raw, alone = ratio(row, base), ratio(by.get(row.get("bound")), base)
    return {"raw": raw, "alone": alone, "judged": capped(raw, alone)}


def stage_figures(record: dict) -> dict:
    """The ``stages_*`` keys of one main.py record (``metrics.jsonl`` or ``--benchmark-data``'s
    JSON line): ``engine.report.bounds``' stage figures (ms per image), ``stages_bound`` and
    ``stages_advice``; {} where main.py wrote none."""
    return {k: v for k, v in record.items() if k.startswith("stages_")}


def stage_lines(text: str) -> list[str]:
    """The last stage table main.py printed in ``text``, from its first line (``stages over
    ...`` or the training thread's) through the bound line and its ``try`` lines; [] if none."""
    lines = text.splitlines()
    ends = [i for i, line in enumerate(lines) if _BOUND_LINE.match(line)]
    if not ends:
        return []
    start = end = ends[-1]
    while start > 0 and lines[start - 1].startswith("  ") \
            and not _BOUND_LINE.match(lines[start - 1]):
        start -= 1
    if start > 0 and lines[start - 1].startswith("stages over "):
        start -= 1
    while end + 1 < len(lines) and lines[end + 1].startswith("  try "):
        end += 1
    return lines[start:end + 1]


def last_json(text: str) -> dict | None:
    """The last line of ``text`` that is a JSON object, or None."""
    found = [_json(x) for x in text.splitlines() if x.strip().startswith("{")]
    return next((x for x in reversed(found) if isinstance(x, dict)), None)


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


def best_loader(rows: list[dict], model: str, res: int | None = None) -> dict | None:
    """The fastest passed real (not synthetic) training row of ``model`` at ``res`` (None:
    224 px) without --compile."""
    real = [r for r in rows if r.get("model") == model and r.get("loader") not in
            (None, "synthetic") and not r.get("compile") and r.get("res") == res
            and r.get("status") == "passed" and r.get("images_per_sec")]
    return max(real, key=lambda r: r["images_per_sec"], default=None)


def target(rows: list[dict], model: str, dry_run: bool) -> dict:
    """Whether ``model``'s best loader at 224 px reaches :data:`TARGET_SHARE` of synthetic
    (``met``: None when not measured or in a dry run), judged by :func:`share_of`: whatever a
    warm-up leaves queued, the loader alone bounds what it can feed."""
    by = {r["name"]: r for r in rows}
    shares = [(share_of(by, r), r["name"].replace(f"train-{model}-", "")) for r in rows
              if r.get("model") == model
              and r.get("base") and r.get("res") is None and not r.get("compile")]
    shares = [(s["judged"], loader, s["alone"]) for s, loader in shares if s["judged"]]
    share, loader, alone = max(shares, default=(None, None, None))
    result = {"model": model, "min_ratio": TARGET_SHARE, "best_loader": loader,
              "best_ratio": share, "loader_only_ratio": alone,
              "met": None if share is None or dry_run else share >= TARGET_SHARE}
    if dry_run:
        result["note"] = "not judged in a dry run (CPU)"
    elif share is not None and alone is None:
        result["note"] = "training rows only (no loader-only figure to cap them)"
    return result


def not_proven(rows: list[dict]) -> list[dict]:
    """``{"name", "reason"}`` of each row that proves nothing: skipped, timed out, or passed
    with GPU tests that pytest skipped."""
    out = []
    for row in rows:
        skipped_tests = (row.get("counts") or {}).get("skipped")
        if row["status"] in ("skipped", "timed out"):
            out.append({"name": row["name"], "reason": status_of(row)})
        elif row["status"] == "passed" and skipped_tests:
            out.append({"name": row["name"], "reason": f"{skipped_tests} GPU tests skipped"})
    return out


def summary(rows: list[dict]) -> dict:
    """Counts per status (``timed_out`` for "timed out") and ``not_proven``."""
    statuses = [row["status"] for row in rows]
    return {**{k.replace(" ", "_"): statuses.count(k) for k in STATUSES},
            "not_proven": len(not_proven(rows))}


def exit_status(report: dict) -> int:
    """1 when a row failed; else 3 when one is not proven on a GPU (not in a dry run); else 0."""
    if report["summary"]["failed"]:
        return 1
    return 3 if report["summary"]["not_proven"] and not report["dry_run"] else 0


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


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def status_of(row: dict) -> str:
    return row["status"] + (f": {row['reason']}" if row.get("reason") else "")
