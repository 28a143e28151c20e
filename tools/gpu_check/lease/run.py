"""One call of the lease plan (``python -m tools.gpu_check --lease [--lease-left S]``;
docs/gpu-check.md says which calls to make).

A call runs the set-up once per lease (wheels, environment probe, data), then the plan's rows
in order, each once and only when its expected seconds fit what is left of this call and of
the lease, each appended to ``STATE/rows.jsonl`` and the archive (``$OUT/gpu-check.tar.gz``)
as it ends; an error is a failed row. The last line says whether the next call is worth
making (``NEXT`` or ``DONE``). Exit status 0 when no row failed, 1 when one did, 2 for bad
input.
"""
from __future__ import annotations

import json
import os
import sys
import time
from types import SimpleNamespace

from . import plan
from .calls import (carried_call, clear_state, read_rows, start_call, stash,
                    write_archive)
from ..settings import InputError, check_not_in_out, settings
from ..machine.data import prepare_data
from ..machine.install import install, join_parts
from .report import lease_report, report_md
from ..machine.environment import environment
from ..report import over_synthetic, progress_line
from ..runner import REPO, Runner, crashed, own_cpu, skipped

STATE = "/tmp/gpu-check"
ARCHIVE = "gpu-check.tar.gz"


def lease_main(args) -> int:
    """One call; returns the exit status."""
    state = os.path.abspath(args.state or STATE)
    calls = os.path.join(REPO, ".gpu-bundle", "calls")
    try:
        check_not_in_out(state, "--state")
        rows = plan.select(plan.plan_rows(), args.rows)
        os.makedirs(state, exist_ok=True)
        call = start_call(state, carried_call(calls), args.lease_left)
        if call["new"]:  # a new lease: nothing of an earlier one counts
            clear_state(state)
        stash(calls, os.path.join(state, "bundle"))
    except (InputError, OSError, ValueError) as exc:
        print(f"gpu_check --lease: error: {exc}", file=sys.stderr)
        return 2
    archive = args.archive or os.path.join(os.environ.get("OUT") or state, ARCHIVE)
    lease = Lease(state, call, archive, rows, args.dry_run)
    try:
        lease.run(args)
    except KeyboardInterrupt:
        lease.record({"name": "interrupted", "status": "failed", "reason": "KeyboardInterrupt"})
    except Exception as exc:  # noqa: BLE001 -- whatever it is, the archive must be written
        lease.record(crashed("lease", exc))
    finally:
        lease.save()
    failed = [r for r in lease.done.values() if r["status"] == "failed"]
    print(f"gpu-check --lease: call {call['call']} of {call['calls']}: {len(lease.done)} rows "
          f"so far, {len(failed)} failed; archive {archive}", flush=True)
    print(lease.next_line(), flush=True)
    return 1 if failed else 0


class Lease:
    """The rows of this lease so far (``STATE/rows.jsonl``), its clock and its archive."""

    def __init__(self, state: str, call: dict, archive: str, rows: list, dry_run: bool):
        self.state, self.call, self.archive, self.rows = state, call, archive, rows
        self.dry_run, self.s, self.stop = dry_run, None, None
        self.rows_path = os.path.join(state, "rows.jsonl")
        self.done = {r["name"]: r for r in read_rows(self.rows_path)}
        self.runner = Runner(state, float("inf"), grace=0.0, dry_run=dry_run)
        if os.path.isdir(os.path.join(state, "site")):
            self.runner.add_path(os.path.join(state, "site"))
        self.ctx = SimpleNamespace(runner=self.runner, s=None, model="resnet50", machine={},
                                   data=None, row=None, limit=None, sample=None)
        mine = self.call["bytes"][self.call["call"] - 1] if self.call["bytes"] else 0
        given = call["lease_left"]
        self.left_at_start = (given - plan.GAP_SECONDS if given is not None else
                              plan.LEASE_SECONDS - plan.START_SECONDS) - plan.upload_seconds(mine)

    # the clock: wall time on a GPU; the rows' scaled H100 seconds in a rehearsal
    def used(self) -> float:
        if self.dry_run:
            mine = [r for r in self.done.values() if r.get("call") == self.call["call"]]
            return plan.CALL_OVERHEAD + sum(r.get("gpu_seconds") or 0.0 for r in mine)
        return time.time() - self.call["started"]

    def left_in_call(self) -> float:
        return plan.CALL_SECONDS - self.used()

    def left_in_lease(self) -> float:
        return self.left_at_start - self.used() - plan.CLOSE_SECONDS

    def run(self, args) -> None:
        """The call's work: the lost-machine row, or the set-up and every row that fits."""
        print(f"gpu-check --lease: call {self.call['call']} of {self.call['calls']}, "
              f"{self.left_in_lease():.0f} s of the lease left; rows in {self.rows_path}",
              flush=True)
        if self.call["lost"]:
            self.stop = self.call["lost"]
            self.record({"name": f"machine-lost-call{self.call['call']}", "status": "failed",
                         "reason": self.call["lost"]})
            self.guarded("environment", lambda: self.environment(None))
            return
        args.bundle, args.out, args.keep_data = (os.path.join(self.state, "bundle"), self.state,
                                                 True)
        try:
            self.s = self.ctx.s = settings(args)
        except InputError as exc:
            self.record({"name": "settings", "status": "failed", "reason": str(exc)})
            return
        self.ctx.model = self.s.models[0]
        self.ctx.sample = os.path.dirname(self.s.train_src)
        if not self.set_up():
            return
        self.check_dali_time()
        for row in self.rows:
            if not self.step(row):
                break

    def guarded(self, name: str, step) -> bool:
        """Run set-up ``step``; an exception is a failed row ``name``. True when it ran."""
        try:
            step()
            return True
        except Exception as exc:  # noqa: BLE001 -- a failed row, never a lost archive
            self.record(crashed(name, exc))
            return False

    def set_up(self) -> bool:
        """The set-up rows, each once per lease (wheels, environment, data); False when
        nothing else can run (no GPU, or a step failed)."""
        if "install" not in self.done:
            self.guarded("install", lambda: self.install("install", self.s.wheels))
        if "environment" not in self.done and not self.guarded(
                "environment", lambda: self.environment(self.s)):
            return False
        env = self.done["environment"]
        self.ctx.machine = dict(env.get("machine") or {})
        self.ctx.machine["hardware_windows"] = self.done.get("gpu-decode-hardware", {}).get(
            "window")
        if env["status"] != "passed" and not self.dry_run:
            return False  # without a GPU nothing else means anything
        if "data" not in self.done and not self.guarded("data", self.data):
            return False
        self.ctx.data = SimpleNamespace(**self.done["data"]["paths"])
        return True

    def install(self, name: str, wheels: list[str], joined: list[dict] = ()) -> None:
        started, cpu = time.monotonic(), own_cpu()
        recs = list(joined) + (install(self.runner, wheels, os.path.join(self.state, "site"),
                                       name=name) if wheels else [])
        status = "failed" if any(r["status"] == "failed" for r in recs) else "passed"
        done = [r for r in recs if r["name"] == name]
        self.record({"name": name, "status": status, "parts": recs, **({} if done else {
                     "reason": "nothing missing"}), "installed": sum(
                     (r.get("installed", []) for r in done), []),
                     "seconds": round(time.monotonic() - started, 2),
                     "cpu_seconds": _cpu(recs, cpu)},
                    group=5 if name == "install-dali" else 0,
                    bytes=sum(os.path.getsize(w) for w in wheels))

    def environment(self, s) -> None:
        machine, rec = environment(self.runner, s or SimpleNamespace(dry_run=self.dry_run))
        self.record({**rec, "machine": machine})

    def data(self) -> None:
        started, cpu = time.monotonic(), own_cpu()
        data, recs = prepare_data(self.runner, self.s, self.ctx.machine, 300)
        status = "failed" if any(r["status"] == "failed" for r in recs) else "passed"
        self.record({"name": "data", "status": status, "parts": recs,
                     "seconds": round(time.monotonic() - started, 2),
                     "cpu_seconds": _cpu(recs, cpu), "paths": vars(data)},
                    bytes=plan.gpu_lmdb_bytes([os.path.getsize(p) for _, p in self.s.images]))

    def check_dali_time(self) -> None:
        """From call 2 on, before DALI is installed: stop the lease when the time left cannot
        cover the calls still to come, DALI's install and its rows (a ``dali`` row says why)."""
        if self.call["call"] < 2 or "install-dali" in self.done or not self.call["bytes"]:
            return
        need = plan.remaining_need(self.call["bytes"], self.call["call"], self.rows)
        left = self.left_in_lease() + plan.CLOSE_SECONDS
        if need > left:
            self.stop = (f"lease time: {left:.0f} s left, DALI's calls, install and rows need "
                         f"{need:.0f}")
            self.record(skipped("dali", self.stop))

    def step(self, row) -> bool:
        """Run ``row`` if not done and its time fits; False when this call should stop."""
        if row.name in self.done:
            return True
        if row.needs_dali and self.stop:
            return True  # DALI was given up: the rows that need it are not run
        if row.needs_dali and not self.dali_ready():
            return False  # the next call brings the next part
        if row.group == 6 and self.call["call"] < self.call["calls"] and not self.stop:
            return False  # only when groups 1-5 are done, in the last call
        if row.expect > self.left_in_call():
            return False
        if row.expect > self.left_in_lease():
            self.record(skipped(row.name, f"lease time: {self.left_in_lease():.0f} s left, "
                                f"{row.expect:.0f} s expected"), row)
            return True
        self.ctx.row, self.ctx.limit = row, min(row.box, max(self.left_in_call(), 10.0))
        try:
            rec = {**row.run(self.ctx), "name": row.name}
        except Exception as exc:  # noqa: BLE001 -- the row fails, the call goes on
            rec = crashed(row.name, exc)
        if rec.get("status") == "passed" and rec.get("model") and row.loader != "synthetic":
            res = "-160px" if rec.get("res") else ""
            rec = over_synthetic(rec, self.done.get(
                f"train-{row.name.split('-')[1]}-synthetic{res}"), self.dry_run)
        self.record(rec, row)
        return True

    def dali_ready(self) -> bool:
        """Whether DALI's rows can run: installed by this lease, none carried (the machine's
        own, or "not installed"), or installed now (``install-dali``) once every part and
        listed wheel has come."""
        if "install-dali" in self.done:
            return self.done["install-dali"]["status"] == "passed"
        from ..machine.layout import DALI_LIST, DALI_WHEELS
        from ..machine.wheel_parts import MANIFEST, read_manifest

        parts = os.path.join(self.state, "bundle", "parts")
        listed = os.path.join(self.state, "bundle", DALI_WHEELS, DALI_LIST)
        if not os.path.isfile(os.path.join(parts, MANIFEST)) and not os.path.isfile(listed):
            # none carried yet: later calls bring it; else the machine's own or "not installed"
            return self.call["call"] >= self.call["calls"]
        wanted = [os.path.join(os.path.dirname(listed), n.strip()) for n in open(listed)
                  if n.strip()] if os.path.isfile(listed) else []
        if os.path.isfile(os.path.join(parts, MANIFEST)):
            wanted += [os.path.join(parts, n) for n in read_manifest(parts) if ".part" in n]
        if not all(os.path.isfile(p) for p in wanted):
            return False
        joined, recs = join_parts(parts, os.path.join(self.state, "wheels-joined"))
        self.install("install-dali", joined + [w for w in wanted if w.endswith(".whl")], recs)
        self.guarded("environment-dali", self.environment_dali)
        return self.done["install-dali"]["status"] == "passed"

    def environment_dali(self) -> None:
        machine, rec = environment(self.runner, self.s)
        self.ctx.machine["dali"] = machine.get("dali")
        self.record({**rec, "name": "environment-dali", "machine": machine}, group=5)

    def record(self, rec: dict, row=None, group: int = 0, **fields) -> None:
        """Append ``rec`` to the JSON lines at once, announce it, refresh the archive."""
        rec = {**rec, **fields, "group": row.group if row else group, "call": self.call["call"]}
        rec["gpu_seconds"] = round(plan.gpu_seconds(row, rec, self.dry_run), 2)
        with open(self.rows_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        self.done[rec["name"]] = rec
        print(progress_line(self.runner.elapsed(), rec), flush=True)
        self.save()

    def save(self) -> None:
        """``report.json``, ``report.md`` and the one archive under ``$OUT``."""
        report = lease_report(list(self.done.values()), self.dry_run,
                              [r.name for r in self.rows], self.call)
        with open(os.path.join(self.state, "report.json"), "w") as f:
            json.dump(report, f, indent=1)
        with open(os.path.join(self.state, "report.md"), "w") as f:
            f.write(report_md(report))
        write_archive(self.state, self.archive)

    def next_line(self) -> str:
        """What the lead does now: the next call with the time it needs, or give_back."""
        number, total = self.call["call"], self.call["calls"]
        if self.stop or number >= total:
            why = f" ({self.stop})" if self.stop else ""
            return f"gpu-check --lease: DONE{why}: give_back now"
        need = plan.remaining_need(self.call["bytes"], number, self.rows) \
            if self.call["bytes"] else 0.0
        return (f"gpu-check --lease: NEXT: call {number + 1} (carry .gpu-bundle/calls/"
                f"{number + 1}, --lease-left = this reply's budget_left_s) if budget_left_s >= "
                f"{need:.0f}; else give_back now")


def _cpu(records: list[dict], since: float) -> float:
    """CPU seconds of a row of several steps: its commands' and this process's since ``since``."""
    return round(sum(r.get("cpu_seconds") or 0.0 for r in records) + own_cpu() - since, 2)
