"""The batch-decode pipeline (``--decode-device cuda`` or ``cpu-nvimgcodec``): DataLoader workers
read the bytes and draw the windows, :class:`BatchDecodeLoader` decodes each batch."""
from __future__ import annotations

import itertools
import sys
import time
import weakref
from typing import Iterator

import numpy as np
import torch

from decode import decode, image_size
from decode.acceptance import MAX_PIXELS, check
from decode.gpu import CudaChoice, WindowDecoder, nvjpeg_hint, probe_cuda, to_device

from ..errors import AcceleratorError, DataError
from ..orders import Order
from ..readers import Reader
from ..settings import DistInfo, LoaderSettings
from ..timing import stages
from ..timing.stages import no_clock, thread_cpu
from ..transforms import TrainTransform, center_crop_plan
from ..transforms.normalize import imagenet_mean_std, normalize_into
from .ahead import RunAhead, one_ahead
from .bad_samples import BadSamples, mark_unreadable, report_damaged
from .batches import NumberedBatch, ReaderLoader, SampleBatches, hand_over


class WindowBatches(SampleBatches):
    """``reader``'s samples as the workers hand them over. A batch -> a dict: ``data`` uint8 (the
    encoded bytes end to end), ``offsets`` int64 ``(N + 1,)``, ``windows`` int64 ``(N, 4)`` (top,
    left, height, width), ``flips`` bool ``(N,)``, ``labels``/``indices`` int64 ``(N,)``,
    ``frames`` int64 ``(N, 6)`` (-1 for training), ints ``number`` and ``found``; with a ``clock``
    (a ``StageClock``) also float64 ``stages`` ``(N, IMAGE_COLUMNS)`` and ``stage_batch``."""

    def __init__(self, reader: Reader, val_sizes: tuple[int, int] | None, bad: BadSamples,
                 clock=None, max_pixels: int = MAX_PIXELS):
        super().__init__(reader, bad, max_pixels)
        self.val_sizes, self.clock, self.draw = val_sizes, clock, TrainTransform()

    def sample(self, index: int):
        """``(bytes, window, flip, index, frame, label)``: training's RandomResizedCrop window
        (the CPU loaders', the batch's seed; ``frame`` -1s), or validation's central crop region
        and frame as resize-then-crop takes it (``val_sizes`` = ``(resize, crop)``); sizes from
        the header the acceptance rule read, else a whole decode (which raises for non-images)."""
        clock = self.clock
        started = time.perf_counter() if clock is not None else 0.0
        data, label = self.reader.read(index)
        if clock is not None:
            read = time.perf_counter()
            clock.t[stages.READ] += read - started
            clock.t[stages.BYTES] = len(data)
        frame = check(data, self.max_pixels)
        if self.val_sizes is not None:
            size = image_size(data, frame)
            if size is None:  # no header parser reads it: the whole decode raises, or sizes it
                size = tuple(decode(data).shape[-2:])
            window, frame = center_crop_plan(*size, *self.val_sizes)
            return data, window, False, index, frame, label
        window, flip, _ = self.draw.window(data, lambda d: image_size(d, frame), frame)
        if clock is not None:
            clock.t[stages.WINDOW] += time.perf_counter() - read
        return data, window, flip, index, (-1,) * 6, label

    def _batch(self, batch: NumberedBatch) -> dict:
        clock = self.clock
        if clock is None:
            fetched = [self[index] for index in batch]
        else:
            clock.begin_batch()
            rows, fetched = np.zeros((len(batch), stages.IMAGE_COLUMNS)), []
            for i, index in enumerate(batch):
                clock.begin_image()
                fetched.append(self[index])
                rows[i] = clock.t
        datas, windows, flips, indices, frames, labels = zip(*(sample for sample, _ in fetched))
        out = dict(data=torch.tensor(np.frombuffer(b"".join(datas), dtype=np.uint8)),
                   offsets=torch.tensor(np.cumsum([0, *map(len, datas)]), dtype=torch.int64),
                   number=batch.number, found=sum(found for _, found in fetched),
                   windows=torch.tensor(windows, dtype=torch.int64).view(-1, 4),
                   flips=torch.tensor(flips, dtype=torch.bool),
                   labels=torch.tensor(labels, dtype=torch.int64),
                   indices=torch.tensor(indices, dtype=torch.int64),
                   frames=torch.tensor(frames, dtype=torch.int64).view(-1, 6))
        if clock is not None:  # the packing is inside the batch's wall time, outside a stage
            row = np.zeros(stages.BATCH_COLUMNS)
            clock.end_batch(row, 0.0)
            out.update(stages=torch.from_numpy(rows), stage_batch=torch.from_numpy(row))
        return out


class BatchDecodeLoader(ReaderLoader):
    """A :class:`ReaderLoader` whose workers read the bytes and draw the windows
    (:class:`WindowBatches`), and whose ``decoder`` decodes, resizes, flips and normalises each
    batch here, in a thread two batches ahead (``-j 0``: one, on the training thread), on CUDA
    on a side stream. A sample it declines is decoded on the CPU (:attr:`cpu_fallbacks`); one
    nothing decodes is replaced by another of its batch (:attr:`unreadable`); one a native
    decoder warned about is named once and kept. Training measures its stages (CUDA: host s)."""

    def __init__(self, reader: Reader, order: Order, settings: LoaderSettings, dist: DistInfo,
                 train: bool, decoder: WindowDecoder):
        super().__init__(reader, order, settings, dist, train)
        self.decoder, self.cpu_fallbacks = decoder, 0
        self.resolution = settings.crop_size(train)  # the side (px) of its images
        mean, std = imagenet_mean_std(self.device)
        self.scale, self.shift = 1 / std, -mean / std  # queued on the current stream
        workers = settings.workers  # the clock goes to the workers, the log stays here
        clock = stages.StageClock() if train and stages.enabled() else None
        side = "decode thread" if workers > 0 else "training thread's decode"  # -j 0: no thread
        # workers read and draw windows; the decode thread decodes, resizes and flips ("augment")
        names = ("read", "window", "decode", "resize", "augment")
        self.stage_log = stages.StageLog(names, side) if clock else None
        val_sizes = None if train else (settings.val_resize_size, settings.val_crop_size)
        self._dataset = WindowBatches(reader, val_sizes, self.bad, clock, settings.max_image_pixels)
        self.loader = self._dataloader(self._dataset, workers)
        self._passes: weakref.WeakSet = weakref.WeakSet()  # passes not yet finished
        self.set_epoch(0)

    def set_resolution(self, size: int) -> None:
        """Training: windows resized to ``size`` px from the next batch decoded on. Raises
        ``ValueError`` for validation or a size outside ``1..max_crop_size``."""
        self._check_resolution(size)
        self.resolution = size

    def close(self) -> None:
        """Stop the workers, then a part-way pass's decode thread (a later pass starts anew)."""
        self.loader.close()  # first: a decode thread waiting on a stuck worker then ends
        for unfinished in list(self._passes):
            unfinished.close()
        self.loader = self._dataloader(self._dataset, self.loader.num_workers)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        batches = self._pass()
        self._passes.add(batches)
        return self._delivered(batches)

    def _pass(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self._plan()
        stream, fallbacks = None, self.cpu_fallbacks
        if self.device.type == "cuda":  # a side stream, after scale/shift were written
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
        # -j 0: one ahead on this thread, as the reading seeds torch's global RNG per batch
        batches = self._decoded(stream, len(self), self._eraser())
        batches = RunAhead(batches) if self.loader.num_workers > 0 else one_ahead(batches)
        try:
            for images, labels, done in batches:
                yield hand_over((images, labels), done, self.device)
        finally:
            batches.close()
            if stream is not None:
                stream.synchronize()  # the next pass may reuse what this one decodes into
            if self.cpu_fallbacks > fallbacks:
                print(f"note: {self.cpu_fallbacks - fallbacks} samples decoded on the CPU "
                      f"this pass ({self.decoder.kind} batch decoder declined them)",
                      file=sys.stderr, flush=True)

    def _decoded(self, stream, total: int, erase):
        """``(images, labels, done)`` of this pass's ``total`` batches (:meth:`_decode`; ``done``:
        on CUDA the side stream's event after them), their seconds in :attr:`stage_log`."""
        log = self.stage_log
        for item in itertools.islice(self.loader, total):
            self._check_bad(item["found"])
            timing = {} if log is not None else None
            started, cpu = (time.perf_counter(), thread_cpu()) if timing is not None else (0, 0)
            images, labels = self._decode(item, stream, timing, erase)
            if timing is not None:
                wall, cpu = time.perf_counter() - started, thread_cpu() - cpu
                count, rows = len(item["labels"]), item["stages"].numpy()
                batch = item["stage_batch"].numpy()
                log.add("read", rows[:, stages.READ])
                log.add("window", rows[:, stages.WINDOW])
                log.add_reader(int(batch[stages.WORKER]), count, float(batch[stages.WALL]),
                               float(batch[stages.CPU]), float(rows[:, :stages.DECODE].sum()),
                               float(rows[:, stages.BYTES].sum()))
                log.add_hand_over(count, timing, wall, cpu)
            yield images, labels, None if stream is None else stream.record_event()

    def _decode(self, item: dict, stream, timing: dict | None = None,
                erase=None) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch decoded, resized, flipped, normalised and erased (``erase(images, number)``,
        if given), on ``stream`` on CUDA; ``timing`` gets the host seconds of ``"decode"``,
        ``"resize"``, ``"augment"`` (flip), ``"copy"`` (erasing included)."""
        clock = time.perf_counter if timing is not None else no_clock
        data, offsets = item["data"].numpy(), item["offsets"].tolist()
        datas = [data[a:b] for a, b in zip(offsets, offsets[1:])]
        windows = [tuple(w) for w in item["windows"].tolist()]
        frames = None if self.train else [tuple(f) for f in item["frames"].tolist()]
        with torch.cuda.stream(stream):  # None: no stream (the CPU)
            try:
                out = self.decoder.decode(datas, windows, (self.resolution, self.resolution),
                                          0 if stream is None else stream.cuda_stream, frames,
                                          timing)
            except torch.cuda.OutOfMemoryError as exc:
                raise AcceleratorError(f"GPU decode: {exc}".splitlines()[0]) from None
            decoded = clock()
            self.cpu_fallbacks += len(out.fallback) - len(out.failed)  # decoded on the CPU
            for position, lines in out.warnings:
                index = int(item["indices"][position])
                if self.bad.warned.mark(index):
                    report_damaged(self.reader.name_of(index), lines)
            images, labels = out.images, item["labels"]
            if out.failed:
                images, labels = self._replace_failed(out, item)
            replaced = clock()
            if images.device.type != self.device.type:  # cpu-nvimgcodec beside a GPU
                images = to_device(images, self.device)
            moved = clock()
            flips = item["flips"]
            if bool(flips.any()):  # a CPU tensor: no device sync; the copy does not block
                where = to_device(flips.nonzero().flatten(), self.device)
                images[where] = images[where].flip(-1)
            flipped = clock()
            images = normalize_into(images, self.scale, self.shift, self.dtype, self.channels_last)
            if erase is not None:
                images = erase(images, item["number"])
            labels = to_device(labels, self.device)
            if timing is not None:  # a replaced sample's CPU decode counts as decode
                timing["decode"] += replaced - decoded
                timing.update(augment=flipped - moved, copy=clock() - flipped + moved - replaced)
            return images, labels

    def _replace_failed(self, out, item):
        """The batch with each undecodable sample marked, named and replaced by its first decoded
        image. Raises :class:`DataError` if none decoded, or past ``max_bad_share``."""
        failed = {i for i, _ in out.failed}
        good = next((i for i in range(len(out.images)) if i not in failed), None)
        if good is None:
            raise DataError(f"no sample of a batch of {len(out.images)} decoded: is the "
                            "data damaged?")
        images, labels, found = out.images, item["labels"].clone(), 0
        for i, exc in out.failed:
            index = int(item["indices"][i])
            found += mark_unreadable(self.unreadable, index, self.reader.name_of, exc)
            images[i], labels[i] = images[good], labels[good]
        self._check_bad(found)
        return images, labels


def make_decoder(settings: LoaderSettings, dist: DistInfo) -> WindowDecoder:
    """The batch decoder of ``settings.decode_device`` (``cuda``: :func:`decode.gpu.probe_cuda`'s
    choice). Raises :class:`AcceleratorError` for ``cuda`` on a CPU device or where no GPU
    decoder decodes (unless ``allow_cpu_decode``), and without nvImageCodec."""
    kind = settings.decode_device
    if kind == "cuda" and dist.device.type != "cuda":
        raise AcceleratorError("--decode-device cuda needs a CUDA device (use cpu-nvimgcodec "
                               "for the same pipeline on nvImageCodec's CPU backend)")
    device = dist.device if kind == "cuda" else torch.device("cpu")
    library = "default"
    if kind == "cuda":
        choice = probe_cuda(device, settings.hw_decoder_load)
        if choice.library is None and not settings.allow_cpu_decode:
            raise AcceleratorError(refusal(choice))
        library = None if choice.library == "torchvision" else "default"
    try:
        return WindowDecoder(kind, device, settings.hw_decoder_load,
                             threads=max(1, settings.workers), library=library)
    except RuntimeError as exc:
        raise AcceleratorError(str(exc).splitlines()[0]) from None


def refusal(choice: CudaChoice) -> str:
    """The one line ``--decode-device cuda`` stops with where no GPU decoder decodes."""
    return (f"--decode-device cuda: no GPU decoder decodes on {choice.device} "
            f"({'; '.join(choice.problems)}): {nvjpeg_hint()}, or pass --allow-cpu-decode to "
            "decode every window on the CPU")


def build_loaders(train: Reader, val: Reader, settings: LoaderSettings, dist: DistInfo):
    """``(train, val)`` :class:`BatchDecodeLoader` s sharing one decoder; raises as
    :meth:`~.batches.ReaderLoader.pair` and :func:`make_decoder`."""
    return BatchDecodeLoader.pair(train, val, settings, dist, make_decoder(settings, dist))
