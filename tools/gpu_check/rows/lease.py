"""What each row of the lease plan (:mod:`tools.gpu_check.lease.plan`) runs: builders of ``run(ctx)`` over the full
check's row makers. ``ctx`` holds ``runner``, settings ``s``, ``machine``, ``data``, the plan
``row`` and its time box ``limit`` (seconds)."""
from __future__ import annotations

from . import dali as dali_rows
from . import gpu_decode as decode_rows
from .base import LOW_RES, loader_flags, loader_row, pytest_piece, train_row
from ..runner import skipped


def jobs(spec: str, s, machine: dict) -> str:
    """``-j`` of a row: ``all`` is ``s.workers``; ``less`` every core but one (``1`` in a dry
    run); a number is itself (``s.workers`` in a dry run, which loads in-process)."""
    if spec == "all":
        return s.workers
    if spec == "less":
        return "1" if s.dry_run else str(max(1, (machine.get("cpu_cores") or 2) - 1))
    return s.workers if s.dry_run and spec != "1" else spec


def _decode_flags(loader: str, ctx) -> list[str]:
    return ["--decode-device", "cpu-nvimgcodec" if ctx.s.dry_run else "cuda"] \
        if "gpudecode" in loader else []


def _low(ctx) -> int:
    return 16 if ctx.s.dry_run else LOW_RES  # a dry run trains at 32 px


def train(loader: str = "synthetic", res: bool = False, model: str | None = None):
    """A training row of ``loader`` (``model`` None: the plan's); GPU-decode rows get their
    decoder checked (:func:`.decode_rows.on_gpu`)."""
    def run(ctx):
        rec = train_row(ctx.runner, ctx.s, ctx.data, ctx.machine, model or ctx.model, loader,
                        res=_low(ctx) if res else None, extra=_decode_flags(loader, ctx),
                        name=ctx.row.name, workers=jobs(ctx.row.workers, ctx.s, ctx.machine),
                        timeout=ctx.limit)
        if "gpudecode" in loader:
            rec = decode_rows.on_gpu(ctx.runner, ctx.s, ctx.machine, rec)
        return rec
    return run


def alone(loader: str, res: bool = False, extra: list[str] = ()):
    """A loader-alone row (``--benchmark-data``) of ``loader`` with ``extra`` flags."""
    def run(ctx):
        flags = loader_flags(loader, ctx.data, ctx.machine)
        if isinstance(flags, str):
            return skipped(ctx.row.name, flags, loader=loader)
        flags = [*flags, *extra, *_decode_flags(loader, ctx)] + (
            ["--train-crop-size", str(_low(ctx))] if res else [])
        rec = loader_row(ctx.runner, ctx.s, ctx.machine, loader, flags,
                         jobs(ctx.row.workers, ctx.s, ctx.machine), ctx.row.name,
                         timeout=ctx.limit, timed=ctx.row.timed)
        if "gpudecode" in loader:
            rec = decode_rows.on_gpu(ctx.runner, ctx.s, ctx.machine, rec)
        if loader.startswith("dali"):
            rec["decoder"] = "DALI CPU" if "--dali-cpu" in extra or ctx.s.dry_run \
                else "DALI mixed"
        return rec
    return run


def decode_probe(ctx) -> dict:
    return decode_rows.probe(ctx.runner, ctx.s, ctx.data, ctx.limit)


def decode_hardware(ctx) -> dict:
    return decode_rows.hardware(ctx.runner, ctx.s, ctx.data, ctx.machine, ctx.limit)


def dali_probe(ctx) -> dict:
    if not ctx.machine.get("dali"):
        return skipped("dali-gpu-decode", "not installed")
    return dali_rows.decode_probe(ctx.runner, ctx.s, ctx.limit)


def dali_memory(ctx) -> dict:
    flags = loader_flags("dali-lmdb", ctx.data, ctx.machine)
    if isinstance(flags, str):
        return skipped("dali-memory", flags)
    return dali_rows.memory_row(ctx.runner, ctx.s, flags)


def pytest(path: str):
    def run(ctx):
        return pytest_piece(ctx.runner, path, ctx.sample, ctx.limit)
    return run


def compiled(ctx) -> dict:
    if ctx.s.dry_run:
        return skipped(ctx.row.name, "dry run: no torch.compile timing on the CPU")
    return train_row(ctx.runner, ctx.s, ctx.data, ctx.machine, ctx.model, "synthetic",
                     compiled=True, name=ctx.row.name, timeout=ctx.limit)
