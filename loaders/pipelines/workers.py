"""The DataLoader-workers pipeline: any reader's samples decoded and cropped to uint8 in
DataLoader worker processes, written straight into reused shared-memory batch slots
(``_shared_batches``), then copied to the training device and normalised there
(``_cuda_feed``: page-locked slots and a side stream one batch ahead, as timm's PrefetchLoader
and NVIDIA's DeepLearningExamples ConvNets do): a uint8 batch is 4x smaller to pass between
processes, pin and copy than a float one.
"""
from __future__ import annotations

import itertools
import time
from typing import Iterator

import torch
from torch.utils.data import Dataset

from decode.acceptance import MAX_PIXELS, check

from .. import stages
from ..batch_stages import StagedLoader
from .._bad_samples import TolerantDataset, too_many_unreadable
from ..contract import DistInfo, LoaderSettings, epoch_seed
from ..normalize import imagenet_mean_std, normalize
from ..auto_augment import make_auto_augment
from ..orders import Order, ResumableSampler, batches_per_epoch, train_batch_size
from ..positions import PositionedLoader, RestOfEpoch
from ..readers import Reader
from ..transforms import split_transform
from ._closing import ClosingDataLoader
from ._cuda_feed import CudaFeeder, page_lock
from ._shared_batches import (NumberedBatchSampler, PassPlan, SharedBatches, SlotWriter,
                              keep_as_is, slots_for)


class _Transformed(Dataset):
    """``reader``'s sample ``i`` as ``(transform(bytes), label)``, named as the reader names it
    (what :class:`~loaders._bad_samples.TolerantDataset` wraps), the bytes first judged by the
    acceptance rule (:func:`decode.acceptance.check` with ``max_pixels``; it raises
    ``decode.acceptance.Refused``, a ``ValueError``, before any pixel is decoded); ``clock`` (a
    :class:`loaders.stages.StageClock` or None) gets each read's seconds and bytes."""

    def __init__(self, reader: Reader, transform, clock=None, max_pixels: int = MAX_PIXELS):
        self.reader, self.transform, self.clock = reader, transform, clock
        self.max_pixels = max_pixels

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int):
        clock = self.clock
        if clock is None:
            data, label = self.reader.read(index)
            check(data, self.max_pixels)
            return self.transform(data), label
        start = time.perf_counter()
        data, label = self.reader.read(index)
        read = time.perf_counter()
        clock.t[stages.READ] += read - start
        clock.t[stages.BYTES] = len(data)
        check(data, self.max_pixels)
        clock.t[stages.WINDOW] += time.perf_counter() - read  # a header parse, as the window's
        return self.transform(data), label

    def name_of(self, index: int) -> str:
        return self.reader.name_of(index)


class DeviceLoader(StagedLoader, PositionedLoader):
    """Reads ``reader``'s samples (a :class:`~loaders.readers.Reader`) in the indices of
    ``order`` (its training or validation :class:`~loaders.orders.Order`) with a DataLoader of
    ``workers`` processes, each sample's bytes turned by ``transform`` into uint8
    ``(3, crop_size, crop_size)`` (``loaders.transforms``), and yields ``(images, labels)``
    ready for the model, ``batch_size`` per batch (training: whole batches only; validation:
    the last one may be partial).

    Yields ``images``: float32 ``(N, 3, H, W)`` on ``device`` (on CUDA: ``dtype``, e.g. the
    autocast dtype, see :func:`~loaders.contract.input_dtype`), normalised with the ImageNet
    mean/std (``loaders.normalize``; channels-last memory format if
    ``channels_last``), and ``labels``: int64 ``(N,)`` on ``device``. ``len()`` is exact:
    :func:`~loaders.orders.batches_per_epoch` of the order, capped at ``max_batches``, less the
    batches skipped by ``set_epoch(epoch, start_batch)``. ``classes`` lists the class names
    (index = label). ``sampler`` is the :class:`~loaders.orders.ResumableSampler` over ``order``.

    Workers write uint8 batches into shared slots (``image_shape`` ``(3, H, W)``), which are
    reused from epoch to epoch; a loader's workers (training's and validation's) are started
    once and kept from pass to pass (``persistent_workers``; :meth:`close` stops them). On the
    CPU each batch is normalised out of its slot before it is yielded; on CUDA the slots are
    page-locked and each batch is copied to the GPU and normalised there on a side stream one
    batch ahead (:class:`~loaders.pipelines._cuda_feed.CudaFeeder`). The random crops of
    training batch ``k`` of an epoch are drawn from
    :func:`~loaders.pipelines._shared_batches.batch_seed` ``(seed,
    epoch, rank, k)``, whichever worker draws them and however many there are, and a resumed
    epoch (``set_epoch(epoch, start_batch)``) draws those of the uninterrupted run.
    A sample that the acceptance rule refuses (``max_pixels``, ``--max-image-pixels``:
    :mod:`decode.acceptance`) or that fails to decode is replaced by the next readable one,
    named once on stderr
    and remembered for the loader's lifetime (``unreadable``, an
    :class:`~loaders._bad_samples.UnreadableSet` shared by the workers of every pass), so later
    epochs and passes never draw it again (:class:`~loaders._bad_samples.TolerantDataset`);
    when the distinct unreadable samples exceed ``max_bad_share`` of ``len(reader)`` (the
    split), iterating raises :class:`DataError`. Raises :class:`DataError` at construction if
    a training ``order`` is empty; one holding less than one batch is read as one smaller
    batch (:func:`~loaders.orders.train_batch_size`: ``batch_size`` is then that size).

    Workers outlive a pass (forking and starting them costs about 0.1 s per epoch on
    2 cores, docs/performance.md; validation's too since issue 38) unless the reader plans each pass (streamed shards: the
    workers fork with the plan, :attr:`~loaders.readers.Reader.plans_passes`).

    A training loader measures where its workers' time goes (:mod:`loaders.stages`, unless
    ``IMAGENET_FAST_STAGES=0``): :meth:`stage_summary` gives the figures of the batches
    yielded since the last reset.
    """

    def __init__(self, reader: Reader, order: Order, transform, *, train: bool,
                 batch_size: int, workers: int, device: torch.device, crop_size: int,
                 channels_last: bool, max_batches: int | None, seed: int, rank: int,
                 max_bad_share: float, dtype: torch.dtype, max_crop_size: int | None = None,
                 max_pixels: int = MAX_PIXELS):
        if train:
            batch_size = train_batch_size(order, batch_size)
        self.reader, self.transform = reader, transform
        self.sampler = ResumableSampler(order)
        self.position_order = order
        self.train, self.batch_size = train, batch_size
        self.dtype = dtype
        self.image_shape = (3, crop_size, crop_size)
        self.max_crop_size = max(crop_size, max_crop_size or 0)
        self.max_bad_share = max_bad_share
        self.start_batch = 0
        self.epoch = 0
        self.device = device
        self.classes = list(reader.classes)
        self.channels_last = channels_last
        self.max_batches = max_batches
        self.seed = seed
        self.rank = rank
        self.mean, self.std = imagenet_mean_std(device)
        # Per-stage time of the training workers (loaders.stages): the clock goes to the
        # workers with the reader wrapper, the transform and the slot writer; the log is ours.
        self._clock = stages.StageClock() if train and stages.enabled() else None
        self.stage_log = stages.StageLog() if self._clock is not None else None
        if self._clock is not None and hasattr(transform, "clock"):
            transform.clock = self._clock
        # Held here: each pass hands it the slots before the workers start.
        tolerant = TolerantDataset(_Transformed(reader, transform, self._clock, max_pixels),
                                   shared=workers > 0)
        # Flags made here, before any worker starts, and kept for the loader's lifetime.
        self.unreadable = tolerant.unreadable
        # Workers that outlive a pass learn a new resolution from the batches (set_resolution).
        self._writer = SlotWriter(tolerant, transform if train else None, self._clock)
        # drop_last for training: no tiny last batch for BatchNorm.
        self._batches = NumberedBatchSampler(self.sampler, batch_size, drop_last=train)
        # The workers' base seed; the crops are seeded per batch (PassPlan).
        self._generator = torch.Generator().manual_seed(epoch_seed(seed, 0, rank))
        self._made: list[ClosingDataLoader] = []  # every DataLoader a pass used: close() stops
        self.loader = self._dataloader(workers)
        # (DataLoader, slots or None) of the last finished pass; None while a pass is suspended.
        self._idle: tuple[ClosingDataLoader, SharedBatches | None] | None = (self.loader, None)
        self._feeder = None  # CudaFeeder, made at the first pass on CUDA
        self._locked = False  # whether the current slots are page-locked
        self.set_epoch(0)

    def _dataloader(self, workers: int, context=None) -> ClosingDataLoader:
        loader = ClosingDataLoader(
            self._writer, batch_sampler=self._batches, collate_fn=keep_as_is,
            num_workers=workers, generator=self._generator,
            prefetch_factor=4 if workers > 0 else None, multiprocessing_context=context,
            persistent_workers=workers > 0 and not self.reader.plans_passes)
        self._made.append(loader)
        return loader

    def __len__(self) -> int:
        total = batches_per_epoch(len(self.sampler.order), self.batch_size, self.train,
                                  self.max_batches)
        return max(0, total - self.start_batch)

    def set_epoch(self, epoch: int, start_batch: int = 0,
                  rest: RestOfEpoch | None = None) -> None:
        """Make this epoch's shuffle and augmentation a function of (seed, epoch, rank), and
        start it at batch ``start_batch`` (for a resumed epoch; the batches before it are the
        ones already trained on); ``rest``: a resumed epoch dealt anew at this layout, whose
        indices are read instead (:mod:`loaders.positions`)."""
        self.sampler.set_epoch(epoch)
        self.sampler.start = start_batch * self.batch_size
        self.sampler.rest = self._take_rest(epoch, start_batch, rest)
        self.start_batch = start_batch
        self.epoch = epoch
        if self.reader.plans_passes:
            # A pass dealt anew reads local shards at random (streams refuse it: engine.position)
            resumed = start_batch and self.sampler.rest is None
            self.reader.plan_pass(self.sampler.order, epoch,
                                  list(self.sampler) if resumed else None)

    def pass_indices(self) -> list[int]:
        """The dataset indices the next pass yields, in order (before an unreadable sample's
        replacement)."""
        return list(itertools.islice(self.sampler, len(self) * self.batch_size))

    @property
    def resolution(self) -> int:
        """The side in pixels of the images the next pass yields."""
        return self.image_shape[-1]

    def set_resolution(self, size: int) -> None:
        """Training loaders: RandomResizedCrop to ``size`` px from the next pass on
        (progressive resizing, :class:`engine.resolution.ResolutionSchedule`). The batch slots
        were sized for ``max_crop_size`` and are reused: nothing is allocated or restarted.
        Raises ``ValueError`` for a validation loader or a size above ``max_crop_size``."""
        if not self.train:
            raise ValueError("set_resolution: validation sizes are fixed (--val-crop-size)")
        if not 0 < size <= self.max_crop_size:
            raise ValueError(f"set_resolution({size}): the slots hold at most "
                             f"{self.max_crop_size} px")
        self.transform.size = (size, size)  # workers started from now on fork with it
        self.image_shape = (3, size, size)  # running ones take it from the batches

    @property
    def workers_configured(self) -> int:
        """This loader's DataLoader worker count (``-j``), for :meth:`stage_summary`."""
        return self.loader.num_workers

    def close(self) -> None:
        """Stop every worker this loader started: those kept between passes and those of a
        pass left part-way (an error, Ctrl-C, a stop signal), joined, or killed when they do
        not leave within :data:`~loaders.pipelines._closing.STOP_GRACE_S`; the batch slots
        are let go (their shared memory is freed with the last mapping). Safe to call on
        any way out, more than once; a later pass starts new workers and slots."""
        made, self._made = self._made, []
        for loader in made:
            loader.close()
        self.loader = self._dataloader(self.loader.num_workers,
                                       self.loader.multiprocessing_context)
        self._idle = (self.loader, None)

    def _fresh_dataloader(self) -> ClosingDataLoader:
        """A DataLoader like ``self.loader`` (its workers and start method), none started."""
        return self._dataloader(self.loader.num_workers, self.loader.multiprocessing_context)

    def _take(self) -> tuple[ClosingDataLoader, SharedBatches]:
        """The DataLoader (with its workers, if kept) and slots of the last finished pass, else
        new ones: a pass left suspended keeps its own."""
        pair, self._idle = self._idle, None
        if pair is None:
            pair = (self._fresh_dataloader(), None)
        loader, pool = pair
        if pool is None:
            workers = loader.num_workers
            pool = SharedBatches(
                slots_for(workers, loader.prefetch_factor or 0), self.batch_size,
                self.image_shape, channels_last=self.channels_last or self.device.type == "cuda",
                shared=workers > 0, max_image_shape=(3, self.max_crop_size, self.max_crop_size))
            if self.device.type == "cuda":
                self._locked = page_lock((pool.memory, pool.labels), owner=pool)
        pool.set_shape(self.image_shape)
        return loader, pool

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        loader, pool = self._take()
        self._writer.use(pool)  # workers start (fork, or pickle it) with these slots
        seed_key = (self.seed, self.epoch, self.rank, self.start_batch) if self.train else None
        plan = PassPlan(pool.begin_pass(), self.image_shape, seed_key, len(self))
        self._batches.plan = plan  # taken by the pass that starts now
        batches = iter(loader)
        filled = self._filled(batches)
        if self.stage_log is not None:
            filled = self._logged(filled, pool)
        try:
            if self.device.type == "cuda":
                if self._feeder is None:
                    self._feeder = CudaFeeder(self.device, self.dtype, self.channels_last,
                                              self.mean, self.std)
                    self._feeder.timing = self.stage_log
                yield from self._feeder.batches(pool, filled, self._locked, plan.pass_id)
            else:
                for number, slot, count in filled:
                    copy_started = time.perf_counter()
                    images, labels = pool.batch(slot, count)
                    # New memory: the slot is refilled by a later batch once released.
                    images = normalize(images, self.mean, self.std, self.channels_last)
                    labels = labels.clone()
                    if self.stage_log is not None:
                        self.stage_log.add_copy(time.perf_counter() - copy_started)
                    pool.release(slot, number, plan.pass_id)
                    yield images, labels
        finally:
            # Workers of this pass that are not kept are shut down (joined) as the iterator
            # goes; kept ones finish the batches in flight before the next pass starts.
            filled.close()
            del filled, batches
            if any(loader is made for made in self._made):  # not one close() already stopped
                self._idle = (loader, pool)

    def _logged(self, filled, pool) -> Iterator[tuple[int, int, int]]:
        """``filled`` as it is, each batch's stage rows added to :attr:`stage_log` first (the
        slot is not released before it is yielded)."""
        images, batch = pool.stage_images.numpy(), pool.stage_batches.numpy()
        try:
            for number, slot, count in filled:
                self.stage_log.add(images[slot], batch[slot], count)
                yield number, slot, count
        finally:
            filled.close()

    def _filled(self, batches) -> Iterator[tuple[int, int, int]]:
        """``(number, slot, count)`` of this pass's written slots, ``len(self)`` of them;
        raises :class:`DataError` once the distinct unreadable samples of the split exceed
        ``max_bad_share`` of its size (counted only after a batch that found a new one)."""
        total = len(self)
        size = len(self.reader)
        allowed = self.max_bad_share * size
        for step, (number, slot, count, found) in enumerate(batches):
            if step == total:
                return
            if found:
                bad = self.unreadable.count()
                if bad > allowed:
                    raise too_many_unreadable(bad, self.max_bad_share, size)
            yield number, slot, count


def build_loaders(train: Reader, val: Reader, settings: LoaderSettings, dist: DistInfo):
    """``(train, val)`` :class:`DeviceLoader` s over two readers, each in its own orders
    (``Reader.train_order`` / ``val_order``) with ``loaders.transforms``' transforms, the
    training crops augmented by the ``--auto-augment`` policy (``loaders.auto_augment``).
    Raises :class:`~loaders.DataError` for an empty training order."""
    sizes = (settings.train_crop_size, settings.val_resize_size, settings.val_crop_size)
    augment = make_auto_augment(settings.auto_augment, settings.interpolation,
                                settings.ra_magnitude, settings.augmix_severity)
    return tuple(DeviceLoader(reader, order, split_transform(is_train, *sizes, augment,
                                                             settings.interpolation),
                              **loader_options(settings, dist, train=is_train))
                 for is_train, reader, order in (
                     (True, train, train.train_order(settings, dist)),
                     (False, val, val.val_order(settings, dist))))


def loader_options(settings: LoaderSettings, dist: DistInfo, train: bool) -> dict:
    """:class:`DeviceLoader`'s keyword arguments for one split (train: crop
    ``train_crop_size``, slots for ``train_max_crop_size``, ``train_batches``; validation:
    ``val_crop_size``, ``val_batches``)."""
    return dict(train=train, batch_size=settings.batch_size, workers=settings.workers,
                device=dist.device,
                crop_size=settings.train_crop_size if train else settings.val_crop_size,
                channels_last=settings.channels_last,
                max_batches=settings.train_batches if train else settings.val_batches,
                seed=settings.seed, rank=dist.rank, max_bad_share=settings.max_bad_share,
                dtype=settings.dtype,
                max_crop_size=settings.train_max_crop_size if train else None,
                max_pixels=settings.max_image_pixels)
