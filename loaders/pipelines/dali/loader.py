"""The NVIDIA DALI pipeline's loader (``--dali``) over any random-access reader, fed by
``feed.BatchFeed`` threads, its pipelines built once per run (as NVIDIA's DALI ResNet-50
example), rebuilt only after a sample DALI could not decode or a pass left unfinished."""
from __future__ import annotations

import dataclasses
import re
import time
from typing import Iterator

import torch

from decode import decode, release_freed_memory
from decode.acceptance import check
from decode.messages import capture

from ...errors import AcceleratorError, DataError
from ...orders import Order
from ...orders.positions import RestOfEpoch
from ...readers import Reader
from ...settings import DistInfo, LoaderSettings
from ...timing import stages
from ...timing.stages import StageLog, thread_cpu
from ..ahead import JOIN_S
from ..bad_samples import DECODE_ERRORS, mark_unreadable, report_damaged
from ..batches import ReaderLoader, batch_seed, epoch_seed
from .feed import AcceptedReads, BatchFeed, FeedPass
from .graph import GraphOptions, finish_on_cpu, pipeline_outputs, window_mismatch

# DALI's and CUDA's words for a failed GPU or driver ("CUDA runtime API error cudaErrorMemory
# Allocation", "CUDA driver API error", "CUDA allocation failed", "out of memory"): not bad data.
_CUDA_FAILURE = re.compile(r"cuda (error|runtime|driver|allocation)|cudaerror|cuda_error|"
                           r"out of memory", re.IGNORECASE)


class DALILoader(ReaderLoader):
    """One split's DALI pipelines, fed each pass with ``reader``'s samples in the indices of
    ``order``. With CUDA, nvJPEG decodes (``--dali-cpu``: the CPU, as NVIDIA's
    DeepLearningExamples RN50) and the rest runs on the GPU; without, single-threaded CPU
    pipelines take turns and torch finishes each crop. A sample the acceptance rule refuses never
    reaches DALI; one DALI cannot decode is found with our CPU decoder; either is named,
    replaced and remembered (``unreadable``). Past ``max_bad_share``, or on another DALI failure,
    iterating raises :class:`DataError`; on a CUDA failure :class:`AcceleratorError`."""

    cpu_pipelines: int | None = None  # CPU-only pipelines taking turns (None: one per thread)
    forks = False  # DALI's and the feeds' threads share the flags in this process

    def __init__(self, reader: Reader, order: Order, opts: GraphOptions,
                 settings: LoaderSettings, dist: DistInfo):
        super().__init__(reader, order, settings, dist, opts.train)
        self.opts = opts
        self._split = "training" if opts.train else "validation"  # in messages
        self.num_threads = self.workers_configured = max(1, settings.workers)
        self._pipes, self._feeds = [], []
        self.pipeline_builds = 0  # pipelines built so far (tests: once per run)
        self.max_pixels = settings.max_image_pixels
        self._accepted = AcceptedReads(reader, self.unreadable, self.max_pixels)
        self.stage_log = self._waited = None
        if opts.train and stages.enabled():  # torch resizes and flips CPU-only (graph.py)
            names = ("read", "window") + (() if opts.cuda else ("resize", "augment"))
            self.stage_log = StageLog(names, "training thread (DALI's output)", rated=False,
                                      readers_name="feed threads")

    def set_epoch(self, epoch: int, start_batch: int = 0, rest: RestOfEpoch | None = None) -> None:
        """The next pass: ``epoch`` from batch ``start_batch`` (``rest``: dealt anew), after the
        heap's freed pages are handed back (else memory grows by epoch)."""
        release_freed_memory()
        super().set_epoch(epoch, start_batch, rest)

    @property
    def resolution(self) -> int:
        return self.opts.crop_size

    def set_resolution(self, size: int) -> None:
        """Training: RandomResizedCrop to ``size`` px from the next pass on (an input of the
        pipelines). Raises ``ValueError`` as :meth:`_check_resolution`."""
        self._check_resolution(size)
        self.opts = dataclasses.replace(self.opts, crop_size=size)

    def _pass(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order, step = self.pass_indices(), 0
        unreadable = self.unreadable
        if unreadable.count():  # known-bad samples: their replacements, as when found
            order = [unreadable.next_readable(i) if unreadable.known(i) else i for i in order]
        batch = self.batch_size
        finished, refused, erase = False, self._accepted.refused, self._eraser()
        with capture() as caught:  # what DALI's decoder prints, for the whole pass
            try:
                while step < len(self):
                    # DALI cannot skip a file it fails to decode: find it, swap it for a readable
                    # sample, and rebuild the pipelines from the failed batch on.
                    pipes, first = self._start_pass(order[step * batch:], len(self) - step,
                                                    self.start_batch + step), step
                    # Each pipeline runs up to its queue depth ahead: probes look that far.
                    lookahead = len(pipes) * (self._queue_depth(len(pipes)) + 1)
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
                            self._replace_unreadable(order, step, exc, lookahead)
                            self._check_bad()
                            break
                        lines = caught.take()  # a warning DALI's decoder printed: name its sample
                        if lines:
                            self._name_damaged(order, step, lines, lookahead)
                        refused, before = self._accepted.refused, refused  # one read: feeds add
                        self._check_bad(refused - before)  # the samples the feed refused meanwhile
                        if self.opts.train and self._skip_mismatched_window(order, step, outputs):
                            break
                        images, labels = self._to_torch(outputs, self.start_batch + step)
                        take = min(len(order) - step * batch, len(labels))
                        images, labels = images[:take], labels[:take]
                        if erase is not None:  # on torch's current stream, DALI's output stream
                            images = erase(images, step)
                        step += 1
                        yield images, labels
                    outputs = None
                finished = self._end_pass()
            finally:
                if not finished:  # left part-way: batches of this pass are still queued in DALI
                    self._drop_pipelines()

    def _num_pipelines(self, batches: int) -> int:
        """Pipelines taking turns over ``batches`` batches: 1 with CUDA; CPU-only,
        ``cpu_pipelines`` or one per thread (a multi-threaded DALI operator idles its threads on
        a batch's last images: ``benchmarks.pipelines.dali_cpu``, docs/performance.md)."""
        threads = self.cpu_pipelines or self.num_threads
        return 1 if self.opts.cuda else max(1, min(threads, batches))

    def _queue_depth(self, pipelines: int) -> int:
        # CUDA: 4 batches in flight, as the mixed decoder's p99 (24-34 ms per batch, DALI PR
        # #6366) exceeds ResNet-18's 17 ms H100 step, which depth 2 exposed. CPU-only: deeper
        # queues keep DALI decoding while the main thread resizes (+5-8% images/s at 4 on 2
        # cores), at most 8 batches queued in all.
        return 4 if self.opts.cuda else max(1, min(4, 8 // pipelines))

    def _run(self, pipe):
        """One batch of ``pipe``: with CUDA on torch's current stream (the host does not wait),
        else when ready; with a stage log, :attr:`_waited` gets the wait's wall and CPU s."""
        if self.stage_log is not None:
            started, cpu = time.perf_counter(), thread_cpu()
        outputs = pipe.run(torch.cuda.current_stream(self.device)) if self.opts.cuda else pipe.run()
        if self.stage_log is not None:
            self._waited = (time.perf_counter() - started, thread_cpu() - cpu)
        return outputs

    def _start_pass(self, order: list[int], batches: int, first_batch: int) -> list:
        """The pipelines (built on first use or when their number changes) fed ``order``:
        pipeline ``p`` of ``n`` reads batches ``p, p + n, ...``, the first ``first_batch``."""
        n = self._num_pipelines(batches)
        if len(self._pipes) != n:
            self._drop_pipelines()
            self._pipes = self._build_pipelines(n)
        epoch = self.epoch if self.opts.train else 0
        for index, feed in enumerate(self._feeds):
            feed.start(FeedPass(tuple(order), epoch, first_batch, self.opts.crop_size, index, n))
        return self._pipes

    def _end_pass(self) -> bool:
        """After a pass's last batch, let each pipeline see its source end and reset it; False
        if one still had data (never after a complete pass)."""
        for pipe in self._pipes:
            try:
                self._run(pipe)
                return False
            except StopIteration:
                pipe.reset()
        return True

    def close(self) -> None:
        """Free the pipelines, stop their feeds (each given ``ahead.JOIN_S``); idempotent."""
        self._drop_pipelines(JOIN_S)

    def _drop_pipelines(self, wait_s: float | None = None) -> None:
        for feed in self._feeds:
            feed.close(wait_s)  # its reading thread stops; what it read ahead is dropped
        self._pipes, self._feeds = [], []  # freed (with their GPU memory) when collected

    def _build_pipelines(self, n: int) -> list:
        """``n`` built pipelines and their feeds (:attr:`_feeds`), counted in pipeline_builds."""
        from nvidia.dali import pipeline_def

        # DALI's auto_aug selects an op per sample through conditionals
        @pipeline_def(enable_conditionals=self.opts.cuda and self.opts.augment is not None)
        def graph(feed):
            return pipeline_outputs(feed, self.opts)

        self._feeds = [BatchFeed(self._accepted, self.opts, self.batch_size, self.seed,
                                 self.rank, keep=self._queue_depth(n) + 1, log=self.stage_log)
                       for _ in range(n)]
        device_id = (self.device.index if self.device.index is not None
                     else torch.cuda.current_device()) if self.opts.cuda else None
        # The pipeline's own seed drives no augmentation (the feed draws it); fixed anyway.
        pipes = [graph(feed, batch_size=self.batch_size, num_threads=max(1, self.num_threads // n),
                       device_id=device_id, seed=epoch_seed(self.seed, 0, self.rank) % 2**31,
                       prefetch_queue_depth=self._queue_depth(n)) for feed in self._feeds]
        for pipe in pipes:
            pipe.build()
        self.pipeline_builds += n
        return pipes

    def _to_torch(self, outputs, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``outputs`` as yielded, timed in :attr:`stage_log`: CPU-only by
        :func:`.graph.finish_on_cpu` (``batch`` of the epoch seeds the augment draws); with CUDA
        ``opts.dtype`` images (channels-last NCHW views of DALI's NHWC) and int64 labels, DALI's
        GPU buffers taken by DLPack without a copy (DALI 2.4 keeps one while torch holds it, as
        its PyTorch iterator does), on torch's current stream (DALI's)."""
        log, opts = self.stage_log, self.opts
        timing = None if log is None else {}
        if log is not None:
            started, cpu = time.perf_counter(), thread_cpu()
        if not opts.cuda:
            seed = batch_seed(self.seed, self.epoch, self.rank, batch)
            images, labels = finish_on_cpu(outputs, opts, seed, timing)
        else:
            copy_started = time.perf_counter()
            with torch.cuda.device(self.device):
                images, labels = (torch.from_dlpack(out.as_tensor())
                                  for out in (outputs[0], outputs[-1]))
            if opts.dtype == torch.bfloat16:  # DALI has no bfloat16: the one copy, on the GPU
                images = images.to(torch.bfloat16)
            if opts.channels_last:
                images = images.permute(0, 3, 1, 2)  # NHWC storage viewed as channels-last NCHW
            labels = labels.reshape(-1).to(torch.int64)
            if timing is not None:
                timing["copy"] = time.perf_counter() - copy_started
        if log is not None:
            waited = self._waited
            log.add_hand_over(len(labels), timing, waited[0] + time.perf_counter() - started,
                              waited[1] + thread_cpu() - cpu, wait=waited[0])
        return images, labels

    def _name_damaged(self, order: list[int], step: int, lines: list[str], lookahead: int) -> None:
        """Name once (``warned``) the sample whose CPU decode prints ``lines`` too, among batches
        ``step - lookahead .. step + lookahead`` (DALI's threads decode ahead, and their output
        may arrive late); a sample named before takes them unprobed; none: one line says so."""
        first = max(0, step - lookahead)
        window = order[first * self.batch_size:(step + lookahead) * self.batch_size]
        if any(self.bad.warned.known(index) for index in window):
            return
        found = False
        for index in window:
            if self.unreadable.known(index):  # refused by the feed, never handed to DALI
                continue
            try:
                data = self.reader.read(index)[0]
                check(data, self.max_pixels)
                with capture() as caught:
                    decode(data)
            except DECODE_ERRORS:
                continue
            found = found or bool(caught.lines)
            if caught.lines and self.bad.warned.mark(index):
                report_damaged(self.reader.name_of(index), caught.lines)
        if not found:
            report_damaged(f"(one of batches {first}-{step + lookahead - 1} of the "
                           f"{self._split} split; our CPU decoder decodes them without a "
                           "warning)", lines)

    def _replace_unreadable(self, order: list[int], step: int, exc: RuntimeError,
                            lookahead: int) -> None:
        """Probe batches ``step .. step + lookahead`` (DALI runs ahead) with :meth:`_readable`,
        each unreadable sample replaced in ``order`` by the next readable index. Raises
        :class:`DataError` (DALI's message) if none."""
        batch = self.batch_size
        window = range(step * batch, min(len(order), (step + lookahead) * batch))
        found = 0
        for position in window:
            index = order[position]
            while not self._readable(index):
                index = self.unreadable.next_readable(index)
                found += 1
                if found > len(window):
                    raise DataError(f"DALI: {found} unreadable samples near batch {step}: "
                                    "is this dataset damaged?")
            order[position] = index
        if found == 0:
            lines = message_lines(exc)
            raise DataError(f"DALI failed on the {self._split} split at or shortly after batch "
                            f"{step} of this pass: {lines[-1] if lines else exc}") from None

    def _readable(self, index: int) -> bool:
        """Whether sample ``index`` passes the acceptance rule and our CPU decoder (else marked
        and reported)."""
        try:
            data = self.reader.read(index)[0]
            check(data, self.max_pixels)
            decode(data)
        except DECODE_ERRORS as exc:
            mark_unreadable(self.unreadable, index, self.reader.name_of, exc)
            return False
        return True

    def _skip_mismatched_window(self, order: list[int], step: int, outputs) -> bool:
        """Whether a sample of batch ``step`` has a wrong window (:func:`.graph.window_mismatch`):
        it is then reported, marked and replaced in ``order``, the pipelines dropped. Raises
        :class:`DataError` past ``max_bad_share``."""
        found = window_mismatch(outputs)
        if found is None:
            return False
        self._drop_pipelines()
        position, reason = found
        position += step * self.batch_size
        index = order[position]
        mark_unreadable(self.unreadable, index, self.reader.name_of, DataError(reason))
        order[position] = self.unreadable.next_readable(index)
        self._check_bad()
        return True


def message_lines(exc: Exception) -> list[str]:
    """The lines of a DALI error that say something (no blanks, no "Current pipeline ...")."""
    return [line.strip() for line in str(exc).splitlines()
            if line.strip() and not line.startswith("Current pipeline")]


def cuda_failure(exc: Exception) -> str | None:
    """A DALI error naming a CUDA or driver failure in one line (from the last such), else None."""
    lines = message_lines(exc)
    hits = [i for i, line in enumerate(lines) if _CUDA_FAILURE.search(line)]
    return " ".join(lines[hits[-1]:]) if hits else None
