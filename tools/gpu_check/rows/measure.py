"""The measuring rows (main.py training, a loader alone, pytest, NCCL, DALI's memory), their
data and outputs read back. A row times after a warm-up past every batch its pipeline can hold
ready (:func:`ready_batches`): the loader, not a queue filled while cuDNN tuned."""
import glob
import math
import os
import pathlib
import re
import shutil
import sys
from types import SimpleNamespace

from .. import report
from ..runner import Runner, fail, json_lines, last_json, skipped
from .probes import on_gpu

GPU = SimpleNamespace(steps=200, warmup=5, batch=256, workers="auto", dry_run=False)
# A dry run's: loading in-process, as each worker process would import torch again
DRY = SimpleNamespace(steps=2, warmup=1, batch=4, workers="0", dry_run=True)
GPU_HOST = {"cpu_cores": 16, "gpu_count": 1}  # one H100 host, the time budget's unit
NO_TESTS_RAN = 5  # pytest's exit status when every test was skipped at collection
MEMORY_EPOCHS = 3
# Batches a pipeline holds ready: prefetch_factor=4 per worker and 2 spare shared slots
# (loaders/pipelines/workers/slots.slots_for); the batch decode runs 2 ahead plus the one it
# decodes (loaders/pipelines/ahead.RunAhead); DALI: a prefetch queue of 4 and its feed's 5 batches.
PREFETCH_FACTOR, SPARE_SLOTS, DECODE_AHEAD, DALI_READY = 4, 2, 3, 10
COMPILE_GAIN = 1.05  # --compile on a loader only when it gains more than 5% on synthetic
LOW_RES = 160  # px: FFCV's min_res, the side of progressive resizing's first epochs
WAVES = 10  # a loader alone times at least this many batches per worker
PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)")


def workers_count(workers: str, machine: dict) -> int:
    """``-j`` as main.py resolves it: ``auto`` is every core of the machine."""
    return machine.get("cpu_cores") or 1 if workers == "auto" else int(workers)


def ready_batches(loader: str, workers: int) -> int:
    """Batches ``loader``'s pipeline with ``workers`` workers can hold before a step asks."""
    if loader == "synthetic":
        return 0
    if loader.startswith("dali"):
        return DALI_READY
    return PREFETCH_FACTOR * workers + SPARE_SLOTS + DECODE_AHEAD * ("gpudecode" in loader)


def steady_sizes(s, loader: str, workers: int, alone: bool = False,
                 timed: int | None = None) -> tuple[int, int]:
    """``(warm-up, timed)`` batches: :func:`ready_batches` + ``s.warmup`` (alone, which tunes
    nothing: at most 2); ``timed``, else ``s.steps`` (alone: WAVES per worker, >= steps // 4)."""
    if timed is None:
        timed = max(s.steps // 4, WAVES * workers, 1) if alone else s.steps
    return ready_batches(loader, workers) + (min(s.warmup, 2) if alone else s.warmup), timed


def data_batches(s, machine: dict) -> int:
    """Training batches the replicated sample must hold so that no row's epoch ends inside
    its timed steps (the most workers a row uses, every core or 15; 4 spare)."""
    most = max(workers_count(s.workers, machine), 1 if s.dry_run else 15)
    return max(sum(steady_sizes(s, "gpudecode", most, alone)) for alone in (False, True)) + 4


def nccl_world(s, machine: dict) -> int:
    """The distributed row's world size (the data is sized for it too): 2 gloo processes in a
    dry run, else one process per GPU."""
    return 2 if s.dry_run else max(machine.get("gpu_count", 1), 1)


def list_images(root: str) -> list[tuple[str, str]]:
    """(class, path) of every file in ``root``'s non-hidden class folders."""
    return [(cls, path) for cls in sorted(os.listdir(root)) if not cls.startswith(".")
            and os.path.isdir(os.path.join(root, cls))
            for path in sorted(glob.glob(os.path.join(root, cls, "*"))) if os.path.isfile(path)]


def prepare_data(runner: Runner, s, machine: dict, lmdb_timeout: float) -> tuple[list, dict]:
    """The sample linked into ``OUT/data/train`` for :func:`data_batches` batches (the page
    cache: rows measure decoding, not disk), it and val as LMDBs: the records, and the data
    row's ``paths`` (and why not) and ``bytes`` (of the LMDB a GPU host writes: the sample's
    mean image times :func:`data_batches` batches of :data:`GPU`)."""
    world = nccl_world(s, machine)
    copies = math.ceil(max(data_batches(s, machine), 2 * world + 2) * s.batch / len(s.images))
    root = os.path.join(s.out, "data")
    shutil.rmtree(root, ignore_errors=True)
    data = SimpleNamespace(train=os.path.join(root, "train"), val=s.val_src, lmdb=None,
                           reason=None, lmdb_reason=None)
    records = [{"name": "replicate", "status": "passed", "images": copies * len(s.images),
                "copies": copies, "sample_images": len(s.images), "train": data.train}]
    sample_bytes = sum(os.path.getsize(p) for _, p in s.images)  # map_size: no remapping
    fields = {"paths": vars(data), "bytes": int(sample_bytes / len(s.images) * data_batches(
        GPU, GPU_HOST) * GPU.batch)}
    try:
        for cls, path in s.images:
            os.makedirs(os.path.join(data.train, cls), exist_ok=True)
            stem, ext = os.path.splitext(os.path.basename(path))
            for k in range(copies):
                os.symlink(path, os.path.join(data.train, cls, f"{stem}_{k:04d}{ext}"))
    except OSError as exc:
        data.reason = data.lmdb_reason = "not available: the sample could not be linked"
        return [fail(records[0], f"cannot link {path}: {exc.strerror or exc}")], fields
    if not machine.get("lmdb"):
        data.lmdb_reason = "not available: lmdb not installed"
        return records + [skipped("lmdb-convert", data.lmdb_reason)], fields
    lmdb = os.path.join(root, "lmdb")
    code = ("import sys; from formats.lmdb import convert; [convert(a, b, workers=%d, "
            "progress=False, check='header', map_size=%d) for a, b in "
            "zip(sys.argv[1::2], sys.argv[2::2])]" % (machine.get("cpu_cores") or 1,
                                                     2 * copies * sample_bytes + (1 << 26)))
    rec = runner.run("lmdb-convert", [sys.executable, "-c", code, data.train,
                                      os.path.join(lmdb, "train"), data.val,
                                      os.path.join(lmdb, "val")], lmdb_timeout)
    if rec["status"] == "passed":
        data.lmdb = lmdb
    else:
        data.lmdb_reason = f"not available: LMDB conversion {rec['status']}"
    return records + [rec], fields


def loader_flags(loader: str, data: SimpleNamespace, machine: dict) -> list[str] | str:
    """main.py's data flags for ``loader`` (not ``--decode-device``), or why it cannot run."""
    if loader == "synthetic":
        return ["--dummy"]
    if loader.startswith("dali") and not machine.get("dali"):
        return "not installed"
    if data.reason:
        return data.reason
    dali = ["--dali"] if loader.startswith("dali") else []
    if loader in ("lmdb", "dali-lmdb", "gpudecode-lmdb"):
        return data.lmdb_reason or dali + ["--lmdb", "--train", os.path.join(data.lmdb, "train"),
                                           "--val", os.path.join(data.lmdb, "val")]
    return dali + ["--train", data.train, "--val", data.val]


def run_main(runner: Runner, s, name: str, args: list[str],
             timeout: float) -> tuple[dict, list[dict]]:
    """``main.py ARGS --seed 0 -p 0 --output-dir OUT/runs/NAME`` (emptied first; its
    checkpoints removed after: a ResNet-50's is 100 MB, and only speed is wanted here): its
    record and the records of its ``metrics.jsonl`` ([] without one)."""
    rundir = os.path.join(s.out, "runs", name)
    shutil.rmtree(rundir, ignore_errors=True)
    rec = runner.run(name, [sys.executable, "main.py", *args, "-p", "0",
                            "--seed", "0", "--output-dir", rundir], timeout)
    for checkpoint in glob.glob(os.path.join(rundir, "*.pth.tar")):
        os.remove(checkpoint)
    path = pathlib.Path(rundir, "metrics.jsonl")
    return rec, json_lines(path.read_text(errors="replace")) if path.is_file() else []


def jobs(spec: str, s, machine: dict) -> str:
    """``-j`` of a row: ``all`` is ``s.workers``; ``less`` every core but one; a number is
    itself. Dry, loading in-process: ``1`` for ``less`` and ``1``, else ``s.workers``."""
    if s.dry_run:
        return "1" if spec in ("less", "1") else s.workers
    cores = machine.get("cpu_cores") or 2
    return {"all": s.workers, "less": str(max(1, cores - 1))}.get(spec, spec)


def main_row(ctx, row, limit: float) -> dict | None:
    """A ``train`` row (a main.py training epoch) or an ``alone`` one (``main.py
    --benchmark-data``), sized by :func:`steady_sizes`, read by :func:`figures`, its decoder
    checked (:func:`.probes.on_gpu`) or named; failed off the GPU unless dry. A ``best`` row
    trains from the model's fastest loader at 224 px (None where not worth it: ``--compile``
    gained <= 5% on synthetic data, or that loader has its own 160 px row)."""
    s, machine, loader, train = ctx.s, ctx.machine, row.loader, row.kind == "train"
    workers = jobs(row.workers, s, machine)
    if row.compiled and s.dry_run:
        return skipped(row.name, "dry run: no torch.compile timing on the CPU")
    best = report.best_loader(list(ctx.done.values()), row.model) if loader == "best" else None
    if loader == "best":
        gain = report.ratio(ctx.done.get(f"train-{row.model}-synthetic-compile"),
                            ctx.done.get(f"train-{row.model}-synthetic"))
        if not best or row.compiled and (gain or 0) <= COMPILE_GAIN or row.res and any(
                r.get("loader") == best["loader"] and r.get("res") for r in ctx.done.values()):
            return None
        loader, workers = best["loader"], best.get("jobs", workers)
    res = (16 if s.dry_run else LOW_RES) if row.res else None  # a dry run trains at 32 px
    arch = "resnet18" if s.dry_run else row.model  # standing in on the CPU
    fields = {"loader": loader, **({"model": row.model, "arch": arch, "compile": row.compiled,
                                    "jobs": workers, **({"res": res} if res else {})}
                                   if train else {})}
    flags = loader_flags(loader, ctx.data, machine)
    if isinstance(flags, str):
        return skipped(row.name, flags, **fields)
    decode = ["--decode-device", "cpu-nvimgcodec" if s.dry_run else "cuda"] \
        if "gpudecode" in loader else []
    warm, timed = steady_sizes(s, loader, workers_count(workers, machine), not train, row.timed)
    # --train-crop-size last: a 160 px row's wins over a dry run's 32 px
    args = [*flags, "--amp", "--channels-last", "-b", str(s.batch), "--benchmark-warmup",
            str(warm), "-j", workers, *s.sizes, *s.accel, *row.extra, *decode,
            *(["--train-crop-size", str(res)] if res else [])]
    if train:
        rec, records = run_main(ctx.runner, s, row.name, [
            "-a", arch, "--epochs", "1", "--train-batches", str(warm + timed), "--val-batches",
            "1", *(["--compile"] if row.compiled else []), *args], limit)
    else:
        rec = ctx.runner.run(row.name, [sys.executable, "main.py", "--benchmark-data",
                                        "--train-batches", str(timed), *args], limit)
    rec = {**fields, **rec, "warmup_steps": warm, "timed_steps": timed}
    if rec["status"] != "passed":
        return rec
    try:
        rec = figures(rec, ctx.runner.text(row.name), records if train else None)
    except ValueError as exc:
        return ctx.runner.attach_tails(fail(rec, str(exc)))
    if not s.dry_run and not str(rec.get("device")).startswith("cuda"):
        return fail(rec, f"ran on {rec.get('device')}, not a GPU")
    if best:
        rec["speedup"] = report.ratio(rec, best)
    if decode:
        rec = on_gpu(ctx, rec)
    if loader.startswith("dali"):
        rec["decoder"] = "DALI CPU" if "--dali-cpu" in row.extra or s.dry_run else "DALI mixed"
    return rec


def figures(rec: dict, out: str, records: list[dict] | None) -> dict:
    """``rec`` with a training run's figures (its ``device:`` line in ``out``,
    :func:`read_speed` of its metrics ``records``) or, without ``records``, a loader alone's
    (its JSON line, the ``stages_*`` figures as ``stages``). ValueError without them."""
    if records is not None:
        device = re.search(r"^device: (\S+?);", out, re.M)
        return {**rec, "device": device.group(1) if device else None, **read_speed(records)}
    result = last_json(out) or {}
    if not result.get("images_per_sec"):
        raise ValueError("no JSON line with images_per_sec on stdout")
    stages = {k: v for k, v in result.items() if k.startswith("stages_")}
    return {**rec, **{k: v for k, v in result.items() if k != "seconds" and k not in stages},
            "timed_seconds": result.get("seconds"), "loader": rec["loader"], "stages": stages}


def pytest_piece(ctx, row, timeout: float) -> dict:
    """``pytest -m gpu PATH`` (``row.extra``), parsed from pytest's summary line; the sample
    goes in as ``IMAGENET_SAMPLE``, as ``../shared`` is not on a GPU host."""
    runner, name = ctx.runner, row.name
    rec = runner.run(name, [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rsfE",
                            "-p", "no:cacheprovider", *row.extra], timeout,
                     env={"IMAGENET_SAMPLE": os.path.dirname(ctx.s.train_src)})
    if rec["status"] in ("skipped", "timed out"):
        return rec
    rec.update(parse_pytest(runner.text(name)))
    counts = rec["counts"]
    if rec.get("returncode") == NO_TESTS_RAN and counts.get("skipped") and not any(
            counts.get(k) for k in ("passed", "failed", "error")):
        skip = re.search(r"^SKIPPED \[\d+\] \S+: (.+)$", runner.text(name), re.M)
        return {**rec, "status": "skipped", "reason": skip.group(1) if skip else "skipped"}
    if rec["status"] == "passed" and not counts:  # the tails of a failed command are there
        rec = runner.attach_tails(fail(rec, "no pytest summary line"))
    return rec


def nccl_row(ctx, row, timeout: float) -> dict:
    """``--multiprocessing-distributed`` on every GPU (dry: gloo, 2 processes); passed when
    main.py joined the process group (one GPU too: DDP over NCCL) and wrote a val_acc1."""
    runner, s, data = ctx.runner, ctx.s, ctx.data
    if data.reason:
        return skipped(row.name, data.reason)
    world, backend = nccl_world(s, ctx.machine), "gloo" if s.dry_run else "nccl"
    rec, records = run_main(runner, s, row.name, [
        "--multiprocessing-distributed", "-a", "resnet18", "--amp", "--channels-last",
        "--train", data.train, "--val", data.val, "-b", str(s.batch * world), "--epochs", "1",
        "--train-batches", "2", "--val-batches", "2", "-j", s.workers, *s.sizes,
        *(["--no-accel", "--nproc-per-node", "2"] if s.dry_run else []), "--dist-backend",
        backend], timeout)
    rec.update(world_size=world, backend=backend,
               process_group=f"({backend} process group)" in runner.text(row.name))
    if rec["status"] != "passed":
        return rec
    if not rec["process_group"]:
        return fail(rec, f"main.py did not report joining a {backend} process group")
    if not any(r.get("val_acc1") is not None for r in records):
        return fail(rec, "no metrics.jsonl record with val_acc1")
    return {**rec, "val_acc1": records[-1]["val_acc1"]}


def memory_row(ctx, row, timeout: float) -> dict:
    """``dali-memory``: ResNet-18 from DALI, :data:`MEMORY_EPOCHS` short epochs; host RSS and
    device memory (MiB) after each; failed when device memory grows > 5% after the first."""
    runner, s = ctx.runner, ctx.s
    flags = loader_flags("dali-lmdb", ctx.data, ctx.machine)
    if isinstance(flags, str):
        return skipped(row.name, flags)
    rec, records = run_main(runner, s, row.name, [
        *flags, "-a", "resnet18", "--amp", "--channels-last", "-b", str(s.batch), "--epochs",
        str(MEMORY_EPOCHS), "--train-batches", str(max(s.steps // 4, 4)), "--val-batches", "2",
        "-j", s.workers, *s.sizes, *s.accel], timeout)
    if rec["status"] != "passed":
        return rec
    rec.update({k: [r.get(k) for r in records] for k in ("host_rss_mib", "device_memory_mib")})
    device = [m for m in rec["device_memory_mib"] if m is not None]
    if len(device) >= 2 and device[-1] > 1.05 * device[0]:
        return fail(rec, f"device memory grew from {device[0]:.0f} to {device[-1]:.0f} MiB "
                         "after the first epoch")
    return rec


def read_speed(records: list[dict]) -> dict:
    """Of a run's ``metrics.jsonl`` ``records``, the last epoch's ``images_per_sec``
    (``steady_images_per_sec``, else the epoch's with ``includes_warmup``), ``spread`` ((p90 -
    p50) / p50 of the step times: how far two runs differ by chance), ``stages``. ValueError
    without one, or for a loss not finite."""
    records = [r for r in records if r.get("train_images_per_sec") is not None]
    if not records:
        raise ValueError("no epoch record with images/s in metrics.jsonl")
    last = records[-1]
    key = "steady_images_per_sec" if last.get("steady_images_per_sec") is not None \
        else "train_images_per_sec"
    loss = last.get("train_loss")
    if loss is not None and not math.isfinite(loss):
        raise ValueError(f"train loss {loss}: the weights diverged")
    p50, p90 = last.get("stages_step_ms_p50"), last.get("stages_step_ms_p90")
    return {"images_per_sec": last[key], "speed_key": key,
            "includes_warmup": key == "train_images_per_sec",
            "data_time_fraction": last.get("data_time_fraction"),
            "epoch_seconds": last.get("epoch_seconds"), "val_acc1": last.get("val_acc1"),
            "train_loss": loss, "stages": {k: v for k, v in last.items() if k.startswith(
                "stages_")},
            "spread": round((p90 - p50) / p50, 4) if p50 and p90 is not None else None}


def parse_pytest(text: str) -> dict:
    """``counts`` (passed, failed, skipped, deselected, error, ...) from pytest's final summary
    line, ``failed_tests`` (node ids of FAILED/ERROR lines) and ``summary_line``."""
    summary = next((line.strip(" =") for line in reversed(text.splitlines())
                    if PYTEST_COUNT.search(line) and re.search(r"\bin [\d.]+s", line)), "")
    counts = dict.fromkeys(("passed", "failed", "skipped", "error"), 0) if summary else {}
    counts.update({("error" if word.startswith("error") else word): int(n)
                   for n, word in PYTEST_COUNT.findall(summary)})
    failed = [m.group(2) for m in re.finditer(r"^(FAILED|ERROR) (\S+)", text, re.M)]
    return {"counts": counts, "failed_tests": failed, "summary_line": summary}
