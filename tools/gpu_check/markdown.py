"""``report.md`` and ``report.json`` of the full check: a Markdown section per check section,
then what is not proven, the failures and every command (images/s, percentages, GiB).
"""
from __future__ import annotations

import json
import os

from .report import (FALLBACK, STEADY, capped, counts_text, find, loader_alone_share, pct,
                     proof_text, ratio, rows_of, status_of, target_text)


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
    parts = [md(report) for md in (
        header_md, environment_md, pytest_md, training_md, loaders_md, dali_md, gpu_decode_md,
        nccl_md, resolution_md, stages_md, setup_md, not_proven_md, failures_md, commands_md)]
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


def training_md(r: dict) -> str:
    rows = r["sections"].get("training", []) + [
        x for x in r["sections"].get("compile", []) if x.get("model")]
    if not rows and not r["sections"].get("compile"):
        return ""
    alone = [loader_alone_share(r["sections"].get("training", []), r["sections"].get("loaders"),
                                x) for x in rows]
    body = [[x["model"], x["loader"], "yes" if x.get("compile") else "",
             num(x.get("images_per_sec")) + ("*" if x.get("includes_warmup") else ""),
             pct(x.get("ratio_to_synthetic")), pct(share),
             pct(capped(x.get("ratio_to_synthetic"), share) if x.get("loader") != "synthetic"
                 and not x.get("compile") else None), pct(x.get("speedup")),
             pct(x.get("data_time_fraction")), status_of(x)] for x, share in zip(rows, alone)]
    text = ("## 3. Training images/s through main.py\n\n"
            + table(["model", "loader", "--compile", "images/s", "vs synthetic",
                     "loader alone vs synthetic", "share (capped)", "vs without --compile",
                     "data wait", "status"], body))
    if any(share is not None for share in alone):
        text += ("\n\nEach row warms up past every batch its pipeline holds ready, then times "
                 "its steps; whatever stays queued, the loader alone (section 4) bounds the "
                 "share it can feed, and no share counts above 100%.")
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


def dali_md(r: dict) -> str:
    return decoding_md("## 7. DALI's GPU decoding (`--dali --lmdb`)",
                       r["sections"].get("dali"))


def gpu_decode_md(r: dict) -> str:
    return decoding_md("## 8. GPU decoding without DALI (`--decode-device cuda --lmdb`)",
                       r["sections"].get("gpudecode"))


def detail(x: dict) -> str:
    """What a GPU-decode row shows beside its figure."""
    if x.get("on_device") is not None:
        return (f"{x['on_device']} windows in GPU memory, {x.get('fallback')} to the CPU, "
                f"max diff {num(x.get('max_diff'))}")
    if x.get("whole") is not None or x.get("window") is not None:
        return f"hardware decoder: whole JPEG {x.get('whole')}, window (ROI) {x.get('window')}"
    if x.get("gpu_over_cpu"):
        return f"GPU decode {x['gpu_over_cpu']:.2f}x the CPU decode, one worker or thread each"
    if x.get("hw_decoder_load") is not None:
        return f"hardware decoder load {x['hw_decoder_load']}"
    if x.get("device_memory_mib") or x.get("host_rss_mib"):
        return (f"host RSS {x.get('host_rss_mib')} MiB, device {x.get('device_memory_mib')} "
                "MiB per epoch")
    return x.get("model") or (x.get("reason", "") if x.get("status") == "skipped" else "")


def decoding_md(title: str, rows: list[dict] | None) -> str:
    """A GPU-decode section's table under ``title``; "" without rows."""
    if not rows:
        return ""
    body = [[x["name"], num(x.get("images_per_sec")), x.get("workers", "-"), x.get("res", ""),
             x.get("decoder", ""), detail(x), status_of(x)] for x in rows]
    return f"{title}\n\n" + table(["check", "images/s", "workers", "px", "decoder", "detail",
                                     "status"], body)


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


def stages_md(r: dict) -> str:
    """Each main.py row's stage table, bound and advice as main.py printed them."""
    rows = [x for x in rows_of(r) if x.get("stage_lines")]
    if not rows:
        return ""
    return "## Why each figure (main.py's stage tables)\n\n" + "\n\n".join(
        f"### {x['name']}\n\n```\n" + "\n".join(x["stage_lines"]) + "\n```" for x in rows)


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
