"""The check's one report: ``report.json`` and ``report.md`` (the figures against the targets,
every row, main.py's stage tables, what a time budget did not fit, what is not proven, the
failures, every command), archived with the logs after every row. Speeds are images/s."""
from __future__ import annotations

import io
import json
import os
import tarfile
import time

from . import judge
from .judge import pct, proof_text, status_of, target_text

LOG_BYTES = 1 << 20  # of each log in the archive: its last MiB


def build(s, rows: list[dict], step: dict | None, interrupted: bool = False) -> dict:
    """The report of ``rows`` (every record so far, this step's and earlier ones')."""
    by = {r["name"]: r for r in rows}
    machine = dict((by.get("environment") or {}).get("machine") or {})
    machine.update({k: v for k, v in ((by.get("environment-dali") or {}).get("machine") or {})
                    .items() if k.startswith("dali")})
    pending = step and step["step"] < step["steps"]
    return {
        "tool": "gpu-check", "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "dry_run": s.dry_run, "budget_seconds": s.budget, "interrupted": interrupted,
        "step": step and {k: step.get(k) for k in ("step", "steps", "bundle", "bytes", "size")},
        "settings": {"batch_size": s.batch, "warmup_steps": s.warmup, "timed_steps": s.steps,
                     "workers": s.workers, "rows": s.rows, "extra_flags": s.sizes + s.accel},
        "machine": machine, "rows": rows,
        "left_out": [r["name"] for r in rows if r.get("left_out")],
        "not_run": [r.name for r in s.plan if r.name not in by and r.group > 4
                    and not (r.gpu_only and s.dry_run)] if pending else [],
        "gpu_seconds": round(sum(r.get("gpu_seconds") or 0 for r in rows), 1),
        "loaders": {name: {"images_per_sec": (by.get(name) or {}).get("images_per_sec")
                           if (by.get(name) or {}).get("status") == "passed" else None,
                           "target": target} for name, target in judge.LOADER_TARGETS.items()},
        "shares": {r["name"]: {**judge.share_of(by, r), "spread": r.get("share_spread"),
                               "decoder": r.get("decoder"), "status": r["status"]}
                   for r in rows if r.get("base") and not r.get("compile")},
        "target": judge.target(rows, "resnet50", s.dry_run),
        "not_proven": judge.not_proven(rows), "summary": judge.summary(rows)}


def write(out: str, report: dict, archive: str) -> None:
    """``OUT/report.json``, ``OUT/report.md``, then the archive at ``archive`` (written beside
    it, then renamed): the reports, the rows, the steps, each log's last :data:`LOG_BYTES` and
    each run's ``metrics.jsonl``."""
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(markdown(report))
    names = ["rows.jsonl", "report.json", "report.md", "steps.json"]
    for folder, only in (("logs", ""), ("runs", "metrics.jsonl")):
        for d, _, files in sorted(os.walk(os.path.join(out, folder))):
            names += [os.path.relpath(os.path.join(d, f), out) for f in sorted(files)
                      if not only or f == only]
    os.makedirs(os.path.dirname(os.path.abspath(archive)), exist_ok=True)
    with tarfile.open(archive + ".partial", "w:gz") as tar:
        for path in [os.path.join(out, n) for n in names if os.path.isfile(os.path.join(out, n))]:
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - LOG_BYTES))
                data = f.read()
            info = tarfile.TarInfo(os.path.join("gpu-check", os.path.relpath(path, out)))
            info.size, info.mtime = len(data), int(os.path.getmtime(path))
            tar.addfile(info, io.BytesIO(data))
    os.replace(archive + ".partial", archive)


def counts_text(c: dict) -> str:
    return (f"{c['passed']} checks passed, {c['failed']} failed, {c['timed_out']} timed out, "
            f"{c['skipped']} not run")


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


def num(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def table(head: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def markdown(r: dict) -> str:
    parts = [md(r) for md in (header_md, figures_md, rows_md, stages_md, left_md, failures_md)]
    return "\n\n".join(p for p in parts if p) + "\n"


def header_md(r: dict) -> str:
    s, m, step = r["settings"], r.get("machine") or {}, r.get("step")
    gpus = (f"{len(m['gpus'])}x " + ", ".join(f"{g['name']} ({g['memory_bytes'] / 2**30:.1f} "
                                              "GiB)" for g in m["gpus"])) if m.get("gpus") \
        else "no GPU"
    libs = ", ".join(f"{k} {m.get(k) or 'not installed'}" for k in (
        "torch", "torchvision", "dali", "nvimgcodec", "lmdb", "pytest"))
    dry = " (dry run on the CPU: proves this script, not a GPU)" if r["dry_run"] else ""
    scaled = " (H100, scaled from CPU seconds)" if r["dry_run"] else ""
    lines = [f"# GPU check{dry}",
             "", f"- Host: {gpus}; driver {m.get('driver') or '-'} "
             f"(CUDA {m.get('cuda_driver_api') or '-'}), CUDA {m.get('cuda') or '-'}, cuDNN "
             f"{m.get('cudnn') or '-'}; {libs}; GPU decoder "
             f"{(m.get('decoder') or {}).get('library') or '-'}; {m.get('cpu_cores', '-')} CPU "
             f"cores; Python {m.get('python', '-')} on {m.get('platform', '-')}",
             f"- Run: {r['started']}" + (f", step {step['step']} of {step['steps']}" if step
                                          else "")
             + (f", time budget {r['budget_seconds']:.0f} s" if r["budget_seconds"] else "")
             + f"; the rows' seconds on the GPU host{scaled}: {r['gpu_seconds']:.0f}",
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
             x["decoder"] or "-", x["status"], f">= {pct(judge.TARGET_SHARE)}"]
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


def detail(x: dict) -> str:
    """What a row shows beside its figure."""
    if x.get("on_device") is not None:
        return (f"{x['on_device']} windows in GPU memory, {x.get('fallback')} to the CPU, "
                f"max diff {num(x.get('max_diff'))}")
    if x.get("whole") is not None or x.get("window") is not None:
        return f"hardware decoder: whole JPEG {x.get('whole')}, window (ROI) {x.get('window')}"
    if x.get("gpu_over_cpu"):
        return f"GPU decode {x['gpu_over_cpu']:.2f}x the CPU decode, one worker or thread each"
    if x.get("speedup"):
        return f"{pct(x['speedup'])} of " + ("eager" if x.get("compile") else "224 px")
    if x.get("device_memory_mib") or x.get("host_rss_mib"):
        return (f"host RSS {x.get('host_rss_mib')} MiB, device {x.get('device_memory_mib')} "
                "MiB per epoch")
    if x.get("world_size"):
        return (f"world size {x['world_size']}, {x.get('backend')}, process group "
                f"{'joined' if x.get('process_group') else '-'}, top-1 {num(x.get('val_acc1'))}")
    return f"pytest: {x['summary_line']}" if x.get("summary_line") else x.get("note", "")


def rows_md(r: dict) -> str:
    body = [[x["name"], x.get("group", "-"), x.get("step") or "-", status_of(x)[:160],
             num(x.get("images_per_sec")) + ("*" if x.get("includes_warmup") else ""),
             pct(x.get("ratio_to_synthetic")), x.get("workers", x.get("jobs", "-")),
             x.get("res", ""), x.get("decoder", ""), detail(x), num(x.get("seconds")),
             num(x.get("gpu_seconds"))] for x in r["rows"]]
    return ("## Every row, in the order run\n\n" + table(
        ["row", "group", "step", "status", "images/s", "vs synthetic", "-j", "px", "decoder",
         "detail", "seconds", "GPU-host seconds"], body)
        + (f"\n\n\\* includes warm-up: main.py wrote no `{judge.STEADY}`, so this is "
           f"`{judge.FALLBACK}` over the whole epoch" if any(
               x.get("includes_warmup") for x in r["rows"]) else ""))


def stages_md(r: dict) -> str:
    """Each main.py row's stage table, bound and advice as main.py printed them."""
    rows = [x for x in r["rows"] if x.get("stage_lines")]
    return "## Why each figure (main.py's stage tables)\n\n" + "\n\n".join(
        f"### {x['name']}\n\n```\n" + "\n".join(x["stage_lines"]) + "\n```"
        for x in rows) if rows else ""


def left_md(r: dict) -> str:
    parts = []
    if r["left_out"]:
        parts.append("## Left out by the time budget\n\nIn order, each longer than the time "
                     "left when its turn came: " + ", ".join(r["left_out"]))
    if r["not_run"]:
        parts.append("## Waiting for the later steps\n\n" + ", ".join(r["not_run"]))
    if r["not_proven"]:
        parts.append("## Not proven on a GPU" + (" (dry run: nothing is)" if r["dry_run"] else "")
                     + "\n\nSkipped or timed out; a passed row elsewhere proves nothing for "
                     "these:\n\n" + "\n".join(f"- {x['name']}: {x['reason']}"
                                              for x in r["not_proven"]))
    return "\n\n".join(parts)


def failures_md(r: dict) -> str:
    parts = []
    for x in [x for x in r["rows"] if x["status"] == "failed"]:
        tail = "\n".join((x.get("stderr_tail") or x.get("stdout_tail") or "").splitlines()[-8:])
        parts.append(f"### {x['name']}: {x.get('reason', '')}"
                     + (f"\n\n```\n{tail}\n```" if tail.strip() else ""))
    commands = "## Commands (run from the repository root)\n\n" + "\n".join(
        f"- {x['name']} ({x['status']}, {num(x.get('seconds'))} s):\n  `{x['command']}`"
        for x in r["rows"] if x.get("command"))
    return "\n\n".join(["## Failures (full output in logs/)"] + parts + [commands]) if parts \
        else commands
