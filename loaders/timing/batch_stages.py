"""Where the time goes in the pipelines that decode a whole batch at once:
``--decode-device`` (``loaders.pipelines.gpu_decode``) and DALI (``loaders.pipelines.dali``).

Their work is split between two sides, unlike the DataLoader-workers pipeline's
(:mod:`loaders.timing.stages`), where one worker does every stage of an image:

* the *readers*: DataLoader workers (``--decode-device``) or feed threads (DALI) that read each
  record and draw its window; per image the ``read`` and ``window`` seconds, per batch the
  reader's wall and CPU seconds (a worker's process CPU time; a feed thread's own thread CPU
  time);
* the *batch decoder*: the training process's side that turns a batch into the model's
  tensor: the decode thread's ``decode`` call, ``resize``, flip (``augment``) and hand-over
  (normalisation and copy, ``copy_ms_per_batch``) for ``--decode-device``; for DALI the
  training thread's wait for DALI's output (decode and, on CUDA, resize are inside DALI's graph
  and not measured apart) and, CPU-only, torch's resize, flip and policy and normalisation.

:class:`BatchStageLog` keeps the same figures as :class:`loaders.timing.stages.StageLog` where they
exist and gives a :meth:`~BatchStageLog.summary` of the same shape, so ``engine.report.bounds`` makes
its table, bound and advice from either; a stage a pipeline does not have is None, never a
zero. Batch-wide stages (one call for the batch) are counted as each image's equal share of the
batch's seconds, so their p50/p90 are over batches. ``IMAGENET_FAST_STAGES=0``
(:func:`loaders.timing.stages.enabled`) switches them off: the pipelines then make no log.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from .histogram import MIDDLES_MS, ms_bins, p50_p90, quantiles
from .stages import STAGES, read_event_pairs


def no_clock() -> float:
    """A clock that always reads 0.0: a pipeline's stand-in for ``time.perf_counter`` while its
    stages are not measured, so its timed code runs unchanged without the clock calls."""
    return 0.0


def thread_cpu() -> float:
    """This thread's CPU seconds so far (``time.thread_time``): a feed or decode thread's own
    CPU time, which the process's CPU time would mix with the training thread's."""
    return time.thread_time()


class BatchStageLog:
    """An epoch's stage figures of a batch pipeline whose stages are ``stages`` (names of
    :data:`loaders.timing.stages.STAGES`); ``decoder_name`` says where the batch decoder side runs
    (for the table), ``readers_name`` what its readers are (``"workers"``, ``"feed
    threads"``); ``rated``: whether the slower of the readers and the batch decoder side
    is the pipeline's rate (False for DALI, whose decode runs in its own threads, unmeasured:
    ``loader_images_per_sec`` is then None rather than a rate that leaves it out).
    Thread-safe: feed threads add while the training thread adds and reads. :meth:`reset`
    starts anew (each epoch)."""

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
            self._pending: list = []  # CUDA (start, end) event pairs not yet read

    def add(self, stage: str, seconds) -> None:
        """Per-image seconds (array-like) of ``stage`` for a batch's images."""
        seconds = np.asarray(seconds, dtype=np.float64).reshape(-1)
        bins = ms_bins(seconds)
        with self._lock:
            self.hist[stage] += np.bincount(bins, minlength=len(MIDDLES_MS))
            self.sums[stage] += float(seconds.sum())
            self.counts[stage] += len(seconds)

    def add_batch(self, stage: str, seconds: float, count: int) -> None:
        """A batch-wide ``stage`` (one call for ``count`` images) that took ``seconds``:
        counted as ``count`` equal shares."""
        if count > 0:
            self.add(stage, np.full(count, seconds / count))

    def add_reader(self, reader: int, images: int, wall: float, cpu: float, staged: float,
                   nbytes: float = 0.0) -> None:
        """One batch read by reader ``reader`` (worker id, or feed number): its ``images``,
        ``wall`` and ``cpu`` seconds, ``staged`` (its per-image stages' seconds summed) and
        the records' ``nbytes``."""
        with self._lock:
            sums = self.readers.setdefault(reader, np.zeros(6))
            sums += (1, images, wall, cpu, staged, nbytes)

    def add_decoder(self, images: int, wall: float, cpu: float) -> None:
        """One batch of ``images`` through the batch decoder side: ``wall`` and this thread's
        ``cpu`` seconds."""
        with self._lock:
            self.decoder += (images, wall, cpu)

    def add_hand_over(self, count: int, timing: dict, wall: float, cpu: float,
                      wait: float | None = None) -> None:
        """One batch of ``count`` images through the batch decoder side: ``timing``'s
        batch-wide stages (seconds by stage name, ``"copy"`` the hand-over's), the side's
        ``wall`` and thread ``cpu`` seconds, and ``wait``, the training thread's wait for it
        (DALI)."""
        for stage in self.stages:
            if stage in timing:
                self.add_batch(stage, timing[stage], count)
        self.add_copy(timing["copy"])
        if wait is not None:
            self.add_wait(wait)
        self.add_decoder(count, wall, cpu)

    def add_wait(self, seconds: float) -> None:
        """Seconds the training thread waited for one batch's output (DALI's ``run()``)."""
        with self._lock:
            self.waits.append(seconds)

    def add_copy(self, seconds: float | None = None, events=None) -> None:
        """One batch's hand-over: ``seconds`` of wall time, or a ``(start, end)`` pair of
        CUDA events (``enable_timing=True``) read once the end has completed."""
        with self._lock:
            if events is not None:
                self._pending.append(events)
            else:
                self.copies.append(seconds)

    def _stage(self, name: str) -> dict | None:
        if name not in self.stages or not self.counts[name]:
            return None
        p50, p90 = quantiles(self.hist[name])
        return {"mean": 1e3 * self.sums[name] / self.counts[name], "p50": p50, "p90": p90}

    def summary(self) -> dict:
        """The figures so far, :meth:`loaders.timing.stages.StageLog.summary`'s keys (ms per image
        unless named) with these differences: ``stages[name]`` is None for a stage this
        pipeline does not have (or has not measured yet); ``stages["total"]`` has the sum of
        the stages' means and no p50/p90 (the two sides time different images at different
        moments); ``decoders`` is empty and ``sizes`` None (no per-image decode time);
        ``workers`` are the readers, named by ``readers`` (``slot_wait_ms`` None: no slots;
        empty when they read everything before the last reset), ``cpu_share`` being a
        feed thread's own CPU time where the readers are threads; ``batch_decoder``:
        ``{"where", "images", "ms_per_image" (wall), "images_per_sec", "thread_cpu_share"
        (that thread's own CPU time over its wall time; the decoding libraries' and torch's
        pool threads are not counted)}`` or None; ``loader_images_per_sec``: the slower of the
        readers (summed) and the batch decoder (None unless ``rated``);
        ``wait_ms_per_batch``: ``{"p50", "p90"}`` of the training thread's waits for DALI's
        output (None elsewhere)."""
        with self._lock:
            self._pending = read_event_pairs(self._pending, self.copies, wait=True)
            stages = {name: self._stage(name) for name in STAGES}
            present = [s["mean"] for s in stages.values() if s is not None]
            stages["total"] = {"mean": sum(present) if present else None, "p50": None,
                               "p90": None}
            workers = [_reader(rid, sums) for rid, sums in sorted(self.readers.items())]
            read_images = sum(int(s[1]) for s in self.readers.values())
            read_wall = sum(s[2] for s in self.readers.values())
            decoder = self._decoder()
            rates = [r for r in (sum(w["images_per_sec"] or 0 for w in workers) or None,
                     decoder and decoder["images_per_sec"]) if r]
            images = int(self.decoder[0]) or read_images
            return {"images": images, "stages": stages, "decoders": {}, "workers": workers,
                    "readers": self.readers_name,
                    "worker_ms_per_image": 1e3 * read_wall / read_images if read_images
                    else None,
                    "batch_decoder": decoder,
                    "loader_images_per_sec": min(rates) if rates and self.rated else None,
                    "sizes": None,
                    "kb_per_image": sum(s[5] for s in self.readers.values())
                    / max(read_images, 1) / 1024,
                    "copy_ms_per_batch": p50_p90(self.copies),
                    "wait_ms_per_batch": p50_p90(self.waits) if self.waits else None}

    def _decoder(self) -> dict | None:
        images, wall, cpu = self.decoder
        if not images:
            return None
        return {"where": self.decoder_name, "images": int(images),
                "ms_per_image": 1e3 * wall / images,
                "images_per_sec": images / wall if wall > 0 else None,
                "thread_cpu_share": cpu / wall if wall > 0 else None}


def _reader(rid: int, sums: np.ndarray) -> dict:
    batches, images, wall, cpu, staged, _ = sums
    return {"id": rid, "images": int(images), "ms_per_image": 1e3 * wall / max(images, 1),
            "stages_ms_per_image": 1e3 * staged / max(images, 1),
            "images_per_sec": images / wall if wall > 0 else None,
            "cpu_share": cpu / wall if wall > 0 else None, "slot_wait_ms": None}


class StagedLoader:
    """:meth:`stage_summary` and :meth:`reset_stages` of a loader with a ``stage_log`` (a
    :class:`BatchStageLog`, or the workers pipeline's :class:`loaders.timing.stages.StageLog`; None
    where nothing is measured) and a ``workers_configured`` count."""

    stage_log: BatchStageLog | None = None
    workers_configured = 0

    def stage_summary(self, reset: bool = True) -> dict | None:
        """The log's ``summary()`` since the last reset (with ``workers_configured``),
        then reset if ``reset``; None where nothing is measured (validation,
        ``IMAGENET_FAST_STAGES=0``)."""
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
