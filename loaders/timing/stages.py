"""Where a loader's time goes, image by image, for a few ``perf_counter`` calls each. A
DataLoader worker's :class:`StageClock` writes each image's stage seconds and each batch's worker
id, wall and CPU time into the slot's stage rows beside the pixels (no message or object per
image); the pipelines that decode whole batches (``--decode-device``, DALI) time their *readers*
(workers, or DALI's feed threads: read, window) and their *batch decoder* (the training process:
decode, resize, flip, hand-over). One :class:`StageLog` in the training process keeps the
histograms and sums of either for ``engine.report.bounds``. ``IMAGENET_FAST_STAGES=0`` switches
it all off (no clock call is made)."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import torch

# Histogram bins (ms): 1 us to 100 s, 5.9% wide: a median or p90 read from the bins' geometric
# middles is within 3% of the exact one.
EDGES_MS = 10.0 ** np.arange(-3.0, 5.0 + 1e-9, 1 / 40)
MIDDLES_MS = np.sqrt(EDGES_MS[:-1] * EDGES_MS[1:])
# A slot's per-image columns: seconds per stage, decoder code, record bytes, longer side (px)
STAGES = ("read", "window", "decode", "resize", "augment", "write")
READ, WINDOW, DECODE, RESIZE, AUGMENT, WRITE = range(len(STAGES))
KIND, BYTES, SIDE = 6, 7, 8
IMAGE_COLUMNS = 9
_ZEROS = [0.0] * IMAGE_COLUMNS
# decode.decode_crop's decoders (the scaled one's resample included); codes 1-based, 0: unknown
KINDS = ("scaled", "window", "whole", "raw")
KIND_CODES = {kind: code for code, kind in enumerate(KINDS, start=1)}
# Per-batch columns: worker id (-1: -j 0), wall s less the slot wait, process CPU s, slot wait s
WORKER, WALL, CPU, SLOT_WAIT = range(4)
BATCH_COLUMNS = 4
# Stored sizes the advice tells apart (longer side, px): a 512 px cap is FFCV's and ours.
SIZE_CLASSES = (256, 512)
SIZE_NAMES = ("le256", "le512", "gt512")
# Histogram rows: the stages, decode by decoder, the image's total (the last).
_ROWS = len(STAGES) + len(KINDS) + 1


def ms_bins(seconds: np.ndarray) -> np.ndarray:
    """The histogram bin of each of ``seconds`` (any shape; off 1 us - 100 s: the end bins)."""
    bins = np.searchsorted(EDGES_MS, seconds * 1e3, side="right") - 1
    return np.clip(bins, 0, len(MIDDLES_MS) - 1)


def p50_p90(seconds: list) -> dict:
    """``{"p50", "p90"}`` in ms of ``seconds``; None values when empty."""
    ms = np.array(seconds) * 1e3
    return {"p50": float(np.median(ms)) if len(ms) else None,
            "p90": float(np.percentile(ms, 90)) if len(ms) else None}


def enabled() -> bool:
    """Whether the stages are measured: on unless ``IMAGENET_FAST_STAGES=0``."""
    return os.environ.get("IMAGENET_FAST_STAGES", "1") != "0"


class StageClock:
    """A worker's figures for its image: ``t``, ``IMAGE_COLUMNS`` floats (seconds added)."""

    __slots__ = ("t", "started", "sampled", "_cpu")

    def __init__(self):
        self.t = [0.0] * IMAGE_COLUMNS
        self.started = self.sampled = self._cpu = 0.0  # sampled: when the slot copy began

    def begin_batch(self) -> None:
        self.started, self._cpu = time.perf_counter(), time.process_time()

    def begin_image(self) -> None:
        self.t[:] = _ZEROS

    def end_image(self, rows: np.ndarray, i: int) -> None:
        """Close image ``i`` (its slot copy begun at :attr:`sampled`) into the slot's ``rows``."""
        self.t[WRITE] += time.perf_counter() - self.sampled
        rows[i * IMAGE_COLUMNS:(i + 1) * IMAGE_COLUMNS] = self.t

    def end_batch(self, row: np.ndarray, slot_wait: float) -> None:
        """Store worker id, wall s less ``slot_wait``, CPU s and ``slot_wait`` in batch ``row``."""
        info = torch.utils.data.get_worker_info()
        row[WORKER] = -1 if info is None else info.id
        row[WALL] = time.perf_counter() - self.started - slot_wait
        row[CPU] = time.process_time() - self._cpu
        row[SLOT_WAIT] = slot_wait


def timed_transform(transform, data: bytes, frame, t: list) -> "torch.Tensor":
    """``transform(data, frame)`` of a ``loaders.transforms.TrainTransform``, each stage's seconds
    added to the image's figures ``t`` (a whole decode for the size counts as decode)."""
    import decode

    start = time.perf_counter()
    window, flip, image = transform.window(data, frame=frame)
    drawn = time.perf_counter()
    kind, pixels = decode.decode_crop(data, window, transform.size, image,
                                      transform.interpolation, frame)
    decoded = time.perf_counter()
    out = transform.resized(kind, pixels)
    resized = time.perf_counter()
    out = transform.augmented(out, flip)
    t[DECODE if image is not None else WINDOW] += drawn - start
    t[DECODE] += decoded - drawn
    t[RESIZE] += resized - decoded
    t[AUGMENT] += time.perf_counter() - resized
    t[KIND], t[SIDE] = KIND_CODES[kind], transform.side
    return out


no_clock = float  # float() is 0.0: the ``time.perf_counter`` of unmeasured stages
thread_cpu = time.thread_time  # a feed or decode thread's own CPU seconds, apart from others'


class StageLog:
    """An epoch's figures of ``stages`` (of :data:`STAGES`, else ``ValueError``), thread-safe.
    ``rated``: the slower side is the pipeline's rate (not DALI's: its decode is unmeasured)."""

    def __init__(self, stages: tuple[str, ...] = STAGES, decoder_name: str | None = None,
                 rated: bool = True, readers_name: str = "workers"):
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
            self.hist = np.zeros((_ROWS, len(MIDDLES_MS)), dtype=np.int64)
            self.sums = np.zeros(_ROWS)  # seconds
            self.counts = np.zeros(_ROWS, dtype=np.int64)  # images
            self.by_size = np.zeros((len(SIZE_NAMES), 3))  # images, decode s, total s
            # reader id -> batches, images, wall, cpu, slot wait (NaN: none), stages' sum (s), bytes
            self.workers: dict[int, np.ndarray] = {}
            self.decoder = np.zeros(3)  # images, wall s, cpu s of the batch decoder side
            self.copies: list[float] = []  # hand-over seconds per batch
            self.waits: list[float] = []  # seconds the training thread waited (DALI's run)
            self._pending: list = []  # CUDA (start, end) event pairs not yet read

    def add_slot(self, images: np.ndarray, batch: np.ndarray, count: int) -> None:
        """Add a workers' batch from its slot's stage rows: numpy calls per batch, not image."""
        rows = images[:count * IMAGE_COLUMNS].reshape(count, IMAGE_COLUMNS)
        stage_s = rows[:, :len(STAGES)]
        total_s = stage_s.sum(axis=1)
        decode_s = stage_s[:, DECODE]
        # decode by decoder: one row per kind, the images of other kinds left out (NaN)
        codes = np.arange(1, len(KINDS) + 1)[:, None]
        by_kind = np.where(codes == rows[:, KIND].astype(np.int64), decode_s, np.nan)
        seconds = np.concatenate([stage_s.T, by_kind, total_s[None]])  # (_ROWS, count)
        present = ~np.isnan(seconds)
        flat = (np.arange(_ROWS)[:, None] * len(MIDDLES_MS) + ms_bins(seconds))[present]
        size_class = np.searchsorted(SIZE_CLASSES, rows[:, SIDE], side="left")
        with self._lock:
            self.hist += np.bincount(flat, minlength=self.hist.size).reshape(self.hist.shape)
            self.sums += np.nansum(seconds, axis=1)
            self.counts += present.sum(axis=1)
            np.add.at(self.by_size, size_class, np.stack([np.ones(count), decode_s, total_s], 1))
        self.add_reader(int(batch[WORKER]), count, batch[WALL], batch[CPU], total_s.sum(),
                        float(rows[:, BYTES].sum()), batch[SLOT_WAIT])

    def add(self, stage: str, seconds) -> None:
        """Per-image seconds (array-like) of ``stage`` for a batch's images."""
        seconds = np.asarray(seconds, dtype=np.float64).reshape(-1)
        row = STAGES.index(stage)
        with self._lock:
            self.hist[row] += np.bincount(ms_bins(seconds), minlength=len(MIDDLES_MS))
            self.sums[row] += float(seconds.sum())
            self.counts[row] += len(seconds)

    def add_batch(self, stage: str, seconds: float, count: int) -> None:
        """A batch-wide ``stage`` (one call, ``count`` images) of ``seconds``, as equal shares."""
        if count > 0:
            self.add(stage, np.full(count, seconds / count))

    def add_reader(self, reader: int, images: int, wall: float, cpu: float, staged: float,
                   nbytes: float = 0.0, slot_wait: float = np.nan) -> None:
        """One batch read by ``reader`` (worker id, -1 for ``-j 0``, or feed number): ``wall``,
        ``cpu``, ``staged`` (its stages' sum) and ``slot_wait`` seconds, the records' ``nbytes``."""
        with self._lock:
            sums = self.workers.setdefault(reader, np.zeros(7))
            sums += (1, images, wall, cpu, slot_wait, staged, nbytes)

    def add_copy(self, seconds: float | None = None, events=None) -> None:
        """One batch's copy to the device: ``seconds``, or timed CUDA ``(start, end)`` events."""
        with self._lock:
            if events is None:
                self.copies.append(seconds)
                return
            self._pending.append(events)
            if len(self._pending) >= 64:
                self._pending = read_event_pairs(self._pending, self.copies, wait=False)

    def add_hand_over(self, count: int, timing: dict, wall: float, cpu: float,
                      wait: float | None = None) -> None:
        """A batch through the batch decoder: ``timing``'s stages (s by name, ``"copy"``), its
        ``wall`` and ``cpu`` s, the training thread's ``wait`` (DALI's ``run()``)."""
        for stage in self.stages:
            if stage in timing:
                self.add_batch(stage, timing[stage], count)
        with self._lock:
            self.copies.append(timing["copy"])
            if wait is not None:
                self.waits.append(wait)
            self.decoder += (count, wall, cpu)

    def _figures(self, row: int) -> dict | None:
        """Mean, median and p90 (ms; the quantiles at bin middles) of ``row``; None if empty."""
        count = int(self.counts[row])  # the row's histogram holds as many
        if not count:
            return None
        at = np.searchsorted(np.cumsum(self.hist[row]), (0.5 * count, 0.9 * count), side="left")
        p50, p90 = MIDDLES_MS[at].tolist()
        return {"mean": 1e3 * self.sums[row] / count, "p50": p50, "p90": p90}

    def summary(self) -> dict:
        """The figures so far, JSON-able, in ms per image unless named (as built below): per
        stage ``{"mean", "p50", "p90"}`` (None where not had), a batch pipeline's ``total`` the
        means' sum; ``loader_images_per_sec``: the readers' sum, or the batch decoder's if
        slower (None unless ``rated``); per batch ``{"p50", "p90"}`` of copy and DALI's wait."""
        with self._lock:
            self._pending = read_event_pairs(self._pending, self.copies, wait=True)
            stages = {name: self._figures(row) if name in self.stages else None
                      for row, name in enumerate(STAGES)}
            means = [s["mean"] for s in stages.values() if s is not None]
            stages["total"] = self._figures(_ROWS - 1) or {
                "mean": sum(means) if means else None, "p50": None, "p90": None}
            workers = [{"id": rid, "images": int(n), "ms_per_image": 1e3 * wall / max(n, 1),
                        "stages_ms_per_image": 1e3 * staged / max(n, 1),
                        "images_per_sec": n / wall if wall > 0 else None,
                        "cpu_share": cpu / wall if wall > 0 else None,
                        "slot_wait_ms": None if np.isnan(wait) else 1e3 * wait / max(batches, 1)}
                       for rid, (batches, n, wall, cpu, wait, staged, _) in
                       sorted(self.workers.items())]
            _, read_images, read_wall, *_, nbytes = sum(self.workers.values(), np.zeros(7))
            images, wall, cpu = self.decoder
            decoder = None if not images else {
                "where": self.decoder_name, "images": int(images),
                "ms_per_image": 1e3 * wall / images,
                "images_per_sec": images / wall if wall > 0 else None,
                "thread_cpu_share": cpu / wall if wall > 0 else None}
            n = int(images) or int(read_images)
            decoders = {kind: {"share": int(self.counts[row]) / n, **self._figures(row)}
                        for row, kind in enumerate(KINDS, start=len(STAGES))
                        if self.counts[row]}
            sizes = None if not self.by_size[:, 0].any() else {
                name: {"share": count / n, "decode_ms": 1e3 * dec / count if count else None,
                       "ms": 1e3 * tot / count if count else None}
                for name, (count, dec, tot) in zip(SIZE_NAMES, self.by_size)}
            rates = [r for r in (sum(w["images_per_sec"] or 0 for w in workers) or None,
                     decoder and decoder["images_per_sec"]) if r]
            return {"images": n, "stages": stages, "decoders": decoders, "workers": workers,
                    "readers": self.readers_name,
                    "worker_ms_per_image": 1e3 * read_wall / read_images if read_images else None,
                    "batch_decoder": decoder,
                    "loader_images_per_sec": min(rates) if rates and self.rated else None,
                    "sizes": sizes, "kb_per_image": nbytes / max(read_images, 1) / 1024,
                    "copy_ms_per_batch": p50_p90(self.copies),
                    "wait_ms_per_batch": p50_p90(self.waits) if self.waits else None}


class StagedLoader:
    """The stage methods of a loader with a ``stage_log`` (None: not measured)."""

    stage_log: StageLog | None = None
    workers_configured = 0

    def stage_summary(self) -> dict | None:
        """The log's ``summary()`` with ``workers_configured``, then the log reset; None where
        nothing is measured (validation, ``IMAGENET_FAST_STAGES=0``)."""
        if self.stage_log is None:
            return None
        figures = {**self.stage_log.summary(), "workers_configured": self.workers_configured}
        self.stage_log.reset()
        return figures

    def reset_stages(self) -> None:
        """Forget the stage figures so far (e.g. after a benchmark's warm-up batches)."""
        if self.stage_log is not None:
            self.stage_log.reset()


def read_event_pairs(pending: list, seconds: list, wait: bool) -> list:
    """Append to ``seconds`` those of each passed (or, ``wait``, every) CUDA event pair of
    ``pending``; returns the pairs not read yet."""
    left = []
    for start, end in pending:
        if wait:
            end.synchronize()
        if wait or end.query():
            seconds.append(start.elapsed_time(end) / 1e3)
        else:
            left.append((start, end))
    return left
