"""The lease plan (``python -m tools.gpu_check --lease``, docs/gpu-check.md): its rows (name,
group, time box, what it runs) and the clock of a borrowed GPU, in seconds of machine time.

Groups, in order and priority: 0 the set-up; 1 the decode probes; 2 the synthetic denominators;
3 ``--decode-device cuda``; 4 the CPU loaders at every core and one less; 5 DALI (after its
parts have come); 6 only if time remains, in the last call. Groups 1-4 run in call 1.
"""
from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatch
from types import SimpleNamespace
from typing import Callable

from ..rows import lease as r
from ..rows.lease import jobs
from ..rows.base import steady_sizes, workers_count

# The device tool's limits: 15 minutes of machine time, a start of 1-2 minutes (1-2 more when a
# first start fails), at most 30 s idle between calls, the closing idle until give_back.
LEASE_SECONDS, START_SECONDS, FALLBACK_SECONDS = 900.0, 60.0, 120.0
GAP_SECONDS, CLOSE_SECONDS = 30.0, 30.0
UPLOAD_RATE = 5 * 2**20  # bytes/s a call's files travel at (assumed)
CALL_OVERHEAD = 5.0  # a call's command without rows: Python's start, moving what it carried
CALL_SECONDS = 520.0  # one command's own limit, under the device tool's 540 s timeout_s
CALL1_DEADLINE, CALL1_WALL = 480.0, 420.0  # call 1: back within 8 min, start included; 7 min
# Measured on one H100 host (16 cores): images/s of ResNet-50 on synthetic data at 224 and
# 160 px, and of the CPU loaders with 8 workers (the floor for every loader); assumed: one CPU
# decode thread (~2 ms per image), a process's start, its CUDA context with cuDNN's tuning (a
# loader alone tunes nothing), LMDB writes (bytes/s), pip unpacking (bytes of wheel/s).
RATES = {"synthetic": 4909.0, "synthetic-160": 7987.0, "loader": 2900.0, "one-thread": 500.0}
PROCESS_START, CUDA_START, CUDA_START_ALONE = 5.0, 10.0, 3.0
DISK_RATE, UNPACK_RATE = 200e6, 10e6
GPU = SimpleNamespace(steps=200, warmup=5, batch=256, workers="auto", dry_run=False)
GPU_MACHINE = {"cpu_cores": 16, "gpu_count": 1}
SETUP_EXPECT = {"install": 10.0, "environment": 15.0, "data": 50.0, "install-dali": 45.0}


@dataclass(frozen=True)
class Row:
    """One row of the plan; ``run(ctx)`` returns its record. ``kind``: ``main`` (a main.py run
    of ``loader`` with ``workers``: ``all``, ``less`` or a number; alone or training; ``timed``
    batches if not the steady default, at ``rate``) or ``plain`` (``expect_plain`` seconds);
    ``needs_dali``: waits for DALI's parts; ``core``: DALI's calls are worth making only when
    the time left covers this row."""

    name: str
    group: int
    box: float
    run: Callable[[SimpleNamespace], dict]
    kind: str = "main"
    loader: str = "synthetic"
    workers: str = "all"
    alone: bool = False
    timed: int | None = None
    rate: str = "loader"
    expect_plain: float = 0.0
    needs_dali: bool = False
    core: bool = True

    def gpu_batches(self) -> int:
        """Batches this row reads on one H100 host (warm-up + timed)."""
        workers = workers_count(jobs(self.workers, GPU, GPU_MACHINE), GPU_MACHINE)
        return sum(steady_sizes(GPU, self.loader, workers, self.alone, self.timed))

    @property
    def cuda_start(self) -> float:
        return CUDA_START_ALONE if self.alone else CUDA_START

    @property
    def expect(self) -> float:
        """Seconds this row should take on one H100 host: process and CUDA start plus its
    :meth:`gpu_batches` at :data:`RATES`."""
        if self.kind != "main":
            return self.expect_plain
        return PROCESS_START + self.cuda_start + self.gpu_batches() * GPU.batch / RATES[self.rate]


def plan_rows() -> list[Row]:
    """Every row of the lease plan in order (the set-up rows aside). Rows named ``resnet50``
    train ResNet-50 on a GPU and ResNet-18 standing in for it in a rehearsal."""
    m = "resnet50"
    gd, dl = "gpudecode-lmdb", "dali-lmdb"
    return [
        Row("gpu-decode-probe", 1, 120, r.decode_probe, kind="plain", expect_plain=12),
        Row("gpu-decode-hardware", 1, 60, r.decode_hardware, kind="plain", expect_plain=5),
        Row(f"train-{m}-synthetic", 2, 120, r.train(), rate="synthetic"),
        Row(f"train-{m}-synthetic-160px", 2, 120, r.train(res=True), rate="synthetic-160"),
        Row("loader-gpudecode-j4", 3, 120, r.alone(gd), loader=gd, workers="4", alone=True),
        Row("loader-gpudecode-j4-160px", 3, 120, r.alone(gd, res=True), loader=gd,
            workers="4", alone=True),
        Row(f"train-{m}-gpudecode-lmdb", 3, 150, r.train(gd), loader=gd, workers="4"),
        Row(f"train-{m}-gpudecode-lmdb-160px", 3, 150, r.train(gd, res=True), loader=gd,
            workers="4"),
        Row("loader-lmdb-jall", 4, 120, r.alone("lmdb"), loader="lmdb", alone=True),
        Row("loader-lmdb-jless", 4, 120, r.alone("lmdb"), loader="lmdb", workers="less",
            alone=True),
        Row(f"train-{m}-lmdb-jall", 4, 150, r.train("lmdb"), loader="lmdb"),
        Row(f"train-{m}-lmdb-jless", 4, 150, r.train("lmdb"), loader="lmdb", workers="less"),
        Row("dali-gpu-decode", 5, 60, r.dali_probe, kind="plain", expect_plain=10,
            needs_dali=True),
        Row("loader-dali-mixed-j1", 5, 90, r.alone(dl), loader=dl, workers="1", alone=True,
            timed=5, needs_dali=True),
        Row("loader-dali-cpu-j1", 5, 90, r.alone(dl, extra=["--dali-cpu"]), loader=dl,
            workers="1", alone=True, timed=5, rate="one-thread", needs_dali=True),
        Row("loader-dali-lmdb", 5, 120, r.alone(dl), loader=dl, alone=True, needs_dali=True),
        Row(f"train-{m}-dali-lmdb", 5, 150, r.train(dl), loader=dl, needs_dali=True),
        Row("loader-dali-lmdb-160px", 5, 120, r.alone(dl, res=True), loader=dl, alone=True,
            needs_dali=True, core=False),
        Row(f"train-{m}-dali-lmdb-160px", 5, 150, r.train(dl, res=True), loader=dl,
            needs_dali=True, core=False),
        *group_six(m),
    ]


def group_six(m: str) -> list[Row]:
    """The rows that run only when time remains after groups 1-5, in the last call."""
    gd, dl = "gpudecode-lmdb", "dali-lmdb"
    return [
        Row("loader-gpudecode-hw0.9", 6, 120, r.alone(gd, extra=["--hw-decoder-load", "0.9"]),
            loader=gd, workers="4", alone=True),
        Row("loader-dali-hw0.9", 6, 120, r.alone(dl, extra=["--dali-hw-decoder-load", "0.9"]),
            loader=dl, alone=True, needs_dali=True),
        Row("dali-memory", 6, 240, r.dali_memory, kind="plain", expect_plain=60,
            needs_dali=True),
        Row("pytest-test_gpu_decode_cuda", 6, 300, r.pytest(
            "tests/loaders/test_gpu_decode_cuda.py"), kind="plain", expect_plain=90),
        Row("pytest-test_gpu_dali", 6, 300, r.pytest("tests/loaders/test_gpu_dali.py"),
            kind="plain", expect_plain=90, needs_dali=True),
        Row("pytest-test_gpu", 6, 420, r.pytest("tests/engine/test_gpu.py"), kind="plain",
            expect_plain=150),
        Row(f"train-{m}-synthetic-compile", 6, 420, r.compiled, kind="plain",
            expect_plain=150),
        Row("train-resnet18-synthetic", 6, 120, r.train(model="resnet18"), rate="synthetic"),
        Row("train-resnet18-gpudecode-lmdb", 6, 150, r.train(gd, model="resnet18"), loader=gd,
            workers="4"),
    ]


def select(rows: list[Row], names: list[str] | None) -> list[Row]:
    """``rows`` whose names match one of ``names`` (``fnmatch`` patterns; None: all), in the
    plan's order. Raises ``ValueError`` naming a pattern that matches nothing."""
    if names is None:
        return rows
    for pattern in names:
        if not any(fnmatch(r.name, pattern) for r in rows):
            raise ValueError(f"--rows {pattern}: no row of the plan matches "
                             f"({', '.join(r.name for r in rows)})")
    return [r for r in rows if any(fnmatch(r.name, p) for p in names)]


def gpu_seconds(row: Row | None, record: dict, dry_run: bool) -> float:
    """Seconds a row recorded here (``row`` None for the set-up rows, which carry ``bytes``)
    would take on an H100 host: on a GPU its measured ``seconds``. In a rehearsal its
    ``cpu_seconds`` (wall seconds mostly wait for shared cores), plus a ``main`` row's CUDA
    start and H100 batches at its rate, or ``bytes`` at :data:`DISK_RATE` (the data row) or
    :data:`UNPACK_RATE` (an install)."""
    if not dry_run:
        return float(record.get("seconds") or 0.0)
    work = float(record.get("cpu_seconds") if record.get("cpu_seconds") is not None
                 else record.get("seconds") or 0.0)
    if row is not None and row.kind == "main" and record.get("status") != "skipped":
        return work + row.cuda_start + row.gpu_batches() * GPU.batch / RATES[row.rate]
    rate = DISK_RATE if record.get("name") == "data" else UNPACK_RATE
    return work + float(record.get("bytes") or 0) / rate


def gpu_lmdb_bytes(image_sizes: list[int]) -> int:
    """Bytes of the LMDB an H100 host writes: the mean of ``image_sizes`` times the images of
    :func:`.rows.data_batches` batches of 256."""
    from ..rows.base import data_batches

    mean = sum(image_sizes) / max(1, len(image_sizes))
    return int(mean * data_batches(GPU, GPU_MACHINE) * GPU.batch)


def upload_seconds(nbytes: int) -> float:
    return nbytes / UPLOAD_RATE


def remaining_need(call_bytes: list[int], after: int, rows: list[Row]) -> float:
    """Machine seconds the calls after call ``after`` need (``call_bytes[k - 1]``: call k's
    bytes) to be worth making: each a gap, its upload and :data:`CALL_OVERHEAD`, then DALI's
    install and the core group-5 ``rows``, and the closing idle."""
    later = call_bytes[after:]
    return (sum(GAP_SECONDS + upload_seconds(b) + CALL_OVERHEAD for b in later)
            + SETUP_EXPECT["install-dali"]
            + sum(r.expect for r in rows if r.group == 5 and r.core) + CLOSE_SECONDS)
