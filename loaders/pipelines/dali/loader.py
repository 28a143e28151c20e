"""The NVIDIA DALI pipeline's loader (``--dali``): JPEG decode, crop and normalisation inside a
DALI pipeline, over any random-access reader, through one batched ``fn.external_source`` fed by
``feed.BatchFeed`` (a background thread per pipeline reads the records of the batches ahead and
draws their windows on the host). Labels are the reader's.

With CUDA, decoding is nvJPEG (``device="mixed"``, hardware decoder share
``--dali-hw-decoder-load``) and the rest, labels included, runs on the GPU; each batch is handed
to torch without a copy (DLPack) on torch's current stream, four in flight. ``--dali-cpu``
decodes on the CPU and resizes and normalises on the GPU, as NVIDIA's DeepLearningExamples RN50
does. Without CUDA the pipelines run CPU-only (``device_id=None``): DALI decodes (only the
RandomResizedCrop window of a training JPEG) and torch resizes, flips and normalises with the
other pipelines' code (``graph.finish_on_cpu``); ``-j`` single-threaded pipelines take turns.
EXIF orientation is not applied, as in every loader here (docs/loaders.md, *Orientation*).

Each epoch is read in the indices of the reader's epoch orders, handed to DALI as that exact
list (not DALI's shuffling and sharding). Each pipeline is built once per run and reused by
every pass (as in NVIDIA's DALI ResNet-50 example); each pass points its feed at the pass's
order, crop side and epoch, and windows and flips are drawn on the host from (seed, epoch, rank,
batch number), so a resumed epoch draws what the uninterrupted one did. Pipelines are rebuilt
only after a sample DALI could not decode (from that batch on) and after a pass left unfinished.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Iterator

import torch

from decode import release_freed_memory
from decode.messages import capture

from ...errors import AcceleratorError
from ...orders import Order, batches_per_epoch, train_batch_size
from ...orders.positions import PositionedLoader, RestOfEpoch
from ...readers import Reader
from ...settings import DistInfo, LoaderSettings
from ...timing import stages
from ...timing.batch_stages import BatchStageLog, StagedLoader, no_clock, thread_cpu
from ..bad_samples import UnreadableSet, too_many_unreadable
from ..batches import batch_seed, epoch_seed
from .environment import cuda_failure
from .feed import BatchFeed, FeedPass
from .graph import GraphOptions, augment, outputs_to_torch, source
from .unreadable import UnreadableSamples

# Seconds close() waits for each feed thread to leave the read it is in (a streamed shard may
# be retrying): past it the daemon thread is left behind, so a run's exit is never held.
CLOSE_WAIT_S = 5.0


class DALILoader(UnreadableSamples, StagedLoader, PositionedLoader):
    """One split's DALI pipelines, built once and fed each pass with ``reader``'s samples in
    the indices of ``order``, as a loader of the usual contract.

    Yields ``images``: ``(N, 3, H, W)`` ``opts.dtype`` (float32, or the ``--amp-dtype`` under
    ``--amp`` on CUDA) on ``dist.device``, normalised with the ImageNet mean/std, channels-last
    memory format with ``--channels-last``; ``labels``: int64 ``(N,)`` on it (with CUDA
    both are copied out of DALI's GPU buffers on torch's current stream, not blocking the host).
    ``len()`` is exact; the last validation batch may be smaller and holds no padding.
    ``classes``: class names (index = label). ``set_epoch(epoch)`` selects the order and the
    augmentation seed. A sample the acceptance rule refuses (``max_pixels``,
    ``--max-image-pixels``: :mod:`decode.acceptance`) is never handed to DALI: the feed reads
    the next readable one in its place; a sample DALI cannot decode is found with our CPU
    decoder; either is reported once on stderr, replaced by the next readable one and
    remembered (``unreadable``), so later passes leave it out; iterating raises
    :class:`DataError` when the unreadable samples exceed ``max_bad_share`` of the split or
    DALI fails for another reason, and :class:`AcceleratorError` at once for a CUDA failure
    (out of memory...). What DALI's decoder prints during a pass is caught
    (:mod:`decode.messages`): the sample a warning was about is named once (``warned``).

    With CUDA one pipeline runs ``settings.workers`` CPU threads. CPU-only, ``cpu_pipelines``
    pipelines (default: one per thread, each single-threaded) take turns, pipeline ``p``
    producing batches ``p, p + n, ...`` (see :meth:`_num_pipelines`).

    Training measures its stages (:mod:`loaders.timing.batch_stages`; :meth:`stage_summary`): the
    feed threads' reads and windows, the training thread's wait for DALI's output (DALI's
    decode, unmeasured apart, is in it) and hand-over (CPU-only: torch's resize and flip).
    """

    cpu_pipelines: int | None = None  # CPU-only pipelines taking turns (None: one per thread)

    def __init__(self, reader: Reader, order: Order, opts: GraphOptions,
                 settings: LoaderSettings, dist: DistInfo):
        batch_size = settings.batch_size
        if opts.train:
            batch_size = train_batch_size(order, batch_size)
        self.sample_order = order  # an Order; opts.train: whole batches only
        self.position_order, self._rest = order, None
        self.batch_size, self.max_batches = batch_size, settings.max_batches(opts.train)
        self.opts, self.classes, self.device = opts, list(reader.classes), dist.device
        self.reader = reader
        self.max_bad_share, self.seed, self.rank = settings.max_bad_share, settings.seed, dist.rank
        self.num_threads = max(1, settings.workers)
        self.epoch = self.start_batch = 0
        # Built pipelines and their feeds, reused while they are between passes.
        self._pipes: list = []
        self._feeds: list[BatchFeed] = []
        self.pipeline_builds = 0  # pipelines built so far (tests: once per run)
        # Samples found unreadable this run (main process only: the probes run here), those the
        # feed refused (counted here by its threads), those named as damaged but kept.
        self.unreadable = UnreadableSet(order.num_samples)
        self.warned = UnreadableSet(order.num_samples)
        self.max_pixels, self.refused = settings.max_image_pixels, 0
        self.stage_log = self._waited = None
        if opts.train and stages.enabled():  # torch resizes and flips CPU-only (graph.py)
            names = ("read", "window") + (() if opts.cuda else ("resize", "augment"))
            self.stage_log = BatchStageLog(names, "training thread (DALI's output)",
                                           rated=False, readers_name="feed threads")

    @property
    def num_batches(self) -> int:
        """Batches in a whole epoch on this rank (before ``start_batch``)."""
        return batches_per_epoch(len(self.sample_order), self.batch_size, self.opts.train,
                                 self.max_batches)

    def __len__(self) -> int:
        return max(0, self.num_batches - self.start_batch)

    def set_epoch(self, epoch: int, start_batch: int = 0,
                  rest: RestOfEpoch | None = None) -> None:
        """Make the next pass's order and augmentation a function of (seed, epoch, rank), and
        start it at batch ``start_batch`` (a resumed epoch; ``rest``: one dealt anew at this
        layout, whose indices are read instead, :mod:`loaders.orders.positions`). Hands the host
        heap's freed pages back to the kernel first (:func:`decode.release_freed_memory`):
        without it, the memory kept at each epoch's peaks grows resident memory epoch after
        epoch."""
        release_freed_memory()
        self.epoch, self.start_batch = epoch, start_batch
        self._rest = self._take_rest(epoch, start_batch, rest)

    @property
    def resolution(self) -> int:
        """The side in pixels of the images the next pass yields."""
        return self.opts.crop_size

    def set_resolution(self, size: int) -> None:
        """Training: RandomResizedCrop to ``size`` px from the next pass on (progressive
        resizing): the side reaches the built pipelines as an input. Raises ``ValueError``
        for a validation loader or a size below 1."""
        if not self.opts.train:
            raise ValueError("set_resolution: validation sizes are fixed (--val-crop-size)")
        if size < 1:
            raise ValueError(f"set_resolution({size}): expected a positive size")
        self.opts = dataclasses.replace(self.opts, crop_size=size)

    def order(self) -> list[int]:
        """Dataset indices the next pass yields, in order (the epoch order's, cut to
        :attr:`num_batches` batches, from ``start_batch`` on; a pass dealt anew: its
        ``rest``'s)."""
        if self._rest is not None:
            return self._rest[:len(self) * self.batch_size]
        indices = list(self.sample_order.order(self.epoch))[:self.num_batches * self.batch_size]
        return indices[self.start_batch * self.batch_size:]

    def pass_indices(self) -> list[int]:
        """The dataset indices the next pass yields (:meth:`order`)."""
        return self.order()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order, step = self.order(), 0
        unreadable = self.unreadable
        if unreadable.count():  # known-bad samples: their replacements, as when found
            order = [unreadable.next_readable(i) if unreadable.known(i) else i for i in order]
        batch = self.batch_size
        size = self.sample_order.num_samples
        allowed = self.max_bad_share * size
        finished, refused = False, self.refused
        caught = capture().__enter__()  # what DALI's decoder prints, for the whole pass
        try:
            while step < len(self):
                # DALI cannot skip a file it fails to decode: find it, swap it for a readable
                # sample, and rebuild the pipelines from the failed batch on.
                pipes, first = self._start_pass(order[step * batch:], len(self) - step,
                                                self.start_batch + step), step
                while step < len(self):
                    try:  # only run(): a torch error while copying out is not DALI's
                        # Pipeline p holds batches first + p, first + p + len(pipes), ...
                        outputs = self._run(pipes[(step - first) % len(pipes)])
                    except (RuntimeError, OSError) as exc:  # OSError: the feed's read
                        self._drop_pipelines()  # a failed pipeline is not run again
                        failure = cuda_failure(exc)
                        if failure:
                            raise AcceleratorError(f"DALI: CUDA error on the {self._split} "
                                                   f"split: {failure}") from exc
                        # Each pipeline runs up to its queue depth ahead: probe all in flight.
                        lookahead = len(pipes) * (self._queue_depth(len(pipes)) + 1)
                        self._replace_unreadable(order, step, exc, lookahead)
                        bad = unreadable.count()
                        if bad > allowed:
                            raise too_many_unreadable(bad, self.max_bad_share, size) from None
                        break
                    refused = self._after_batch(order, step, caught, refused, len(pipes))
                    if self.opts.train and self._skip_mismatched_window(order, step, outputs):
                        break
                    images, labels = self._to_torch(outputs, self.start_batch + step)
                    take = min(len(order) - step * batch, len(labels))
                    step += 1
                    yield images[:take], labels[:take]
                outputs = None
            finished = self._end_pass()
        finally:
            if not finished:  # left part-way: batches of this pass are still queued in DALI
                self._drop_pipelines()
            caught.__exit__(None, None, None)

    def _after_batch(self, order: list[int], step: int, caught, refused: int,
                     pipelines: int) -> int:
        """After batch ``step`` ran: name the sample of a warning DALI's decoder printed
        (:meth:`_name_damaged`), and stop past ``max_bad_share`` if the feed refused samples
        since ``refused`` (the count then); returns the count now."""
        lines = caught.take()
        if lines:
            self._name_damaged(order, step, lines,
                               pipelines * (self._queue_depth(pipelines) + 1))
        if self.refused != refused:
            self._check_refused()
        return self.refused

    @property
    def _split(self) -> str:
        return "training" if self.opts.train else "validation"

    def _num_pipelines(self, batches: int) -> int:
        """How many pipelines take turns over ``batches`` batches: 1 with CUDA; CPU-only,
        ``cpu_pipelines`` or one per thread. A multi-threaded DALI operator finishes a batch
        before it starts the next, so its threads idle while a batch's last images decode, and
        more so while the main thread resizes on the same cores; single-threaded pipelines
        taking turns have no such barrier (``profile_dali_cpu.py``, docs/performance.md)."""
        if self.opts.cuda:
            return 1
        return max(1, min(self.cpu_pipelines or self.num_threads, batches))

    def _queue_depth(self, pipelines: int) -> int:
        # With CUDA, 4 batches in flight: DALI PR #6366 measured the mixed decoder's p99 at
        # 24-34 ms and its maximum at 31-73 ms per batch, longer than ResNet-18's 17 ms step on
        # an H100, which depth 2 exposed. CPU-only, the main thread resizes while DALI decodes
        # ahead: deeper queues keep both busy (two pipelines on 2 cores: +5-8% images/s at depth
        # 4 over DALI's default 2); at most 8 queued batches in all bound their memory.
        return 4 if self.opts.cuda else max(1, min(4, 8 // pipelines))

    def _run(self, pipe):
        """One batch of ``pipe``: with CUDA returned on torch's current stream (the host does
        not wait for it; torch's next kernels do), CPU-only when ready (:attr:`_waited`: the
        wait's wall and CPU seconds, for :meth:`_to_torch`)."""
        clock, cpu_clock = ((time.perf_counter, thread_cpu) if self.stage_log is not None
                            else (no_clock, no_clock))
        started, cpu = clock(), cpu_clock()
        if self.opts.cuda:
            outputs = pipe.run(torch.cuda.current_stream(self.device))
        else:
            outputs = pipe.run()
        if self.stage_log is not None:
            self._waited = (time.perf_counter() - started, thread_cpu() - cpu)
        return outputs

    def _start_pass(self, order: list[int], batches: int, first_batch: int) -> list:
        """The pipelines, built on first use (or when their number changes), fed ``order``:
        pipeline ``p`` of ``n`` reads its batches ``p, p + n, p + 2n, ...``, the first being
        batch ``first_batch`` of the epoch."""
        n = self._num_pipelines(batches)
        if len(self._pipes) != n:
            self._drop_pipelines()
            self._pipes = self._build_pipelines(n)
        epoch = self.epoch if self.opts.train else 0
        for index, feed in enumerate(self._feeds):
            feed.start(FeedPass(tuple(order), epoch, first_batch, self.opts.crop_size, index, n))
        return self._pipes

    def _end_pass(self) -> bool:
        """After a pass's last batch: let each pipeline see its source end (StopIteration)
        and reset it for the next pass. Returns False (pipelines dropped) if one still had
        data, which a complete pass never leaves."""
        for pipe in self._pipes:
            try:
                self._run(pipe)
            except StopIteration:
                pipe.reset()
                continue
            return False
        return True

    def close(self) -> None:
        """Free the pipelines and stop their feed threads (each given
        :data:`CLOSE_WAIT_S` to leave a read); on any way out, more than once; a later pass
        builds new ones."""
        self._drop_pipelines(CLOSE_WAIT_S)

    def _drop_pipelines(self, wait_s: float | None = None) -> None:
        for feed in self._feeds:
            feed.close(wait_s)  # its reading thread stops; what it read ahead is dropped
        self._pipes, self._feeds = [], []  # freed (with their GPU memory) when collected

    def _build_pipelines(self, n: int) -> list:
        """``n`` built pipelines and their feeds (:attr:`_feeds`), counted in
        :attr:`pipeline_builds`."""
        self._feeds = [BatchFeed(self._read_accepted, self.opts, self.batch_size, self.seed,
                                 self.rank, keep=self._queue_depth(n) + 1, log=self.stage_log)
                       for _ in range(n)]
        pipes = [self._pipeline(feed, n) for feed in self._feeds]
        for pipe in pipes:
            pipe.build()
        self.pipeline_builds += n
        return pipes

    def _pipeline(self, feed: BatchFeed, pipelines: int):
        """A pipeline (not yet built) of ``pipelines`` reading from ``feed``."""
        from nvidia.dali import pipeline_def

        # DALI's auto_aug selects an op per sample through conditionals
        @pipeline_def(enable_conditionals=self.opts.cuda and self.opts.augment is not None)
        def graph():
            encoded, labels, train_inputs = source(feed)
            if self.opts.cuda:  # copied with the images, not a blocking pageable copy
                labels = labels.gpu()
            return (*augment(encoded, self.opts, train_inputs), labels)

        device_id = (self.device.index if self.device.index is not None
                     else torch.cuda.current_device()) if self.opts.cuda else None
        # The pipeline's own seed drives no augmentation (the feed draws it); fixed anyway.
        return graph(batch_size=self.batch_size,
                     num_threads=max(1, self.num_threads // pipelines),
                     device_id=device_id, seed=epoch_seed(self.seed, 0, self.rank) % 2**31,
                     prefetch_queue_depth=self._queue_depth(pipelines))

    @property
    def workers_configured(self) -> int:
        """The DALI CPU threads (``-j``), for :meth:`stage_summary`."""
        return self.num_threads

    def _to_torch(self, outputs, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``outputs`` as torch tensors (``batch``: of the epoch, for the ``--auto-augment``
        draws), the hand-over and the wait before it added to :attr:`stage_log`."""
        seed = batch_seed(self.seed, self.epoch, self.rank, batch)
        log, waited = self.stage_log, self._waited
        if log is None or waited is None:
            return outputs_to_torch(outputs, self.opts, self.device, seed)
        started, cpu, timing = time.perf_counter(), thread_cpu(), {}
        images, labels = outputs_to_torch(outputs, self.opts, self.device, seed, timing)
        log.add_hand_over(len(labels), timing, waited[0] + time.perf_counter() - started,
                          waited[1] + thread_cpu() - cpu, wait=waited[0])
        self._waited = None
        return images, labels
