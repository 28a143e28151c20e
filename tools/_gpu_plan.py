"""The lease plan's rows (``python -m tools.gpu_check --lease``, docs/gpu-check.md): each
declared once here with its name, group (the order and priority of issue 45: 1 probe, 2 the
synthetic denominators, 3 ``--decode-device cuda``, 4 the CPU loaders, 5 DALI, 6 only if time
remains; 0 the set-up), time box, expected seconds on an H100 and the command, which the
check's own row builders make (``_gpu_rows``, ``_gpu_decode``, ``_gpu_dali``).

Times are seconds. ``box`` is the most a row may run (then "timed out"); ``expect`` what it
should take on one H100 with 16 cores, which the plan adds up to fit 15 minutes of machine
time. The rehearsal (``--rehearse``) measures every row here on the CPU backends and scales
its seconds to an H100 as :func:`gpu_seconds` states; on a GPU measured seconds are used as
they are.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

from . import _gpu_dali, _gpu_decode
from ._gpu_rows import loader_flags, loader_row, train_row
from ._gpu_runner import skipped

# Machine time of one lease (docs/gpu-check.md): 15 minutes in all, 2 of them for the start,
# and what each call costs beyond its command (sending up to 64 MiB, the reply, the next call).
LEASE_SECONDS, START_SECONDS, CALL_OVERHEAD = 900.0, 120.0, 10.0
# The set-up rows' expected seconds on an H100: wheels unpacked, the environment probe (torch
# import and CUDA start), the sample linked and written as a 1.5 GB LMDB by 16 processes.
SETUP_EXPECT = {"install": 15.0, "environment": 15.0, "data": 45.0, "install-dali": 40.0}
CORE_DEADLINE = 780.0  # rows 1-5 end within 13 minutes, start included (issue 45)
CALL_SECONDS = 520.0  # one command's own limit, under the device tool's 540 s per call
# Scaling a rehearsal's seconds to an H100 (gpu_seconds): a main.py run there also creates
# its CUDA context and tunes cuDNN, and moves images at these rates (images/s, the first H100
# run: ResNet-50 synthetic 4,909 at 224 px and 7,987 at 160 px; the CPU loaders 2,900 with 8
# workers, the floor assumed for every loader); the LMDB is written at DISK_RATE bytes/s and
# pip installs UNPACK_RATE bytes of wheel per second (DALI's 199 MB wheel unpacks to about
# three times that; pip's start included).
CUDA_START = 10.0
RATES = {"synthetic": 4909.0, "synthetic-160": 7987.0, "loader": 2900.0}
DISK_RATE, UNPACK_RATE = 200e6, 10e6
GPU_BATCH, GPU_STEPS = 256, 50  # -b 256, 10 warm-up + 40 timed steps on the GPU
LOW_RES = 160  # px: FFCV's min_res, progressive resizing's first epochs


@dataclass(frozen=True)
class Row:
    """One row of the plan: ``run(ctx)`` returns its record (``_gpu_runner`` records);
    ``needs_dali``: waits for DALI's parts; ``kind``: how :func:`gpu_seconds` scales it
    (``main``: a main.py run with ``rate`` images/s on an H100; ``data``, ``wheels``,
    ``plain``)."""

    name: str
    group: int
    box: float
    expect: float
    run: Callable[[SimpleNamespace], dict]
    kind: str = "main"
    rate: str = "loader"
    needs_dali: bool = False


def _train(loader: str, res: bool = False, workers=None, extra=(), model=None, name=None,
           compiled: bool = False):
    def run(ctx):
        flags = list(extra) + (["--decode-device", ctx.gpudecode] if "gpudecode" in loader
                               else [])
        rec = train_row(ctx.runner, ctx.s, ctx.data, ctx.machine, model or ctx.model, loader,
                        compiled=compiled, res=ctx.low if res else None, extra=flags,
                        name=name or ctx.row, workers=workers(ctx) if callable(workers) else workers,
                        timeout=ctx.limit)
        return _gpu_decode.on_gpu(ctx.runner, ctx.s, rec) if "gpudecode" in loader else rec
    return run


def _loader(loader: str, name: str, workers, res: bool = False, extra=()):
    def run(ctx):
        flags = loader_flags(loader, ctx.data, ctx.machine)
        if isinstance(flags, str):
            return skipped(name, flags, loader=loader)
        flags = [*flags, *extra] + (["--decode-device", ctx.gpudecode] if "gpudecode" in loader
                                    else []) + (["--train-crop-size", str(ctx.low)] if res
                                                else [])
        rec = loader_row(ctx.runner, ctx.s, loader, flags, workers(ctx) if callable(workers)
                         else workers, name, timeout=ctx.limit)
        return _gpu_decode.on_gpu(ctx.runner, ctx.s, rec) if "gpudecode" in loader else rec
    return run


def _pytest(path: str):
    def run(ctx):
        from ._gpu_rows import pytest_piece
        return pytest_piece(ctx.runner, path, ctx.sample)
    return run


def _compiled(ctx):
    if ctx.s.dry_run:
        return skipped(f"train-{ctx.model}-synthetic-compile", "dry run: no torch.compile "
                       "timing on the CPU")
    return _train("synthetic", compiled=True)(ctx)


def _dali_probe(ctx):
    if not ctx.machine.get("dali"):
        return skipped("dali-gpu-decode", "not installed")
    return _gpu_dali.decode_probe(ctx.runner, ctx.s)


def _dali_memory(ctx):
    flags = loader_flags("dali-lmdb", ctx.data, ctx.machine)
    if isinstance(flags, str):
        return skipped("dali-memory", flags)
    return _gpu_dali.memory_row(ctx.runner, ctx.s, flags)


def _all(ctx):
    return ctx.s.workers


def _one_less(ctx):
    """-j of every core but one (``-j auto`` takes every core since issue 38): does the
    training process need a core of its own? 1 in a dry run."""
    return "1" if ctx.s.dry_run else str(max(1, (ctx.machine.get("cpu_cores") or 2) - 1))


def _four(ctx):
    return ctx.s.workers if ctx.s.dry_run else "4"  # issue 38's target: <= 4 workers


def plan_rows() -> list[Row]:
    """Every row of the lease plan in order (after the set-up rows, which the lease runs
    itself). Rows named ``resnet50`` train ResNet-50 on a GPU and ResNet-18 standing in for it
    in a rehearsal (``--dry-run`` sizes)."""
    m = "resnet50"
    return [
        Row("gpu-decode-probe", 1, 120, 20, lambda ctx: _gpu_decode.probe(
            ctx.runner, ctx.s, ctx.data, ctx.limit), kind="plain"),
        Row(f"train-{m}-synthetic", 2, 180, 40, _train("synthetic"), rate="synthetic"),
        Row(f"train-{m}-synthetic-160px", 2, 120, 30, _train("synthetic", res=True),
            rate="synthetic-160"),
        Row("loader-gpudecode-j4", 3, 120, 25, _loader("gpudecode-lmdb",
                                                       "loader-gpudecode-j4", _four)),
        Row("loader-gpudecode-j4-160px", 3, 120, 25, _loader(
            "gpudecode-lmdb", "loader-gpudecode-j4-160px", _four, res=True)),
        Row(f"train-{m}-gpudecode-lmdb", 3, 150, 35, _train("gpudecode-lmdb", workers=_four)),
        Row(f"train-{m}-gpudecode-lmdb-160px", 3, 150, 35, _train(
            "gpudecode-lmdb", res=True, workers=_four)),
        Row("loader-lmdb-jall", 4, 120, 25, _loader("lmdb", "loader-lmdb-jall", _all)),
        Row("loader-lmdb-jless", 4, 120, 25, _loader("lmdb", "loader-lmdb-jless", _one_less)),
        Row(f"train-{m}-lmdb-jall", 4, 150, 35, _train("lmdb", workers=_all,
                                                       name=f"train-{m}-lmdb-jall")),
        Row(f"train-{m}-lmdb-jless", 4, 150, 35, _train("lmdb", workers=_one_less,
                                                        name=f"train-{m}-lmdb-jless")),
        Row("dali-gpu-decode", 5, 90, 15, _dali_probe, kind="plain", needs_dali=True),
        Row("loader-dali-lmdb", 5, 120, 25, _loader("dali-lmdb", "loader-dali-lmdb", _all),
            needs_dali=True),
        Row(f"train-{m}-dali-lmdb", 5, 150, 35, _train("dali-lmdb"), needs_dali=True),
        Row(f"train-{m}-dali-lmdb-160px", 5, 150, 35, _train("dali-lmdb", res=True),
            needs_dali=True),
        Row("loader-gpudecode-hw0.9", 6, 120, 25, _loader(
            "gpudecode-lmdb", "loader-gpudecode-hw0.9", _four, extra=["--hw-decoder-load", "0.9"])),
        Row("loader-dali-hw0.9", 6, 120, 25, _loader(
            "dali-lmdb", "loader-dali-hw0.9", _all, extra=["--dali-hw-decoder-load", "0.9"]),
            needs_dali=True),
        Row("dali-memory", 6, 240, 60, _dali_memory, needs_dali=True),
        Row("pytest-test_gpu_decode_cuda", 6, 300, 90, _pytest(
            "tests/loaders/test_gpu_decode_cuda.py"), kind="plain"),
        Row("pytest-test_gpu_dali", 6, 300, 90, _pytest("tests/loaders/test_gpu_dali.py"),
            kind="plain", needs_dali=True),
        Row("pytest-test_gpu", 6, 420, 150, _pytest("tests/engine/test_gpu.py"), kind="plain"),
        Row(f"train-{m}-synthetic-compile", 6, 420, 150, _compiled, rate="synthetic"),
        Row("train-resnet18-synthetic", 6, 120, 30, _train(
            "synthetic", model="resnet18", name="train-resnet18-synthetic"), rate="synthetic"),
        Row("train-resnet18-gpudecode-lmdb", 6, 150, 35, _train(
            "gpudecode-lmdb", model="resnet18", workers=_four,
            name="train-resnet18-gpudecode-lmdb")),
    ]


def select(rows: list[Row], names: list[str] | None) -> list[Row]:
    """``rows`` whose names match one of ``names`` (``fnmatch`` patterns; None: all), in the
    plan's order. Raises ``ValueError`` naming a pattern that matches nothing."""
    if names is None:
        return rows
    from fnmatch import fnmatch
    for pattern in names:
        if not any(fnmatch(r.name, pattern) for r in rows):
            raise ValueError(f"--rows {pattern}: no row of the plan matches "
                             f"({', '.join(r.name for r in rows)})")
    return [r for r in rows if any(fnmatch(r.name, p) for p in names)]


def gpu_seconds(row_kind: str, rate: str, record: dict, dry_run: bool) -> float:
    """Seconds a row recorded here (``record``) would take on an H100. On a GPU: its
    ``seconds`` as measured. In a rehearsal (CPU backends, tiny sizes) the row's work is its
    ``cpu_seconds`` (user + system of all its processes: interpreter, torch and worker
    start-up, the tiny steps), not its wall seconds, which here mostly wait for 2 cores shared
    with other jobs; 16 idle cores do that work at least as fast. Then a ``main`` row adds
    :data:`CUDA_START` and ``GPU_STEPS x GPU_BATCH`` images at :data:`RATES`'s ``rate``;
    ``data`` adds writing ``record["bytes"]`` (the GPU's LMDB) at :data:`DISK_RATE`;
    ``wheels`` unpacking ``record["bytes"]`` at :data:`UNPACK_RATE`; ``plain`` nothing."""
    if not dry_run:
        return float(record.get("seconds") or 0.0)
    work = float(record.get("cpu_seconds") if record.get("cpu_seconds") is not None
                 else record.get("seconds") or 0.0)
    if row_kind == "main" and record.get("status") != "skipped":
        return work + CUDA_START + GPU_STEPS * GPU_BATCH / RATES[rate]
    if row_kind == "data":
        return work + float(record.get("bytes") or 0) / DISK_RATE
    if row_kind == "wheels":
        return work + float(record.get("bytes") or 0) / UNPACK_RATE
    return work


def expected_core_seconds(rows: list[Row], calls: int) -> float:
    """The plan's own estimate of when rows 1-5 end on an H100, start and ``calls`` calls'
    overhead included (what :data:`CORE_DEADLINE` bounds, before any rehearsal)."""
    return (START_SECONDS + CALL_OVERHEAD * calls + sum(SETUP_EXPECT.values())
            + sum(r.expect for r in rows if r.group <= 5))
