"""What bounds a run's speed, and what to change: pure functions over the loader's stage
figures (``loaders.timing`` summaries, stages it lacks None; None if not measured), the training
thread's :class:`Steps` (None for ``--benchmark-data``) and the :class:`Machine`, giving the
table, the bound, advice (:mod:`engine.report.advice`) and the ``stages_*`` keys of ``metrics.jsonl``."""
from __future__ import annotations

import math
from dataclasses import dataclass

from engine.report.advice import DATA_BOUND_WAIT, _per_image_ms, _present, _rate, advise, shares
from engine.settings import node_cores


@dataclass(frozen=True)
class Machine:
    """What the advice may change: ``cores`` this process may use, ``workers`` (``-j``), ``device``
    type, ``source`` (None: synthetic) and loader flags; ``busy_cores``: CPU seconds of this
    process tree over the epoch's wall seconds (None: not measured)."""

    cores: int
    workers: int
    device: str = "cpu"
    source: str | None = None
    pipeline: str = "workers"
    auto_augment: str | None = None
    lmdb_order: str = "random"
    busy_cores: float | None = None


def machine_for(settings, device_type: str, busy_cores: float | None = None) -> Machine:
    """The :class:`Machine` of a run with ``settings`` (a ``loaders.LoaderSettings``)."""
    return Machine(node_cores(), settings.workers, device_type, settings.source, settings.pipeline,
                   settings.auto_augment, settings.lmdb_order, busy_cores)


@dataclass(frozen=True)
class Steps:
    """The training thread's epoch: ``images``, wall ``seconds``, and per batch (seconds) the
    ``waits`` for data and the ``steps`` (wall on the CPU, CUDA-event time on a GPU)."""

    images: int
    seconds: float
    waits: list
    steps: list

    @property
    def wait_share(self) -> float:
        return sum(self.waits) / self.seconds if self.seconds > 0 else 0.0

    @property
    def model_images_per_sec(self) -> float | None:
        """Images/s of the training step alone (what the model takes)."""
        busy = sum(self.steps)
        return self.images / busy if busy > 0 else None


def _quantile(values: list, q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(math.ceil(q * len(ordered))) - 1)] if q > 0 \
        else ordered[0]


def _workers(n: int) -> str:
    return "the training process (-j 0)" if n == 0 else f"the {n} worker{'s' if n != 1 else ''}"


def _whose(loader: dict | None) -> str:
    """Whose time the stages' shares are of: a worker's, or a batch pipeline's image's."""
    if loader and loader.get("wait_ms_per_batch"):  # DALI: its decode is not among them
        return "the stages measured outside DALI"
    return "an image's measured stages" if loader and loader.get("batch_decoder") \
        else "a worker's time"


def bound(loader: dict | None, steps: Steps | None, workers: int) -> tuple[str | None, str]:
    """``(kind, line)``: ``"data"`` (waited >= :data:`DATA_BOUND_WAIT` of the epoch),
    ``"model"`` or None without ``steps``; e.g. ``"data-bound: the 8 workers can give 2,900
    images/s, the model takes 4,900; ..."``."""
    capacity = loader and loader.get("loader_images_per_sec")
    top = ""
    if loader and loader["images"]:
        stage, share = max(shares(loader).items(), key=lambda kv: kv[1])
        top = f"; {stage} is {share:.0%} of {_whose(loader)}"
    side = loader and loader.get("batch_decoder")
    who = f"{_workers(workers)} and the {side['where']}" if side else _workers(workers)
    gives = f"{who} can give {_rate(capacity)} images/s" if capacity else ""
    if steps is None:
        none = "no rate from the stages" if loader and loader["images"] else "no stage figures"
        return None, f"loader alone: {gives or none}{top}"
    takes = f"the model takes {_rate(steps.model_images_per_sec)} images/s"
    wait = f"waited for data {steps.wait_share:.0%} of the epoch"
    if steps.wait_share >= DATA_BOUND_WAIT:
        return "data", f"data-bound: {gives + ', ' if gives else ''}{takes}; {wait}{top}"
    return "model", f"model-bound: {takes}{', ' + gives if gives else ''}; {wait}{top}"


def _ms(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}"


def table(loader: dict | None, steps: Steps | None, machine: Machine) -> list[str]:
    """The log's table: each stage's ms per image (p50 / p90) and share, then workers and steps."""
    lines = []
    if loader is not None and loader["images"]:
        share = shares(loader)
        lines.append(f"stages over {loader['images']:,} images (ms per image, median / p90, "
                     f"share of {_whose(loader)}):")
        for name in _present(loader):
            st = loader["stages"][name]
            extra = ""
            if name == "decode" and loader["decoders"]:
                extra = "  (" + ", ".join(
                    f"{kind} {d['share']:.0%} of the images, {_ms(d['p50'])} ms"
                    for kind, d in loader["decoders"].items()) + ")"
            if name == "resize" and "scaled" in loader["decoders"]:
                extra = "  (the scaled decoder's resample is in decode)"
            lines.append(f"  {name:<8}{_ms(st['p50']):>8} /{_ms(st['p90']):>7}  "
                         f"{share[name]:>4.0%}{extra}")
        lines += _worker_lines(loader, machine)
    if steps is not None:
        copy = (loader or {}).get("copy_ms_per_batch") or {}
        lines.append(f"  training thread per batch (median / p90): wait "
                     f"{_ms(_quantile(steps.waits, .5) and 1e3 * _quantile(steps.waits, .5))} / "
                     f"{_ms(_quantile(steps.waits, .9) and 1e3 * _quantile(steps.waits, .9))} ms, "
                     f"copy {_ms(copy.get('p50'))} / {_ms(copy.get('p90'))} ms, step "
                     f"{_ms(_quantile(steps.steps, .5) and 1e3 * _quantile(steps.steps, .5))} / "
                     f"{_ms(_quantile(steps.steps, .9) and 1e3 * _quantile(steps.steps, .9))} ms")
    return lines


def _worker_lines(loader: dict, machine: Machine) -> list[str]:
    """The workers' (or feed threads') lines, and a batch pipeline's training-process side's."""
    measured = loader.get("worker_ms_per_image")
    workers = loader["workers"]
    images = sum(w["images"] for w in workers)
    stage_sum = (sum(w["stages_ms_per_image"] * w["images"] for w in workers) / images
                 if images else _per_image_ms(loader))
    cpu = [w["cpu_share"] for w in workers if w["cpu_share"] is not None]
    rate = sum(w["images_per_sec"] or 0 for w in workers)
    lines = []
    if loader.get("readers", "workers") != "workers":  # DALI's feed threads, not -j
        if workers:
            lines.append(f"  {loader['readers']}: stages' sum {stage_sum:.2f} ms per image of "
                         f"{_ms(measured)} measured, {_rate(rate)} images/s in all"
                         + (f", their own CPU {sum(cpu) / len(cpu):.0%} of wall time"
                            if cpu else ""))
    else:
        lines.append(f"  stages' sum {stage_sum:.2f} ms per image, the workers measured "
                     f"{_ms(measured)}" + (f" ({stage_sum / measured:.0%})" if measured else "")
                     + f"; {_workers(machine.workers)} at "
                     f"{_rate(rate / max(machine.workers, 1) if rate else None)} images/s"
                     + (" each" if machine.workers > 1 else "")
                     + (f", CPU {sum(cpu) / len(cpu):.0%} of wall time" if cpu else ""))
    side = loader.get("batch_decoder")
    if side:
        share = side["thread_cpu_share"]
        lines.append(f"  {side['where']}: {_ms(side['ms_per_image'])} ms per image, "
                     f"{_rate(side['images_per_sec'])} images/s"
                     + (f", its own CPU {share:.0%} of wall time" if share is not None else ""))
    wait = loader.get("wait_ms_per_batch")
    if wait:
        lines.append(f"  waited for DALI's output (its decode in it, not measured apart): "
                     f"{_ms(wait['p50'])} / {_ms(wait['p90'])} ms per batch")
    return lines


def report(loader: dict | None, steps: Steps | None, machine: Machine) -> dict:
    """What an epoch's end (or ``--benchmark-data``) shows: ``lines`` (table, bound and, with
    ``steps``, ``"  try ..."`` advice), ``bound``, ``advice`` (lines) and ``metrics``: flat
    ``stages_*`` keys (ms unless named; None where not measured)."""
    kind, line = bound(loader, steps, machine.workers)
    advice = advise(loader, steps, machine)
    tried = [f"  try {a}" for a in advice] if steps is not None else []
    return {"lines": table(loader, steps, machine) + [f"  {line}"] + tried, "bound": kind,
            "advice": advice, "metrics": metrics(loader, steps, machine, kind, advice)}


def metrics(loader, steps, machine: Machine, kind, advice) -> dict:
    """The flat ``stages_*`` keys of :func:`report`."""
    out = {"stages_bound": kind, "stages_advice": advice, "stages_cores": machine.cores,
           "stages_busy_cores": machine.busy_cores}
    if loader is not None and loader["images"]:
        for name in (*_present(loader), "total"):  # a stage the loader lacks: no key
            for q in ("p50", "p90", "mean"):
                out[f"stages_{name}_ms_{q}"] = loader["stages"][name][q]
        for kind_name, d in loader["decoders"].items():
            out[f"stages_decode_{kind_name}_share"] = d["share"]
            out[f"stages_decode_{kind_name}_ms_p50"] = d["p50"]
        out["stages_worker_ms_per_image"] = loader["worker_ms_per_image"]
        out["stages_loader_images_per_sec"] = loader["loader_images_per_sec"]
        cpu = [w["cpu_share"] for w in loader["workers"] if w["cpu_share"] is not None]
        out["stages_worker_cpu_share"] = sum(cpu) / len(cpu) if cpu else None
        # per worker: stages' sum over measured wall time per image (>= 95% measured)
        out["stages_worker_coverage"] = [w["stages_ms_per_image"] / w["ms_per_image"]
                                         for w in loader["workers"] if w["ms_per_image"] > 0]
        if loader["sizes"] is not None:
            out["stages_gt512_share"] = loader["sizes"]["gt512"]["share"]
        out["stages_copy_ms_p50"] = loader["copy_ms_per_batch"]["p50"]
        out["stages_copy_ms_p90"] = loader["copy_ms_per_batch"]["p90"]
        out.update(_batch_metrics(loader))
    if steps is not None:
        for name, values in (("wait", steps.waits), ("step", steps.steps)):
            for q, value in (("p50", .5), ("p90", .9)):
                v = _quantile(values, value)
                out[f"stages_{name}_ms_{q}"] = None if v is None else 1e3 * v
        out["stages_step_images_per_sec"] = steps.model_images_per_sec
        out["stages_wait_share"] = steps.wait_share
    return out


def _batch_metrics(loader: dict) -> dict:
    """A batch pipeline's ``stages_decoder_*`` and DALI's output waits; {} for workers."""
    out = {}
    side = loader.get("batch_decoder")
    if side:
        out["stages_decoder_where"] = side["where"]
        out["stages_decoder_ms_per_image"] = side["ms_per_image"]
        out["stages_decoder_images_per_sec"] = side["images_per_sec"]
        out["stages_decoder_thread_cpu_share"] = side["thread_cpu_share"]
    wait = loader.get("wait_ms_per_batch")
    if wait:
        out["stages_dali_wait_ms_p50"], out["stages_dali_wait_ms_p90"] = wait["p50"], wait["p90"]
    return out
