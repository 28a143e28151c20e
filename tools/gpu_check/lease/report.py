"""The lease's ``report.json`` and ``report.md``: the figures the targets ask for, each share of
synthetic training capped by the loader alone and by 100%, the decoder that did each GPU-decode
row's work, then every row. Speeds are images/s, times seconds."""
from __future__ import annotations

from ..markdown import num, table
from ..report import capped, pct

TARGETS = {"gpudecode_loader": 10000.0, "dali_loader": 15000.0, "share": 0.95}
# (training row, loader-alone row, synthetic row) of each share the targets judge
SHARES = [(f"train-resnet50-{loader}{px}", f"loader-{alone}{px}", f"train-resnet50-synthetic{px}")
          for loader, alone in (("gpudecode-lmdb", "gpudecode-j4"), ("dali-lmdb", "dali-lmdb"),
                                ("lmdb-jall", "lmdb-jall"), ("lmdb-jless", "lmdb-jless"))
          for px in ("", "-160px") if px == "" or "lmdb-j" not in loader]


def speed(rows: dict, name: str) -> float | None:
    row = rows.get(name) or {}
    return row.get("images_per_sec") if row.get("status") == "passed" else None


def share_of(rows: dict, train: str, alone: str, synthetic: str) -> dict:
    """One share: ``raw`` (training over synthetic), ``alone`` (loader alone over synthetic),
    ``share`` (:func:`.report.capped`), the row's ``spread``, ``status``, ``decoder``, ``note``."""
    base = speed(rows, synthetic)
    raw = speed(rows, train) / base if speed(rows, train) and base else None
    solo = speed(rows, alone) / base if speed(rows, alone) and base else None
    row = rows.get(train) or {}
    return {"raw": raw, "alone": solo, "share": capped(raw, solo),
            "spread": row.get("share_spread"), "status": row.get("status", "not run"),
            "decoder": row.get("decoder"), "note": row.get("note")}


def lease_report(rows: list[dict], dry_run: bool, planned: list[str], call: dict) -> dict:
    """The rows, the ``planned`` ones not run yet (``not_run``), the calls, the machine and the
    figures: each loader alone against its target and each share (:func:`share_of`)."""
    by = {r["name"]: r for r in rows}
    hardware = by.get("gpu-decode-hardware") or {}
    return {"tool": "gpu-check --lease", "dry_run": dry_run, "rows": rows,
            "not_run": [name for name in planned if name not in by],
            "call": {k: call.get(k) for k in ("call", "calls", "lease_left", "lost")},
            "machine": (by.get("environment") or {}).get("machine"),
            "gpu_seconds": round(sum(r.get("gpu_seconds") or 0 for r in rows), 1),
            "hardware_decoder": {"whole": hardware.get("whole"), "window": hardware.get("window"),
                                 "status": hardware.get("status", "not run")},
            "loaders": {name: speed(by, name) for name in (
                "loader-gpudecode-j4", "loader-gpudecode-j4-160px", "loader-dali-lmdb",
                "loader-dali-lmdb-160px", "loader-lmdb-jall", "loader-lmdb-jless")},
            "shares": {train[len("train-resnet50-"):]: share_of(by, train, alone, synthetic)
                       for train, alone, synthetic in SHARES}}


def report_md(report: dict) -> str:
    """``report.md``: the figures against the targets, the shares, then every row."""
    f, t, m = report["loaders"], TARGETS, report.get("machine") or {}
    gpus = ", ".join(g["name"] for g in m.get("gpus") or []) or "no GPU"
    lines = ["# gpu-check --lease" + (" (rehearsal on the CPU: proves the plan, not a GPU)"
                                      if report["dry_run"] else ""), "",
             f"Machine: {gpus}; {m.get('cpu_cores', '-')} cores; torch {m.get('torch', '-')}; "
             f"call {report['call']['call']} of {report['call']['calls']}; rows' seconds on "
             f"an H100 (measured, or scaled in a rehearsal): {report['gpu_seconds']:.0f} s", ""]
    if report["call"].get("lost"):
        lines += [f"**{report['call']['lost']}**", ""]
    hw = report["hardware_decoder"]
    body = [[f"--decode-device cuda loader alone, -j 4{px}", num(f[f"loader-gpudecode-j4{px}"]),
             f">= {t['gpudecode_loader']:,.0f}"] for px in ("", "-160px")]
    body += [[f"--dali --lmdb loader alone{px}", num(f[f"loader-dali-lmdb{px}"]),
              f">= {t['dali_loader']:,.0f}"] for px in ("", "-160px")]
    body += [[f"--lmdb loader alone, -j {which}", num(f[f"loader-lmdb-j{which}"]), "-"]
             for which in ("all", "less")]
    lines += [table(["loader alone", "images/s", "target"], body), "",
              f"Hardware JPEG decoder ({hw['status']}): whole JPEG {hw['whole']}, window (ROI) "
              f"{hw['window']}", ""]
    body = [[f"ResNet-50 {key} / synthetic", pct(x["raw"]), pct(x["alone"]), pct(x["share"]),
             pct(x["spread"]), x["decoder"] or "-", x["status"], f">= {pct(t['share'])}"]
            for key, x in report["shares"].items()]
    lines += [table(["share", "training", "loader alone", "judged", "spread", "decoder",
                     "status", "target"], body)]
    if report["dry_run"]:
        lines += ["", "Dry run: these are CPU figures on cores shared with other jobs, whose load "
                  "moves each run's images/s; a share above 100% is noted, not judged."]
    if report.get("not_run"):
        lines += ["", f"Not run (yet): {', '.join(report['not_run'])}"]
    body = [[r["name"], r.get("group"), r.get("call"), r["status"], num(r.get("seconds")),
             num(r.get("gpu_seconds")), num(r.get("images_per_sec")),
             r.get("decoder") or "", (r.get("reason") or r.get("note") or "")[:160]]
            for r in report["rows"]]
    lines += ["", table(["row", "group", "call", "status", "seconds", "H100 seconds",
                         "images/s", "decoder", "note"], body)]
    return "\n".join(lines) + "\n"
