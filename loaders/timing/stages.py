"""Where a DataLoader worker's time goes, image by image, for a few ``perf_counter`` calls each.
A worker's :class:`StageClock` writes each image's stage seconds and each batch's worker id, wall
and CPU time into the slot's stage rows beside the pixels (no message or object per image); the
main process's :class:`StageLog` keeps histograms and sums for ``engine.report.bounds``.
``IMAGENET_FAST_STAGES=0`` switches it all off (no clock call is made)."""
from __future__ import annotations

import os
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
# Histogram rows: the stages, decode by decoder, the image's total.
_ROWS = len(STAGES) + len(KINDS) + 1
_TOTAL_ROW = _ROWS - 1


def ms_bins(seconds: np.ndarray) -> np.ndarray:
    """The histogram bin of each of ``seconds`` (any shape; off 1 us - 100 s: the end bins)."""
    bins = np.searchsorted(EDGES_MS, seconds * 1e3, side="right") - 1
    return np.clip(bins, 0, len(MIDDLES_MS) - 1)


def quantiles(counts: np.ndarray) -> list[float | None]:
    """The median and p90 (ms) of one histogram row (bin middles); None if it is empty."""
    total = counts.sum()
    if total == 0:
        return [None, None]
    cumulative = np.cumsum(counts)
    return [float(MIDDLES_MS[np.searchsorted(cumulative, q * total, side="left")])
            for q in (0.5, 0.9)]


def p50_p90(seconds: list) -> dict:
    """``{"p50", "p90"}`` in ms of ``seconds``; None values when empty."""
    ms = np.array(seconds) * 1e3
    return {"p50": float(np.median(ms)) if len(ms) else None,
            "p90": float(np.percentile(ms, 90)) if len(ms) else None}


def worker_figures(wid: int, images, wall, cpu, staged, slot_wait_ms) -> dict:
    """One worker's (or reader's) figures: ``wall``, ``cpu``, ``staged`` (the stages' sum) in s."""
    return {"id": wid, "images": int(images), "ms_per_image": 1e3 * wall / max(images, 1),
            "stages_ms_per_image": 1e3 * staged / max(images, 1),
            "images_per_sec": images / wall if wall > 0 else None,
            "cpu_share": cpu / wall if wall > 0 else None, "slot_wait_ms": slot_wait_ms}


def enabled() -> bool:
    """Whether the stages are measured: on unless ``IMAGENET_FAST_STAGES=0``."""
    return os.environ.get("IMAGENET_FAST_STAGES", "1") != "0"


class StageClock:
    """A worker's figures for the image it is on: ``t``, ``IMAGE_COLUMNS`` floats reused per
    image (stage seconds added, so a replaced sample counts both tries)."""

    __slots__ = ("t", "started", "sampled", "_cpu")

    def __init__(self):
        self.t = [0.0] * IMAGE_COLUMNS
        self.started = self.sampled = self._cpu = 0.0  # sampled: when the slot copy began

    def begin_batch(self) -> None:
        """Start a batch's wall and CPU clocks."""
        self.started, self._cpu = time.perf_counter(), time.process_time()

    def begin_image(self) -> None:
        """Zero the figures for the next image."""
        self.t[:] = _ZEROS

    def end_image(self, rows: np.ndarray, i: int) -> None:
        """Close image ``i`` (its slot copy begun at :attr:`sampled`) into the slot's ``rows``."""
        t = self.t
        t[WRITE] += time.perf_counter() - self.sampled
        rows[i * IMAGE_COLUMNS:(i + 1) * IMAGE_COLUMNS] = t

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


def image_rows(slots: int, batch_size: int) -> torch.Tensor:
    """Zeroed float64 ``(slots, batch_size * IMAGE_COLUMNS)`` per-image stage rows."""
    return torch.zeros(slots, batch_size * IMAGE_COLUMNS, dtype=torch.float64)


def batch_rows(slots: int) -> torch.Tensor:
    """Zeroed float64 ``(slots, BATCH_COLUMNS)`` per-batch rows."""
    return torch.zeros(slots, BATCH_COLUMNS, dtype=torch.float64)


class StageLog:
    """The main process's sums of an epoch's stage rows (:meth:`add`) and of the copies to the
    device (:meth:`add_copy`)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        """Forget everything counted so far."""
        self.hist = np.zeros((_ROWS, len(MIDDLES_MS)), dtype=np.int64)
        self.sums = np.zeros(_ROWS)  # seconds
        self.kind_images = np.zeros(len(KINDS) + 1, dtype=np.int64)  # 0: unknown
        self.by_size = np.zeros((len(SIZE_NAMES), 3))  # images, decode s, total s
        self.images = 0
        self.bytes = 0.0
        # id -> batches, images, wall, cpu, slot wait, the stages' sum (seconds)
        self.workers: dict[int, np.ndarray] = {}
        self.copies: list[float] = []  # seconds per batch
        self._pending: list = []  # CUDA (start, end) event pairs not yet read

    def add(self, images: np.ndarray, batch: np.ndarray, count: int) -> None:
        """Add one batch: ``images`` its slot's flat stage rows (``count`` images used),
        ``batch`` its batch row; a few numpy calls per batch, none per image."""
        rows = images[:count * IMAGE_COLUMNS].reshape(count, IMAGE_COLUMNS)
        stage_s = rows[:, :len(STAGES)]
        total_s = stage_s.sum(axis=1)
        kinds = rows[:, KIND].astype(np.int64)
        decode_s = stage_s[:, DECODE]
        values = [stage_s.T]
        # decode by decoder: one row per kind, the images of other kinds left out (NaN)
        for code in range(1, len(KINDS) + 1):
            values.append(np.where(kinds == code, decode_s, np.nan)[None])
        values.append(total_s[None])
        seconds = np.concatenate(values)  # (_ROWS, count)
        present = ~np.isnan(seconds)
        flat = (np.arange(_ROWS)[:, None] * len(MIDDLES_MS) + ms_bins(seconds))[present]
        self.hist += np.bincount(flat, minlength=self.hist.size).reshape(self.hist.shape)
        self.sums += np.nansum(seconds, axis=1)
        self.kind_images += np.bincount(np.clip(kinds, 0, len(KINDS)), minlength=len(KINDS) + 1)
        size_class = np.searchsorted(SIZE_CLASSES, rows[:, SIDE], side="left")
        for c in range(len(SIZE_NAMES)):
            mine = size_class == c
            self.by_size[c] += (mine.sum(), decode_s[mine].sum(), total_s[mine].sum())
        self.images += count
        self.bytes += float(rows[:, BYTES].sum())
        worker = int(batch[WORKER])
        sums = self.workers.setdefault(worker, np.zeros(6))
        sums += (1, count, batch[WALL], batch[CPU], batch[SLOT_WAIT], total_s.sum())

    def add_copy(self, seconds: float | None = None, events=None) -> None:
        """One batch's copy to the device: ``seconds``, or ``events``, a timed CUDA ``(start,
        end)`` pair read once completed."""
        if events is not None:
            self._pending.append(events)
            if len(self._pending) >= 64:
                self._pending = read_event_pairs(self._pending, self.copies, wait=False)
        else:
            self.copies.append(seconds)

    def summary(self) -> dict:
        """The figures so far (ms per image unless named otherwise), JSON-able: ``images``;
        ``stages``: ``{stage: {"mean", "p50", "p90"}}`` for every stage of :data:`STAGES` and
        ``total`` (their sum per image); ``decoders``: ``{kind: {"share" (of images), "mean",
        "p50", "p90"}}`` for the decoders used; ``workers``: per worker ``{"id", "images",
        "ms_per_image" (wall, slot waits apart), "stages_ms_per_image", "images_per_sec",
        "cpu_share" (process CPU / wall), "slot_wait_ms" (per batch)}``; ``worker_ms_per_image``
        (all workers' wall over all images), ``loader_images_per_sec`` (the workers' images/s
        summed: their rate never idle), ``sizes``: ``{"le256"|"le512"|"gt512": {"share",
        "decode_ms", "ms"}}`` by stored longer side, ``kb_per_image``; ``copy_ms_per_batch``:
        ``{"p50", "p90"}`` (None without copies). An empty log gives ``images`` 0."""
        self._pending = read_event_pairs(self._pending, self.copies, wait=True)
        n = max(self.images, 1)

        def figures(row: int, images: int) -> dict:
            p50, p90 = quantiles(self.hist[row])
            return {"mean": 1e3 * self.sums[row] / images, "p50": p50, "p90": p90}

        stages = {name: figures(row, n) for row, name in enumerate(STAGES)}
        stages["total"] = figures(_TOTAL_ROW, n)
        counts = self.kind_images[1:].tolist()
        decoders = {kind: {"share": images / n, **figures(len(STAGES) + k, images)}
                    for k, (kind, images) in enumerate(zip(KINDS, counts)) if images}
        workers = [worker_figures(wid, images, wall, cpu, staged, 1e3 * wait / max(batches, 1))
                   for wid, (batches, images, wall, cpu, wait, staged)
                   in sorted(self.workers.items())]
        wall = sum(s[2] for s in self.workers.values())
        sizes = {name: {"share": images / n, "decode_ms": 1e3 * dec / images if images else None,
                        "ms": 1e3 * tot / images if images else None}
                 for name, (images, dec, tot) in zip(SIZE_NAMES, self.by_size)}
        return {"images": self.images, "stages": stages, "decoders": decoders,
                "workers": workers,
                "worker_ms_per_image": 1e3 * wall / n if self.images else None,
                "loader_images_per_sec": sum(w["images_per_sec"] or 0 for w in workers) or None,
                "sizes": sizes, "kb_per_image": self.bytes / n / 1024,
                "copy_ms_per_batch": p50_p90(self.copies)}


def read_event_pairs(pending: list, seconds: list, wait: bool) -> list:
    """Append to ``seconds`` the seconds between each ``(start, end)`` pair of recorded CUDA
    events in ``pending`` whose end has passed (all, waiting for each, if ``wait``); returns the
    pairs not read yet (also ``engine.report.progress.StepTimer``'s reader)."""
    left = []
    for start, end in pending:
        if wait:
            end.synchronize()
        if wait or end.query():
            seconds.append(start.elapsed_time(end) / 1e3)
        else:
            left.append((start, end))
    return left
