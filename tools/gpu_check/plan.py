"""The check's one row list, in priority order, and what each row is expected to take on a GPU
host (seconds), by which a time budget (``--budget``) decides what fits.

Groups: 0 the set-up (:mod:`.check`); 1 the decode probes; 2 the synthetic denominators; 3
``--decode-device cuda``; 4 the CPU loaders at every core and one less; 5 DALI; 6 the extras
(GPU-marked tests, NCCL, ``--compile``, DALI's memory); 7 the sweeps, the other loaders and
ResNet-18. An offline bundle split into steps runs groups 1-4 in step 1 and 5-7 in its last.
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from fnmatch import fnmatch
from types import SimpleNamespace
from typing import Callable

from . import judge
from .rows import measure, probes
from .rows.measure import LOW_RES, steady_sizes, workers_count
from .runner import REPO, skipped

# Measured on one H100 host (16 cores): ResNet-50 and ResNet-18 on synthetic data (224 and 160
# px), the CPU loaders with 8 workers (every loader's floor); assumed: one CPU decode thread
# (~2 ms per image), a process's start, its CUDA context and cuDNN's tuning (a loader alone
# tunes nothing).
RATES = {("resnet50", False): 4909.0, ("resnet50", True): 7987.0,
         ("resnet18", False): 14776.0, ("resnet18", True): 14776.0}
LOADER_RATE, ONE_THREAD_RATE = 2900.0, 500.0
PROCESS_START, CUDA_START, CUDA_START_ALONE = 5.0, 10.0, 3.0
GPU = SimpleNamespace(steps=200, warmup=5, batch=256, workers="auto", dry_run=False)
GPU_HOST = {"cpu_cores": 16, "gpu_count": 1}
PAIR_STEPS = 10  # timed batches of each one-worker row of a GPU/CPU pair: a ratio, not a figure
COMPILE_GAIN = 1.05  # --compile on a loader only when it gains more than 5% on synthetic
# Each one-worker pair: the CPU row, then the GPU row it judges (GPU over CPU >= 1.5x on a GPU)
PAIRS = {"loader-dali-cpu-j1": ("loader-dali-mixed-j1", "GPU decode only {ratio:.2f}x the CPU "
                                "decode with one thread: did nvJPEG decode?"),
         "loader-gpudecode-cpu-j1": ("loader-gpudecode-cuda-j1", "batch decode only "
                                     "{ratio:.2f}x the CPU loaders with one worker: did the GPU "
                                     "decode?")}


@dataclass(frozen=True)
class Row:
    """One row. ``kind``: ``train`` (a main.py training epoch of ``model`` from ``loader``),
    ``alone`` (the loader alone, ``--benchmark-data``) or ``plain`` (``run(ctx, row, limit)``,
    ``expect_plain`` seconds). ``workers``: ``all`` (``-j``), ``less`` (every core but one) or
    a number; ``res``: at :data:`LOW_RES` px; ``bound``: the loader-alone row capping a
    training row's share; ``dali``: needs DALI; ``gpu_only``: a sweep a dry run leaves out."""

    name: str
    group: int
    box: float
    kind: str = "train"
    loader: str = "synthetic"
    model: str = "resnet50"
    workers: str = "all"
    res: bool = False
    timed: int | None = None
    extra: tuple = ()
    bound: str | None = None
    one_thread: bool = False
    run: Callable | None = None
    expect_plain: float = 0.0
    dali: bool = False
    gpu_only: bool = False
    compiled: bool = False

    def gpu_batches(self) -> int:
        """Batches this row reads on one H100 host (warm-up + timed)."""
        workers = workers_count(jobs(self.workers, GPU, GPU_HOST), GPU_HOST)
        return sum(steady_sizes(GPU, self.loader, workers, self.kind == "alone", self.timed))

    @property
    def rate(self) -> float:
        """Images/s of this row's batches on one H100 host."""
        synthetic = RATES[self.model, self.res]
        if self.one_thread:
            return ONE_THREAD_RATE
        return synthetic if self.kind == "train" and self.loader == "synthetic" else min(
            synthetic, LOADER_RATE)

    @property
    def cuda_start(self) -> float:
        return CUDA_START_ALONE if self.kind == "alone" else CUDA_START

    @property
    def expect(self) -> float:
        """Seconds this row should take on one H100 host: its process and CUDA start, then
        :meth:`gpu_batches` at :attr:`rate`."""
        if self.kind == "plain":
            return self.expect_plain
        if self.compiled:  # a cold torch.compile
            return 150.0 if self.model == "resnet50" else 100.0
        return PROCESS_START + self.cuda_start + self.gpu_batches() * GPU.batch / self.rate


def jobs(spec: str, s, machine: dict) -> str:
    """``-j`` of a row: ``all`` is ``s.workers``; ``less`` every core but one (``1`` in a dry
    run); a number is itself (``s.workers`` in a dry run, which loads in-process, but ``1``)."""
    if spec == "all":
        return s.workers
    if spec == "less":
        return "1" if s.dry_run else str(max(1, (machine.get("cpu_cores") or 2) - 1))
    return s.workers if s.dry_run and spec != "1" else spec


def _px(res: bool) -> str:
    return "-160px" if res else ""


def train(name: str, group: int, loader: str = "synthetic", **kw) -> Row:
    return Row(name, group, kw.pop("box", 150 if loader != "synthetic" else 120), "train",
               loader, **kw)


def alone(name: str, group: int, loader: str, **kw) -> Row:
    return Row(name, group, kw.pop("box", 120), "alone", loader, **kw)


def plain(name: str, group: int, box: float, run: Callable, expect: float, **kw) -> Row:
    return Row(name, group, box, "plain", run=run, expect_plain=expect, **kw)


def first_rows() -> list[Row]:
    """Groups 1-4: what a GPU host must bring back first, and an offline bundle's step 1."""
    gd, rows = "gpudecode-lmdb", []
    rows += [plain("gpu-decode-probe", 1, 120, lambda c, r, t: probes.probe(
                 c.runner, c.s, c.data, t), 12),
             plain("gpu-decode-hardware", 1, 60, lambda c, r, t: probes.hardware(
                 c.runner, c.s, c.data, c.machine, t), 5)]
    rows += [train(f"train-resnet50-synthetic{_px(r)}", 2, res=r) for r in (False, True)]
    rows += [alone(f"loader-gpudecode-j4{_px(r)}", 3, gd, workers="4", res=r)
             for r in (False, True)]
    rows += [train(f"train-resnet50-gpudecode-lmdb{_px(r)}", 3, gd, workers="4", res=r,
                   bound=f"loader-gpudecode-j4{_px(r)}") for r in (False, True)]
    rows += [alone(f"loader-lmdb-j{w}", 4, "lmdb", workers=w) for w in ("all", "less")]
    rows += [train(f"train-resnet50-lmdb-j{w}", 4, "lmdb", workers=w, bound=f"loader-lmdb-j{w}")
             for w in ("all", "less")]
    return rows


def dali_rows() -> list[Row]:
    """Group 5: DALI's probe, its one-thread GPU/CPU pair, the loader alone and ResNet-50."""
    dl = "dali-lmdb"
    rows = [plain("dali-gpu-decode", 5, 60, run_dali_probe, 10, dali=True),
            alone("loader-dali-mixed-j1", 5, dl, workers="1", timed=PAIR_STEPS, dali=True),
            alone("loader-dali-cpu-j1", 5, dl, workers="1", timed=PAIR_STEPS, dali=True,
                  extra=("--dali-cpu",), one_thread=True)]
    for r in (False, True):
        rows += [alone(f"loader-dali-lmdb{_px(r)}", 5, dl, res=r, dali=True),
                 train(f"train-resnet50-dali-lmdb{_px(r)}", 5, dl, res=r, dali=True,
                       bound=f"loader-dali-lmdb{_px(r)}")]
    return rows


def extra_rows(test_files: list[str]) -> list[Row]:
    """Group 6: the GPU-marked tests, NCCL, ``--compile``, DALI's memory across epochs."""
    rows = [plain("pytest-" + os.path.splitext(os.path.basename(p))[0], 6, 600,
                  lambda c, r, t, p=p: measure.pytest_piece(c.runner, p, c.sample, t), 120)
            for p in test_files]
    return rows + [plain("distributed", 6, 240, lambda c, r, t: measure.nccl_row(
                       c.runner, c.s, c.data, c.machine, t), 40),
                   train("train-resnet50-synthetic-compile", 6, box=420, compiled=True),
                   train("train-resnet50-best-compile", 6, "best", box=420, compiled=True),
                   plain("dali-memory", 6, 300, run_memory, 60, dali=True)]


def sweep_rows() -> list[Row]:
    """Group 7: the GPU/CPU pair of the batch decode, the hardware decoder's share and ``-j``
    swept for both GPU decoders, the folder and DALI-folder loaders, ResNet-18, 160 px."""
    gd, dl, g = "gpudecode-lmdb", "dali-lmdb", 7
    rows = [alone("loader-gpudecode-cuda-j1", g, gd, workers="1", timed=PAIR_STEPS),
            alone("loader-gpudecode-cpu-j1", g, "lmdb", workers="1", timed=PAIR_STEPS,
                  one_thread=True)]
    rows += [alone(f"loader-gpudecode-hw{x}", g, gd, workers="4", gpu_only=True,
                   extra=("--hw-decoder-load", str(x))) for x in (0.0, 0.65, 0.9, 1.0)]
    rows += [alone(f"loader-gpudecode-j{j}", g, gd, workers=j, gpu_only=True)
             for j in ("2", "8", "15")]
    rows += [alone("loader-lmdb-cpu-j8", g, "lmdb", workers="8", gpu_only=True)]
    rows += [train(f"train-resnet50-gpudecode-lmdb-jall{_px(r)}", g, gd, res=r, gpu_only=True,
                   bound=f"loader-gpudecode-j4{_px(r)}") for r in (False, True)]
    rows += [alone(f"loader-folder{s}", g, "folder", workers=w) for s, w in (("", "all"),
                                                                             ("-jless", "less"))]
    rows += [alone("loader-dali", g, "dali", dali=True),
             train("train-resnet50-folder", g, "folder", bound="loader-folder"),
             train("train-resnet50-dali", g, "dali", dali=True, bound="loader-dali")]
    rows += [alone(f"loader-dali-hw{x}", g, dl, dali=True, gpu_only=True,
                   extra=("--dali-hw-decoder-load", str(x))) for x in (0.65, 0.9, 1.0)]
    rows += [alone(f"loader-dali-j{j}", g, dl, workers=j, dali=True, gpu_only=True)
             for j in ("2", "4", "8", "15")]
    rows += [train("train-resnet50-best-160px", g, "best", res=True)]
    return rows + resnet18_rows()


def resnet18_rows() -> list[Row]:
    gd, dl, g, m = "gpudecode-lmdb", "dali-lmdb", 7, "resnet18"
    rows = [train(f"train-resnet18-synthetic{_px(r)}", g, model=m, res=r) for r in (False, True)]
    rows += [train(f"train-resnet18-gpudecode-lmdb{_px(r)}", g, gd, model=m, workers="4", res=r,
                   bound=f"loader-gpudecode-j4{_px(r)}") for r in (False, True)]
    rows += [train("train-resnet18-folder", g, "folder", model=m, bound="loader-folder"),
             train("train-resnet18-lmdb-jall", g, "lmdb", model=m, bound="loader-lmdb-jall"),
             train("train-resnet18-dali", g, "dali", model=m, dali=True, bound="loader-dali"),
             train("train-resnet18-dali-lmdb", g, dl, model=m, dali=True,
                   bound="loader-dali-lmdb"),
             train("train-resnet18-dali-lmdb-160px", g, dl, model=m, res=True, dali=True,
                   bound="loader-dali-lmdb-160px"),
             train("train-resnet18-synthetic-compile", g, model=m, box=420, compiled=True),
             train("train-resnet18-best-compile", g, "best", model=m, box=420, compiled=True)]
    return rows


def all_rows() -> list[Row]:
    """Every row in priority order (the set-up apart)."""
    return first_rows() + dali_rows() + extra_rows(gpu_test_files()) + sweep_rows()


def select(rows: list[Row], patterns: list[str] | None) -> list[Row]:
    """``rows`` whose names match one of ``patterns`` (``fnmatch``; None: all), in order.
    Raises ``ValueError`` naming a pattern that matches nothing."""
    if patterns is None:
        return rows
    for pattern in patterns:
        if not any(fnmatch(r.name, pattern) for r in rows):
            raise ValueError(f"--rows {pattern}: no row matches (the rows: "
                             f"{', '.join(r.name for r in rows)})")
    return [r for r in rows if any(fnmatch(r.name, p) for p in patterns)]


def gpu_test_files() -> list[str]:
    """``tests/**/test_*.py`` files (relative to the repository) with ``gpu``-marked tests."""
    marked = re.compile(r"^\s*(pytestmark\s*=\s*pytest\.mark\.gpu|@pytest\.mark\.gpu)", re.M)
    found = []
    for path in sorted(glob.glob(os.path.join(REPO, "tests", "**", "test_*.py"), recursive=True)):
        with open(path, errors="replace") as f:
            if marked.search(f.read()):
                found.append(os.path.relpath(path, REPO))
    return found


def gpu_seconds(row: Row | None, record: dict, dry_run: bool) -> float:
    """Seconds a row recorded here (``row`` None for the set-up, whose records hold
    ``bytes``) takes on one H100 host: on a GPU its measured ``seconds``. In a dry run its
    ``cpu_seconds`` (wall seconds mostly wait for shared cores), plus a main.py row's CUDA
    start and H100 batches at its rate, or ``bytes`` written (the data) or unpacked (wheels)."""
    if not dry_run:
        return float(record.get("seconds") or 0.0)
    work = float(record.get("cpu_seconds") if record.get("cpu_seconds") is not None
                 else record.get("seconds") or 0.0)
    if row is not None and row.kind != "plain" and record.get("status") != "skipped":
        return work + row.cuda_start + row.gpu_batches() * GPU.batch / row.rate
    rate = 200e6 if record.get("name") == "data" else 10e6  # disk writes, pip's unpacking
    return work + float(record.get("bytes") or 0) / rate


def gpu_lmdb_bytes(image_sizes: list[int]) -> int:
    """Bytes of the LMDB an H100 host writes: the mean of ``image_sizes`` times the images of
    :func:`.rows.measure.data_batches` batches of 256."""
    mean = sum(image_sizes) / max(1, len(image_sizes))
    return int(mean * measure.data_batches(GPU, GPU_HOST) * GPU.batch)


# What the rows run: ctx holds runner, settings s, machine, data, done (records by name), sample.
def run_main(ctx, row: Row, limit: float) -> dict | None:
    """A ``train`` or ``alone`` row; batch-decode rows get their decoder checked
    (:func:`.probes.on_gpu`), DALI's their decoder named. A ``best`` row trains from the
    model's fastest loader at 224 px (None where not worth a row: ``--compile`` gained 5% or
    less on synthetic data, or that loader has its own 160 px row)."""
    s, machine, loader, workers = ctx.s, ctx.machine, row.loader, jobs(row.workers, ctx.s,
                                                                       ctx.machine)
    res = (16 if s.dry_run else LOW_RES) if row.res else None  # a dry run trains at 32 px
    if row.compiled and s.dry_run:
        return skipped(row.name, "dry run: no torch.compile timing on the CPU")
    best = judge.best_loader(list(ctx.done.values()), row.model) if loader == "best" else None
    if loader == "best":
        gain = judge.ratio(ctx.done.get(f"train-{row.model}-synthetic-compile"),
                           ctx.done.get(f"train-{row.model}-synthetic"))
        if not best or row.compiled and (gain or 0) <= COMPILE_GAIN or row.res and any(
                r.get("loader") == best["loader"] and r.get("res") for r in ctx.done.values()):
            return None
        loader, workers = best["loader"], best.get("jobs", workers)
    decode = ["--decode-device", "cpu-nvimgcodec" if s.dry_run else "cuda"] \
        if "gpudecode" in loader else []
    if row.kind == "train":
        model = "resnet18" if s.dry_run else row.model  # standing in on the CPU
        rec = measure.train_row(ctx.runner, s, ctx.data, machine, model, loader, row.compiled,
                                res, [*row.extra, *decode], row.name, workers, limit)
        rec.update(model=row.model, arch=model, **({"speedup": judge.ratio(rec, best)}
                                                   if best else {}))
    else:
        flags = measure.loader_flags(loader, ctx.data, machine)
        if isinstance(flags, str):
            return skipped(row.name, flags, loader=loader)
        flags = [*flags, *row.extra, *decode] + (["--train-crop-size", str(res)] if res else [])
        rec = measure.loader_row(ctx.runner, s, machine, loader, flags, workers, row.name,
                                 limit, row.timed)
    if decode:
        rec = probes.on_gpu(ctx.runner, s, machine, rec)
    if loader.startswith("dali") and rec.get("status") == "passed":
        rec["decoder"] = "DALI CPU" if "--dali-cpu" in row.extra or s.dry_run else "DALI mixed"
    return rec


def run_dali_probe(ctx, row: Row, limit: float) -> dict:
    if not ctx.machine.get("dali"):
        return skipped(row.name, "not installed")
    return probes.dali_probe(ctx.runner, ctx.s, limit)


def run_memory(ctx, row: Row, limit: float) -> dict:
    flags = measure.loader_flags("dali-lmdb", ctx.data, ctx.machine)
    if isinstance(flags, str):
        return skipped(row.name, flags)
    return measure.memory_row(ctx.runner, ctx.s, flags, limit)
