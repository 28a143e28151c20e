"""One call of the lease plan (``python -m tools.gpu_check --lease``; docs/gpu-check.md): the
same command in every device call of a borrowed GPU's 15 minutes, nothing decided between
calls.

Each call moves what it carried (``.gpu-bundle/calls/N``: wheels, the sample, a part of DALI's
wheel) into the state folder (``--state``, ``/tmp/gpu-check``, kept while the machine stays
warm), runs the set-up once (wheels installed into ``STATE/site`` without byte-compiling, the
environment, the sample replicated and converted to LMDB), then the plan's rows
(``_gpu_plan``) in order, each once, each appended to ``STATE/rows.jsonl`` the moment it ends.
A row starts only when its expected seconds fit what is left of this call (``CALL_SECONDS``)
and of the lease; rows needing DALI wait for its last part, then DALI is reassembled, checked
and installed into ``STATE/site-dali``. After every row the results (rows, report, logs, each
run's ``metrics.jsonl``) are archived as one file into ``$OUT`` (``--archive``), so a killed
call still returns every finished row; nothing else is written under ``$OUT``.

``--dry-run`` runs the same on the CPU backends (the rehearsal, ``_gpu_rehearse``) and keeps
the lease's clock in the H100 seconds :func:`tools._gpu_plan.gpu_seconds` scales its rows to.
Exit status 0 when no row failed, 1 when one did, 2 for bad input.
"""
from __future__ import annotations

import io
import json
import math
import os
import resource
import shutil
import sys
import tarfile
import time
from types import SimpleNamespace

from . import _gpu_plan as plan
from ._gpu_report import pct, progress_line
from ._gpu_runner import REPO, Runner, environment, install, prepare_data, skipped
from ._gpu_settings import InputError, check_not_in_out, settings

STATE = "/tmp/gpu-check"
ARCHIVE = "gpu-check.tar.gz"
LOG_BYTES = 1 << 20  # of each log in the archive: its last MiB
TARGETS = {"gpudecode_loader": 10000.0, "dali_loader": 15000.0, "share": 0.95}


def lease_main(args) -> int:
    """One call: see the module. Returns the exit status."""
    state = os.path.abspath(args.state or STATE)
    try:
        check_not_in_out(state, "--state")
        os.makedirs(state, exist_ok=True)
        call = start_call(state)
        stash(os.path.join(REPO, ".gpu-bundle", "calls"), os.path.join(state, "bundle"))
        args.bundle, args.out, args.keep_data = os.path.join(state, "bundle"), state, True
        s = settings(args)
        rows = plan.select(plan.plan_rows(), args.rows)
    except (InputError, OSError, ValueError) as exc:
        print(f"gpu_check.py --lease: error: {exc}", file=sys.stderr)
        return 2
    archive = args.archive or os.path.join(os.environ.get("OUT") or state, ARCHIVE)
    lease = Lease(state, s, call, archive, [r.name for r in rows])
    print(f"gpu-check --lease: call {call['call']}, {lease.left_in_call():.0f} s of this call "
          f"and {lease.left_in_lease():.0f} s of the lease left; rows in {lease.rows_path}",
          flush=True)
    lease.set_up()
    if lease.done["environment"]["status"] == "passed" or s.dry_run:
        for row in rows:  # without a GPU nothing else means anything
            if not lease.step(row):
                break
    lease.save()
    failed = [r for r in lease.done.values() if r["status"] == "failed"]
    print(f"gpu-check --lease: {len(lease.done)} rows so far, {len(failed)} failed; archive "
          f"{archive}", flush=True)
    return 1 if failed else 0


def start_call(state: str) -> dict:
    """This call's number and start (wall seconds), after the lease's earlier ones
    (``STATE/lease.json``)."""
    path = os.path.join(state, "lease.json")
    calls = json.load(open(path)) if os.path.isfile(path) else []
    calls.append({"call": len(calls) + 1, "started": time.time()})
    with open(path, "w") as f:
        json.dump(calls, f)
    return {**calls[-1], "first_started": calls[0]["started"]}


def stash(calls: str, bundle: str) -> list[str]:
    """Move every file carried in ``calls/N/`` into ``bundle`` (same relative paths), so no
    later call's carry replaces it; returns their relative paths."""
    moved = []
    for number in sorted(os.listdir(calls)) if os.path.isdir(calls) else []:
        root = os.path.join(calls, number)
        for folder, _, files in os.walk(root):
            for name in files:
                rel = os.path.relpath(os.path.join(folder, name), root)
                target = os.path.join(bundle, rel)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                if os.path.lexists(target):
                    os.remove(target)
                shutil.move(os.path.join(folder, name), target)
                moved.append(rel)
        shutil.rmtree(root, ignore_errors=True)
    return moved


class Lease:
    """The rows of this lease so far (``STATE/rows.jsonl``), its clock and its archive."""

    def __init__(self, state: str, s, call: dict, archive: str, planned: list[str]):
        self.state, self.s, self.call, self.archive = state, s, call, archive
        self.planned = planned
        self.rows_path = os.path.join(state, "rows.jsonl")
        self.done = {r["name"]: r for r in read_rows(self.rows_path)}
        self.runner = Runner(state, math.inf)
        for site in ("site", "site-dali"):
            if os.path.isdir(os.path.join(state, site)):
                self.runner.add_path(os.path.join(state, site))
        self.ctx = SimpleNamespace(runner=self.runner, s=s, model=s.models[0],
                                   low=16 if s.dry_run else plan.LOW_RES,
                                   gpudecode="cpu-nvimgcodec" if s.dry_run else "cuda",
                                   sample=os.path.dirname(s.train_src), machine={},
                                   data=None, row=None, limit=None)

    # the clock: wall time on a GPU; the rows' scaled H100 seconds in a rehearsal
    def _scaled(self, rows) -> float:
        return sum(r.get("gpu_seconds", r.get("seconds") or 0.0) for r in rows)

    def left_in_call(self) -> float:
        if self.s.dry_run:
            mine = [r for r in self.done.values() if r.get("call") == self.call["call"]]
            return plan.CALL_SECONDS - self._scaled(mine)
        return plan.CALL_SECONDS - (time.time() - self.call["started"])

    def left_in_lease(self) -> float:
        budget = plan.LEASE_SECONDS - plan.START_SECONDS - plan.CALL_OVERHEAD
        if self.s.dry_run:
            used = self._scaled(self.done.values()) + plan.CALL_OVERHEAD * (self.call["call"] - 1)
        else:
            used = time.time() - self.call["first_started"]
        return budget - used

    def set_up(self) -> None:
        """The set-up rows, each once per lease: wheels, environment, data."""
        if "install" not in self.done:
            wheels = self.s.wheels
            recs = install(self.runner, wheels, os.path.join(self.state, "site"))
            rec = recs[-1] if recs else {"name": "install", "status": "passed",
                                         "reason": "nothing missing", "seconds": 0.0}
            self.record(rec, 0, "wheels", bytes=sum(os.path.getsize(w) for w in wheels))
        if "environment" not in self.done:
            machine, rec = environment(self.runner, self.s)
            self.record({**rec, "machine": machine}, 0, "plain")
        self.ctx.machine = dict(self.done["environment"].get("machine") or {})
        if self.done.get("install-dali", {}).get("status") == "passed":
            self.ctx.machine["dali"] = self.done["install-dali"].get("dali")
        if "data" not in self.done:
            started, cpu = time.monotonic(), own_cpu()
            data, recs = prepare_data(self.runner, self.s, self.ctx.machine, 300)
            status = "failed" if any(r["status"] == "failed" for r in recs) else "passed"
            self.record({"name": "data", "status": status, "parts": recs,
                         "seconds": round(time.monotonic() - started, 2),
                         "cpu_seconds": parts_cpu(recs, cpu), "paths": vars(data)}, 0, "data",
                        bytes=gpu_lmdb_bytes(self.s))
        self.ctx.data = SimpleNamespace(**self.done["data"]["paths"])

    def step(self, row) -> bool:
        """Run ``row`` if not done and its time fits; False when this call should stop."""
        if row.name in self.done:
            return True
        if row.needs_dali and not self.dali_ready():
            return False  # the next call brings the next part
        if row.expect > self.left_in_call():
            return False
        if row.expect > self.left_in_lease():
            self.record(skipped(row.name, f"lease time: {self.left_in_lease():.0f} s left, "
                                f"{row.expect:.0f} s expected"), row.group, row.kind)
            return True
        self.ctx.row, self.ctx.limit = row.name, min(row.box, max(self.left_in_call(), 30.0))
        self.runner.budget = self.runner.elapsed() + self.ctx.limit
        rec = row.run(self.ctx)
        if rec["status"] == "skipped" and str(rec.get("reason", "")).startswith(
                "time budget: stopped"):
            rec = {**rec, "status": "timed out",
                   "reason": f"still running after its {self.ctx.limit:.0f} s box"}
        self.record({**rec, "name": row.name}, row.group, row.kind, rate=row.rate)
        return True

    def dali_ready(self) -> bool:
        """Whether DALI's rows can run: installed by this lease, none carried (the machine's
        own, or "not installed"), or now installed from its parts when every part has come
        (``install-dali``: reassembled and checked even where the machine has DALI, which
        then stays; a rehearsal times it so)."""
        if "install-dali" in self.done:
            return True
        from .gpu_bundle import DALI_LIST, DALI_WHEELS
        from .wheel_parts import MANIFEST, read_manifest

        parts = os.path.join(self.state, "bundle", "parts")
        deps = os.path.join(self.state, "bundle", DALI_WHEELS)
        listed = os.path.join(deps, DALI_LIST)
        if not os.path.isfile(os.path.join(parts, MANIFEST)) and not os.path.isfile(listed):
            return True  # none carried: the machine's own DALI, else its rows say so
        wanted = [os.path.join(deps, n.strip()) for n in open(listed) if n.strip()] \
            if os.path.isfile(listed) else []
        if os.path.isfile(os.path.join(parts, MANIFEST)):
            wanted += [os.path.join(parts, n) for n in read_manifest(parts) if ".part" in n]
        if not all(os.path.isfile(p) for p in wanted):
            return False
        self.install_dali(parts, sorted(p for p in wanted if p.endswith(".whl")))
        return True

    def install_dali(self, parts: str, deps: list[str]) -> None:
        """``install-dali``: DALI's wheel joined from its parts and checked, installed with
        ``deps`` (its own dependencies) into ``STATE/site-dali``; the environment probed
        again for DALI's version."""
        from ._gpu_rows import join_parts

        started, cpu = time.monotonic(), own_cpu()
        wheels, recs = join_parts(parts, os.path.join(self.state, "wheels-joined"))
        wheels += deps
        site = os.path.join(self.state, "site-dali")
        recs += install(self.runner, wheels, site, name="install-dali") if wheels else []
        machine, _ = environment(self.runner, self.s)
        self.ctx.machine["dali"] = machine.get("dali")
        status = "failed" if any(r["status"] == "failed" for r in recs) else "passed"
        self.record({"name": "install-dali", "status": status, "parts": recs,
                     "dali": machine.get("dali"), "seconds": round(time.monotonic() - started, 2),
                     "cpu_seconds": parts_cpu(recs, cpu),
                     **({} if machine.get("dali") else {"reason": "DALI not importable"})},
                    5, "wheels", bytes=sum(os.path.getsize(w) for w in wheels))

    def record(self, rec: dict, group: int, kind: str, rate: str = "loader", **fields) -> None:
        """Append ``rec`` to the JSON lines at once, announce it, refresh the archive."""
        rec = {**rec, **fields, "group": group, "call": self.call["call"]}
        rec["gpu_seconds"] = round(plan.gpu_seconds(kind, rate, rec, self.s.dry_run), 2)
        with open(self.rows_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        self.done[rec["name"]] = rec
        print(progress_line(self.runner.elapsed(), rec), flush=True)
        self.save()

    def save(self) -> None:
        """``report.json``, ``report.md`` and the one archive under ``$OUT``."""
        report = lease_report(list(self.done.values()), self.s.dry_run, self.planned)
        with open(os.path.join(self.state, "report.json"), "w") as f:
            json.dump(report, f, indent=1)
        with open(os.path.join(self.state, "report.md"), "w") as f:
            f.write(report_md(report))
        write_archive(self.state, self.archive)


def own_cpu() -> float:
    """User + system CPU seconds of this process so far (reassembling DALI, linking)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def parts_cpu(records: list[dict], since: float) -> float:
    """CPU seconds of a row made of several steps: its commands' and this process's own
    since ``since`` (:func:`own_cpu`)."""
    return round(sum(r.get("cpu_seconds") or 0.0 for r in records) + own_cpu() - since, 2)


def read_rows(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def gpu_lmdb_bytes(s) -> int:
    """Bytes of the LMDB a GPU run writes: the sample's mean file size times the images of
    warm-up + timed + 4 batches of 256 (``prepare_data``'s rule at the GPU's sizes)."""
    sizes = [os.path.getsize(p) for _, p in s.images]
    return int(sum(sizes) / max(1, len(sizes)) * (plan.GPU_STEPS + 4) * plan.GPU_BATCH)


def write_archive(state: str, target: str) -> None:
    """One ``tar.gz`` of the results into ``target`` (written beside it, then renamed): the
    rows, reports, lease calls, each log's last :data:`LOG_BYTES` and each run's
    ``metrics.jsonl``."""
    names = ["rows.jsonl", "report.json", "report.md", "lease.json"]
    for folder, sub in (("logs", ""), ("runs", "metrics.jsonl")):
        root = os.path.join(state, folder)
        for d, _, files in sorted(os.walk(root)) if os.path.isdir(root) else []:
            names += [os.path.relpath(os.path.join(d, f), state) for f in sorted(files)
                      if not sub or f == sub]
    os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
    partial = target + ".partial"
    with tarfile.open(partial, "w:gz") as tar:
        for name in names:
            path = os.path.join(state, name)
            if not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                size = os.path.getsize(path)
                f.seek(max(0, size - LOG_BYTES))
                data = f.read()
            info = tarfile.TarInfo(os.path.join("gpu-check", name))
            info.size, info.mtime = len(data), int(os.path.getmtime(path))
            tar.addfile(info, io.BytesIO(data))
    os.replace(partial, target)


def num(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def figure(rows: dict, name: str) -> float | None:
    return (rows.get(name) or {}).get("images_per_sec") if (rows.get(name) or {}).get(
        "status") == "passed" else None


def lease_report(rows: list[dict], dry_run: bool, planned: list[str] = ()) -> dict:
    """The rows, the ``planned`` ones not run yet (``not_run``), and the figures issues 37 and
    38 ask for (images/s and shares of synthetic training; None where a row did not pass),
    with the targets."""
    by = {r["name"]: r for r in rows}
    out = {"tool": "gpu-check --lease", "dry_run": dry_run, "rows": rows,
           "not_run": [name for name in planned if name not in by],
           "machine": (by.get("environment") or {}).get("machine"),
           "gpu_seconds": round(sum(r.get("gpu_seconds") or 0 for r in rows), 1), "figures": {}}
    figures = out["figures"]
    figures["loader-gpudecode-j4"] = figure(by, "loader-gpudecode-j4")
    figures["loader-dali-lmdb"] = figure(by, "loader-dali-lmdb")
    for px in ("", "-160px"):
        synthetic = figure(by, f"train-resnet50-synthetic{px}")
        for loader in ("gpudecode-lmdb", "dali-lmdb") + (("lmdb-jall", "lmdb-jless")
                                                         if not px else ()):
            speed = figure(by, f"train-resnet50-{loader}{px}")
            figures[f"share-{loader}{px}"] = (speed / synthetic if speed and synthetic
                                              else None)
    return out


def report_md(report: dict) -> str:
    """``report.md``: the figures against the targets, then every row."""
    f, t = report["figures"], TARGETS
    lines = ["# gpu-check --lease" + (" (rehearsal on the CPU: proves the plan, not a GPU)"
                                      if report["dry_run"] else ""), "",
             f"Rows' seconds on an H100 (measured, or scaled in a rehearsal): "
             f"{report['gpu_seconds']:.0f} s", "", "| figure | value | target |", "|---|---|---|"]
    lines.append(f"| --decode-device cuda loader alone, -j 4 | {num(f['loader-gpudecode-j4'])} "
                 f"| >= {t['gpudecode_loader']:,.0f} images/s |")
    lines.append(f"| --dali --lmdb loader alone | {num(f['loader-dali-lmdb'])} | >= "
                 f"{t['dali_loader']:,.0f} images/s |")
    for key, value in f.items():
        if key.startswith("share-"):
            lines.append(f"| ResNet-50 {key[6:]} / synthetic | {pct(value)} | >= "
                         f"{pct(t['share'])} |")
    if report.get("not_run"):
        lines += ["", f"Not run (yet): {', '.join(report['not_run'])}"]
    lines += ["", "| row | group | call | status | seconds | H100 seconds | images/s | note |",
              "|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['name']} | {r.get('group')} | {r.get('call')} | {r['status']} | "
                     f"{r.get('seconds') or 0:.1f} | {r.get('gpu_seconds') or 0:.1f} | "
                     f"{num(r.get('images_per_sec'))} | {(r.get('reason') or '')[:120]} |")
    return "\n".join(lines) + "\n"

