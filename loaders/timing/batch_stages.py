"""Where the time goes in the pipelines that decode whole batches (``--decode-device``, DALI): the
*readers* (DataLoader workers, or DALI's feed threads) read and draw windows, the *batch decoder*
(the training process) decodes, resizes, flips and hands over (for DALI: waits for its output).
:class:`BatchStageLog` sums them in :class:`~loaders.timing.stages.StageLog`'s shape."""
from __future__ import annotations

import threading
import time

import numpy as np

from .stages import MIDDLES_MS, STAGES, ms_bins, p50_p90, quantiles, worker_figures


def no_clock() -> float:
    """Reads 0.0: a stand-in for ``time.perf_counter`` while a pipeline's stages go unmeasured."""
    return 0.0


def thread_cpu() -> float:
    """This thread's CPU seconds: a feed or decode thread's own, apart from the training
    thread's."""
    return time.thread_time()


class BatchStageLog:
    """An epoch's stage figures of a batch pipeline with ``stages`` (of
    :data:`loaders.timing.stages.STAGES`; others raise ``ValueError``), where its batch decoder
    runs (``decoder_name``) and what its readers are; ``rated``: whether the slower side is the
    pipeline's rate (False for DALI, whose decode is unmeasured). Thread-safe."""

    def __init__(self, stages: tuple[str, ...], decoder_name: str, rated: bool = True,
                 readers_name: str = "workers"):
        unknown = set(stages) - set(STAGES)
        if unknown:
            raise ValueError(f"unknown stages {sorted(unknown)}: not in {STAGES}")
        self.stages, self.decoder_name, self.rated = tuple(stages), decoder_name, rated
        self.readers_name = readers_name
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Forget everything counted so far."""
        with self._lock:
            self.hist = {s: np.zeros(len(MIDDLES_MS), dtype=np.int64) for s in self.stages}
            self.sums = {s: 0.0 for s in self.stages}  # seconds
            self.counts = {s: 0 for s in self.stages}  # images
            # reader id -> batches, images, wall s, cpu s, the stages' sum s, bytes
            self.readers: dict[int, np.ndarray] = {}
            self.decoder = np.zeros(3)  # images, wall s, cpu s of the batch decoder side
            self.copies: list[float] = []  # hand-over seconds per batch
            self.waits: list[float] = []  # seconds the training thread waited (DALI's run)

    def add(self, stage: str, seconds) -> None:
        """Per-image seconds (array-like) of ``stage`` for a batch's images."""
        seconds = np.asarray(seconds, dtype=np.float64).reshape(-1)
        bins = ms_bins(seconds)
        with self._lock:
            self.hist[stage] += np.bincount(bins, minlength=len(MIDDLES_MS))
            self.sums[stage] += float(seconds.sum())
            self.counts[stage] += len(seconds)

    def add_batch(self, stage: str, seconds: float, count: int) -> None:
        """A batch-wide ``stage`` (one call, ``count`` images) of ``seconds``, as equal shares."""
        if count > 0:
            self.add(stage, np.full(count, seconds / count))

    def add_reader(self, reader: int, images: int, wall: float, cpu: float, staged: float,
                   nbytes: float = 0.0) -> None:
        """One batch read by reader ``reader`` (worker id, or feed number): ``wall``, ``cpu`` and
        ``staged`` (its per-image stages' sum) seconds, and the records' ``nbytes``."""
        with self._lock:
            sums = self.readers.setdefault(reader, np.zeros(6))
            sums += (1, images, wall, cpu, staged, nbytes)

    def add_hand_over(self, count: int, timing: dict, wall: float, cpu: float,
                      wait: float | None = None) -> None:
        """One batch of ``count`` images through the batch decoder: ``timing``'s batch-wide
        stages (seconds by name, ``"copy"`` the hand-over's), ``wall`` and thread ``cpu``
        seconds, and the training thread's ``wait`` for it (DALI's ``run()``)."""
        for stage in self.stages:
            if stage in timing:
                self.add_batch(stage, timing[stage], count)
        with self._lock:
            self.copies.append(timing["copy"])
            if wait is not None:
                self.waits.append(wait)
            self.decoder += (count, wall, cpu)

    def _stage(self, name: str) -> dict | None:
        if name not in self.stages or not self.counts[name]:
            return None
        p50, p90 = quantiles(self.hist[name])
        return {"mean": 1e3 * self.sums[name] / self.counts[name], "p50": p50, "p90": p90}

    def summary(self) -> dict:
        """The figures so far with :meth:`loaders.timing.stages.StageLog.summary`'s keys, except:
        ``stages[name]`` is None for a stage not had or not yet measured; ``stages["total"]`` is
        the sum of the means, without p50/p90 (the sides time different images); ``decoders`` is
        empty and ``sizes`` None; ``workers`` are the readers (named by ``readers``;
        ``slot_wait_ms`` None; a feed thread's ``cpu_share`` is its own); ``batch_decoder``:
        ``{"where", "images", "ms_per_image", "images_per_sec", "thread_cpu_share"}`` or None;
        ``loader_images_per_sec``: the slower side (None unless ``rated``); ``wait_ms_per_batch``:
        ``{"p50", "p90"}`` of waits for DALI, or None."""
        with self._lock:
            stages = {name: self._stage(name) for name in STAGES}
            present = [s["mean"] for s in stages.values() if s is not None]
            stages["total"] = {"mean": sum(present) if present else None, "p50": None,
                               "p90": None}
            workers = [worker_figures(rid, images, wall, cpu, staged, None)
                       for rid, (_, images, wall, cpu, staged, _) in sorted(self.readers.items())]
            read_images = sum(int(s[1]) for s in self.readers.values())
            read_wall = sum(s[2] for s in self.readers.values())
            images, wall, cpu = self.decoder
            decoder = None if not images else {
                "where": self.decoder_name, "images": int(images),
                "ms_per_image": 1e3 * wall / images,
                "images_per_sec": images / wall if wall > 0 else None,
                "thread_cpu_share": cpu / wall if wall > 0 else None}
            rates = [r for r in (sum(w["images_per_sec"] or 0 for w in workers) or None,
                     decoder and decoder["images_per_sec"]) if r]
            return {"images": int(images) or read_images, "stages": stages, "decoders": {},
                    "workers": workers, "readers": self.readers_name,
                    "worker_ms_per_image": 1e3 * read_wall / read_images if read_images
                    else None,
                    "batch_decoder": decoder,
                    "loader_images_per_sec": min(rates) if rates and self.rated else None,
                    "sizes": None,
                    "kb_per_image": sum(s[5] for s in self.readers.values())
                    / max(read_images, 1) / 1024,
                    "copy_ms_per_batch": p50_p90(self.copies),
                    "wait_ms_per_batch": p50_p90(self.waits) if self.waits else None}


class StagedLoader:
    """:meth:`stage_summary` and :meth:`reset_stages` of a loader with a ``stage_log`` (None where
    nothing is measured) and a ``workers_configured`` count."""

    stage_log: BatchStageLog | None = None
    workers_configured = 0

    def stage_summary(self, reset: bool = True) -> dict | None:
        """The log's ``summary()`` since the last reset (with ``workers_configured``), then reset
        if ``reset``; None where nothing is measured (validation, ``IMAGENET_FAST_STAGES=0``)."""
        if self.stage_log is None:
            return None
        figures = {**self.stage_log.summary(), "workers_configured": self.workers_configured}
        if reset:
            self.stage_log.reset()
        return figures

    def reset_stages(self) -> None:
        """Forget the stage figures so far (e.g. after a benchmark's warm-up batches)."""
        if self.stage_log is not None:
            self.stage_log.reset()
