"""Check and measure the GPU path on a GPU host, most important rows first (docs/gpu-check.md).
Every row of :mod:`.plan`, or what fits a time budget, or one step of an offline bundle: the
set-up once, then each row guarded, the report rewritten after every row."""
import argparse
import glob
import json
import os
import re
import shutil
import sys
import time
from types import SimpleNamespace

from . import plan, report
from .bundle.steps import install, link_tree, missing_files, packages_folder
from .rows.measure import DRY, GPU, list_images, main_row, prepare_data
from .rows.probes import environment, host_facts
from .runner import GRACE, REPO, InputError, Runner, cpu_seconds, crashed, fail, skipped

STATE = ("rows.jsonl", "steps.json", "report.json", "report.md", "logs", "runs", "data", "site",
         "bundle", "wheels-joined")
DALI_SETUP = 60.0  # s of DALI's install and second environment probe on a GPU host


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="gpu-check-output", help="report folder, also the state "
                   "kept between the steps of an offline bundle (created)")
    p.add_argument("--bundle", help="folder from `make gpu-bundle` (wheels/, sample/, steps/); "
                   "default .gpu-bundle")
    p.add_argument("--data", help="image folder holding train/ (and val/) instead of the "
                   "bundle's sample")
    p.add_argument("--budget", type=duration, help="time budget (15m, 900, 1h30m): rows run "
                   "in order while their expected time fits, and the report lists the rest; "
                   "default: every row")
    p.add_argument("--step", type=int, metavar="N", help="run step N of a bundle made with "
                   "--step-size (its files in BUNDLE/steps/N); the state stays in --out")
    p.add_argument("--rows", nargs="+", metavar="PATTERN",
                   help="only the rows matching these (fnmatch) patterns")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU check of this script: --no-accel, 32 px, -b 4, resnet18, 2 steps")
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    return p


def duration(text: str) -> float:
    """Seconds of ``15m``, ``900``, ``900s``, ``1h30m``; argparse's error otherwise."""
    parts = re.fullmatch(r"(?:([\d.]+)h)?(?:([\d.]+)m)?(?:([\d.]+)s?)?", "".join(text.split()))
    if not parts or not parts.group(0):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a duration such as 15m, 900 "
                                         "or 1h30m")
    h, m, sec = (float(x or 0) for x in parts.groups())
    return h * 3600 + m * 60 + sec


def settings(args) -> SimpleNamespace:
    """Sizes and flags of every run; raises :class:`InputError` for a bad path."""
    dry = args.dry_run
    s = SimpleNamespace(**{
        **vars(args), **vars(DRY if dry else GPU), "out": os.path.abspath(args.out),
        "sizes": ["--train-crop-size", "32", "--val-resize-size", "32", "--val-crop-size", "32"]
        if dry else [],
        # one GPU for every single-process run: without --gpu, main.py (as pytorch/examples)
        # wraps the model in DataParallel over all visible GPUs
        "accel": ["--no-accel"] if dry else ["--gpu", "0"], "step_info": None,
        "bundle": os.path.abspath(args.bundle or os.path.join(REPO, ".gpu-bundle"))})
    for flag, path in (("--bundle", args.bundle), ("--data", args.data)):
        if path and not os.path.isdir(path):
            raise InputError(f"{flag} {path}: no such directory" + (
                " (make gpu-bundle writes it)" * (flag == "--bundle")))
    if s.step:
        path = os.path.join(s.bundle, "steps", str(s.step), "STEP.json")
        s.step_info = read_json(path)
        if s.step_info is None:
            raise InputError(f"--step {s.step}: no {path} (make gpu-bundle STEP_SIZE=64M "
                             "writes the steps; copy step N's folder to the host before "
                             "running it)")
    if s.step in (None, 1):
        bundle_paths(s, os.path.join(s.bundle, *(("steps", "1") if s.step else ())))
    return s


def bundle_paths(s, bundle: str) -> None:
    """The wheels and images of ``bundle`` (or ``s.data``) into ``s``; raises
    :class:`InputError` without a train/ folder of images."""
    s.wheels = sorted(glob.glob(os.path.join(bundle, "wheels", "*.whl")))
    s.dali_wheels = sorted(glob.glob(os.path.join(bundle, "wheels-dali", "*.whl")))
    s.parts = os.path.join(bundle, "parts")
    sample = s.data or os.path.join(bundle, "sample")
    flag = "--data" if s.data else "--bundle"
    if not os.path.isdir(os.path.join(sample, "train")):
        raise InputError(f"{flag} {s.data or bundle}: no train/ folder with images in "
                         f"{sample} (run make gpu-bundle, or pass --data DIR)")
    s.train_src = os.path.abspath(os.path.join(sample, "train"))
    val = os.path.join(sample, "val")
    s.val_src = os.path.abspath(val if os.path.isdir(val) else s.train_src)
    s.images = list_images(s.train_src)
    if not s.images:
        raise InputError(f"{flag}: {s.train_src} has no images in class folders")


def read_json(path: str):
    """A file's JSON (``.jsonl``: its lines' as a list); None if missing or damaged."""
    try:
        with open(path) as f:
            lines = path.endswith(".jsonl")
            return [json.loads(x) for x in f if x.strip()] if lines else json.load(f)
    except (OSError, ValueError):
        return None


class Check:
    """One run, the context its rows run in: ``runner``, settings ``s``, ``machine``, ``data``,
    ``done`` (the records of ``OUT/rows.jsonl`` by name, every step's)."""

    def __init__(self, s):
        self.s, self.step, self.number = s, s.step_info, s.step
        self.archive = os.path.join(s.out, f"gpu-check-step{s.step}.tar.gz" if s.step
                                    else "gpu-check.tar.gz")
        if not self.step or self.number == 1:  # a new run: nothing of an earlier one counts
            for path in [os.path.join(s.out, n) for n in os.listdir(s.out) if n in STATE
                         or n.startswith("gpu-check") and n.endswith(".tar.gz")]:
                shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) \
                    else os.remove(path)
        self.rows_path = os.path.join(s.out, "rows.jsonl")
        self.done = {r["name"]: r for r in read_json(self.rows_path) or []}
        self.runner = Runner(s.out, s.budget, s.dry_run)
        self.site = os.path.join(s.out, "site")  # one prefix: DALI's beside nvImageCodec's
        site = packages_folder(self.site)
        if site:
            self.runner.add_path(site)
        self.interrupted, self.started, self.report = False, time.time(), None

    data = property(lambda self: SimpleNamespace(**self.done["data"]["paths"]))
    machine = property(lambda self: report.machine_of(self.done))

    def run(self) -> None:
        """The set-up (the rest only after a data row, and on a GPU), then every row that fits
        (DALI's install only when it and DALI's first row fit, and in a bundle's last step);
        or the lost-state row."""
        if self.step and not self.begin_step():
            return
        self.set_up_row("install", lambda: install(self.runner, self.s.wheels, self.site))
        ran = self.set_up_row("environment", lambda: environment(self.runner, self.s))
        if not ran or self.done["environment"]["status"] != "passed" and not self.s.dry_run:
            return  # without a GPU nothing else means anything
        if not self.set_up_row("data", lambda: prepare_data(self.runner, self.s, self.machine,
                                                             600)):
            return
        for row in self.s.first:
            self.row(row)
        if self.step and self.number < self.step["steps"]:
            return
        dali = [r.expect for r in self.s.later if r.dali]
        need = DALI_SETUP + min(dali, default=0.0)
        if dali and need > self.runner.left() and self.done.get("install-dali", {
                "left_out": True}).get("left_out"):
            self.record(skipped("install-dali", f"time budget: {need:.0f} s expected with "
                                f"DALI's first row, {max(self.runner.left(), 0):.0f} s left"),
                        group=5, left_out=True)
        elif dali and self.set_up_row("install-dali", lambda: install(
                self.runner, self.s.dali_wheels, self.site, "install-dali", self.s.parts)):
            self.set_up_row("environment-dali", lambda: environment(self.runner, self.s))
        for row in self.s.later:
            self.row(row)

    def begin_step(self) -> bool:
        """Link this step's files into ``OUT/bundle``; False (a failed row says why) when an
        earlier step's state is not in ``--out``."""
        steps_path, stash = (os.path.join(self.s.out, n) for n in ("steps.json", "bundle"))
        steps = read_json(steps_path) or []
        ran = {x["step"] for x in steps if x.get("bundle") == self.step["bundle"]}
        missing = [str(k) for k in range(1, self.number) if k not in ran]
        link_tree(os.path.join(self.s.bundle, "steps", str(self.number)), stash)
        with open(steps_path, "w") as f:
            json.dump(steps + [{**self.step, "started": self.started}], f)
        if missing:
            self.record(fail({"name": f"state-lost-step{self.number}"}, f"step {self.number} "
                             f"found no state of step{'s' * (len(missing) > 1)} "
                             f"{', '.join(missing)} in {self.s.out}: their wheels, data, rows "
                             "and DALI's parts are gone (another host, or the folder was "
                             "removed); run the bundle's steps again from step 1, on one host, "
                             "with the same --out"))
            self.set_up_row("environment", lambda: environment(self.runner, self.s))
            return False
        gone = missing_files(stash, self.step, self.number)
        if gone:  # DALI's rows then fail on the install, the others run
            self.record(fail({"name": f"bundle-step{self.number}"},
                             f"files of the bundle's steps not here: {', '.join(gone)}"))
        try:
            bundle_paths(self.s, stash)
        except InputError as exc:
            self.record(fail({"name": "bundle"}, str(exc)))
            return False
        return True

    def set_up_row(self, name: str, work) -> bool:
        """Set-up row ``name`` unless done: ``work()`` gives its record, or its commands'
        records and its fields; False when it raised."""
        if name in self.done and not self.done[name].get("left_out"):
            return True
        since = time.monotonic(), cpu_seconds()
        try:
            result = work()
        except Exception as exc:  # noqa: BLE001 -- a failed row, never a lost report
            self.record(crashed(name, exc))
            return False
        if isinstance(result, tuple):
            recs, fields = result
            cpu = sum(r.get("cpu_seconds") or 0.0 for r in recs) + cpu_seconds() - since[1]
            result = {"status": "failed" if any(r["status"] == "failed" for r in recs)
                      else "passed", "parts": recs, "cpu_seconds": round(cpu, 2),
                      "seconds": round(time.monotonic() - since[0], 2), **fields}
        self.record({**result, "name": name}, group=5 if name.endswith("-dali") else 0)
        return True

    def row(self, row: plan.Row) -> None:
        """Run ``row`` unless done or longer than the time left; a pair's CPU row judges its
        GPU row again (``gpu_over_cpu``)."""
        earlier = self.done.get(row.name)
        if earlier and not earlier.get("left_out"):
            return
        if row.expect > self.runner.left():
            self.record(skipped(row.name, f"time budget: {row.expect:.0f} s expected, "
                                f"{max(self.runner.left(), 0):.0f} s left"), row, left_out=True)
            return
        limit = min(row.box, max(self.runner.left(), GRACE))
        try:  # None: not worth a row
            rec = (row.plain[2] if row.plain else main_row)(self, row, limit)
        except Exception as exc:  # noqa: BLE001 -- the row fails, the check goes on
            rec = crashed(row.name, exc)
        if rec is None:
            return
        self.record(report.judged({**rec, "name": row.name}, row.bound, self.done,
                                  self.s.dry_run), row)
        gpu, failure = plan.PAIRS.get(row.name, (None, None))
        fast, slow = (self.done.get(gpu) or {}).get("images_per_sec"), rec.get("images_per_sec")
        if fast and slow:
            pair = {**self.done[gpu], "gpu_over_cpu": fast / slow}
            if not self.s.dry_run and fast / slow < plan.GPU_OVER_CPU:
                pair = fail(pair, failure.format(ratio=fast / slow))
            self.record(pair, next(r for r in plan.all_rows() if r.name == gpu))

    def record(self, rec: dict, row: plan.Row | None = None, group: int = 0, **fields) -> None:
        """Append ``rec`` to the rows, announce it, rewrite the report and its archive."""
        rec = {**rec, **fields, "group": row.group if row else group, "step": self.number,
               "run": self.started}
        rec["gpu_seconds"] = round(rec.get("gpu_seconds") or plan.gpu_seconds(
            row, rec, self.s.dry_run), 2)
        with open(self.rows_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if self.done.get(rec["name"], {}).get("left_out"):
            del self.done[rec["name"]]  # run now: listed in the order run
        self.done[rec["name"]] = rec
        print(report.progress_line(time.monotonic() - self.runner.start, rec), flush=True)
        self.save()

    def save(self) -> None:
        self.report = report.write(self.s, [*self.done.values()], self.archive, self.interrupted)


def main_cli(argv=None) -> int:
    """Console entry: 0 every row ran and passed, 1 one failed, 3 none failed but some are not
    proven (never dry), 2 bad input, 130 interrupted."""
    args = get_args_parser().parse_args(argv)
    if args.probe:
        print(json.dumps(host_facts()))
        return 0
    try:
        s = settings(args)
        s.first, s.later = plan.select(s.rows, s.dry_run)
        os.makedirs(s.out, exist_ok=True)
    except (InputError, OSError, ValueError) as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        return 2
    what = f"step {s.step} of {s.step_info['steps']}" if s.step else "every row"
    print(f"gpu-check: {what}{', dry run (CPU)' if s.dry_run else ''}"
          + (f", time budget {s.budget:.0f} s" if s.budget is not None else "")
          + f"; report in {s.out}", flush=True)
    check = Check(s)
    try:
        check.run()
    except KeyboardInterrupt:
        check.interrupted = True
    except Exception as exc:  # noqa: BLE001 -- whatever it is, the report must be written
        check.record(crashed("gpu-check", exc))
    finally:
        if not s.step or s.step >= s.step_info["steps"]:
            shutil.rmtree(os.path.join(s.out, "data"), ignore_errors=True)
        check.save()
    print(report.summary_text(check.report, check.archive), flush=True)
    if check.interrupted:
        print("gpu_check: interrupted; the report holds the rows that finished", file=sys.stderr)
        return 130
    return report.exit_status(check.report)
