"""What the DALI pipeline is fed, prepared off the training thread (DALI 2.4 calls a non-parallel
``fn.external_source`` on the thread that calls ``run()``: 14 ms per 256-image LMDB batch in
series with the step on 2 cores): a thread per pipeline reads the batches ahead and draws each
RandomResizedCrop window on the host (~30 DALI CPU operators took 13 ms)."""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from decode.acceptance import Frame, Refused, check

from ...draws import keyed_rng
from ...timing.stages import no_clock, thread_cpu
from ...transforms import RRC_ATTEMPTS, RRC_RATIO, RRC_SCALE, random_resized_crop_params
from ..ahead import RunAhead
from ..bad_samples import mark_unreadable

# Batches a feed prepares ahead of DALI's queue (about 28 MB each at -b 256): the training thread
# waited 5.7 ms per batch with one, 1.6 ms with two (median, 2 cores,
# benchmarks.pipelines.dali_feed).
AHEAD = 2


def crop_draws(seed: int, epoch: int, rank: int, batch: int, count: int):
    """RandomResizedCrop uniforms of batch ``batch``, float64 ``(count, 4 * RRC_ATTEMPTS)`` in
    [0, 1) (area share, aspect ratio, top, left per attempt), and int32 ``(count,)`` flips."""
    rng = keyed_rng(seed, epoch, rank, batch)
    draws = rng.random((count, 4 * RRC_ATTEMPTS))
    return draws, (rng.random(count) < 0.5).astype(np.int32)


def host_windows(frames: Sequence[Frame | None],
                 draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """RandomResizedCrop windows of the images of ``frames`` (:func:`decode.acceptance.check`'s):
    float32 ``(N, 2)`` anchors ``(x, y)`` and shapes ``(w, h)`` in pixels, the CPU loaders' for
    the same uniforms; a frame None gets 1x1 (DALI then fails on it: the bad-sample rules)."""
    anchors = np.zeros((len(frames), 2), np.float32)
    shapes = np.ones((len(frames), 2), np.float32)
    for j, frame in enumerate(frames):
        if frame is None:
            continue
        top, left, h, w = random_resized_crop_params(frame.height, frame.width, RRC_SCALE,
                                                     RRC_RATIO, draws[j].tolist())
        anchors[j], shapes[j] = (left, top), (w, h)
    return anchors, shapes


class AcceptedReads:
    """``read(index) -> (bytes, label, frame)`` for the feed threads: ``reader.read(index)`` and
    the :class:`~decode.acceptance.Frame` the acceptance rule (``max_pixels``) read (None: no
    parser reads it); a refused sample is reported once, marked in ``unreadable``, counted in
    :attr:`refused` and replaced by the next readable one. Raises :class:`DataError` if none is
    readable. Holds no loader: one freed in a process forked while a feed thread held it would
    wait there for the parent's DALI threads."""

    def __init__(self, reader, unreadable, max_pixels: int):
        self.reader, self.unreadable, self.max_pixels = reader, unreadable, max_pixels
        self.refused = 0

    def __call__(self, index: int) -> tuple[bytes, int, Frame | None]:
        while True:
            data, label = self.reader.read(index)
            try:
                return data, label, check(data, self.max_pixels)
            except Refused as exc:
                self.refused += mark_unreadable(self.unreadable, index, self.reader.name_of, exc)
                index = self.unreadable.next_readable(index)


@dataclass(frozen=True)
class FeedPass:
    """One pass as a feed reads it: batch ``b`` of ``order`` is the epoch's ``first_batch + b``,
    cropped to ``size`` px; the feed serves batches ``index``, ``index + pipelines``, ..."""

    order: tuple[int, ...]
    epoch: int
    first_batch: int
    size: int
    index: int
    pipelines: int


class BatchFeed:
    """``fn.external_source`` callable (``batch=True``, ``batch_info=True``) of one pipeline,
    pointed at a pass by :meth:`start`; a thread (``ahead.RunAhead``) prepares :data:`AHEAD`
    batches from ``read`` (:class:`AcceptedReads`). A call returns ``[encoded, labels]`` (uint8
    1-D arrays; int32 ``(N,)``), for training + float32 ``(N, 2)`` anchors ``(x, y)`` and shapes
    ``(w, h)``, int32 ``(N,)`` flips, for the GPU graph + float32 ``(N,)`` output sides and, with
    ``opts.augment``, int32 ``(N, slots, 3)`` policy draws; ``StopIteration`` past the pass's end.
    The last ``keep`` batches (DALI's prefetch depth + 1) stay referenced: DALI reads them in
    place (``no_copy``). ``log``: a training feed's ``StageLog`` of its batches' stages, or None."""

    def __init__(self, read, opts, batch_size: int, seed: int, rank: int, keep: int = 6, log=None):
        self.read, self.train, self.batch_size, self.log = read, opts.train, batch_size, log
        self.sizes = opts.train and opts.cuda
        self.augment = opts.augment if self.sizes else None  # the GPU graph's policy draws
        self.seed, self.rank = seed, rank
        self._fed: collections.deque = collections.deque(maxlen=keep)
        self._ahead: RunAhead | None = None  # no pass yet

    def start(self, plan: FeedPass) -> None:
        """Feed ``plan``'s batches from now on (the previous pass's thread is stopped)."""
        self.close()
        self.plan = plan
        self._ahead = RunAhead(self._prepared(plan), AHEAD, "dali-feed") if plan.order else None

    def close(self, wait_s: float | None = None) -> None:
        """Stop the thread, dropping its batches: joined, or after ``wait_s`` s left in a read (a
        daemon: a stream retrying a shard must not hold a run's exit)."""
        if self._ahead is not None:
            self._ahead.close(wait_s)
            self._ahead = None

    def _prepared(self, plan: FeedPass):
        batch = plan.index
        while (item := self.prepare(plan, batch)) is not None:
            yield batch, item
            batch += plan.pipelines

    def prepare(self, plan: FeedPass, batch: int) -> list | None:
        """The external source's outputs for batch ``batch`` of ``plan``; None past its end."""
        indices = plan.order[batch * self.batch_size:(batch + 1) * self.batch_size]
        if not indices:
            return None
        log = self.log
        clock = no_clock if log is None else time.perf_counter
        started, cpu = clock(), 0.0 if log is None else thread_cpu()
        samples, reads = [], []
        for i in indices:
            began = clock()
            samples.append(self.read(i))
            reads.append(clock() - began)
        data, labels, frames = zip(*samples)
        out = [[np.frombuffer(encoded, np.uint8) for encoded in data], np.array(labels, np.int32)]
        window_started = clock()
        if self.train:
            draws, flips = crop_draws(self.seed, plan.epoch, self.rank, plan.first_batch + batch,
                                      len(indices))
            out += [*host_windows(frames, draws), flips]
        if log is not None:  # a training feed's (windows drawn)
            window = clock() - window_started
            log.add("read", reads)
            log.add_batch("window", window, len(data))
            log.add_reader(plan.index, len(data), clock() - started, thread_cpu() - cpu,
                           sum(reads) + window, float(sum(len(d) for d in data)))
        if self.sizes:
            out.append(np.full(len(indices), plan.size, np.float32))
        if self.augment is not None:
            out.append(np.stack(self.augment.host_draws(self.seed, plan.epoch, self.rank,
                                                        plan.first_batch + batch, len(indices))))
        return out

    def __call__(self, info):
        # StopIteration past the end, every time DALI asks (its queue is deeper than the pass)
        if self._ahead is None:  # an empty pass, or a closed feed
            raise StopIteration
        batch, item = next(self._ahead)
        expected = self.plan.index + info.iteration * self.plan.pipelines
        if batch != expected:  # DALI asks in iteration order; anything else is a bug here
            raise RuntimeError(f"DALI feed: batch {batch} prepared, {expected} asked for")
        self._fed.append(item)  # alive until DALI consumed it: it does not copy (no_copy)
        return item
