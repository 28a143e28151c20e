"""The DataLoader-workers pipeline (:class:`DeviceLoader`)."""
from __future__ import annotations

import itertools
import time
from typing import Iterator

import torch

from ...orders import Order
from ...readers import Reader
from ...settings import DistInfo, LoaderSettings
from ...timing import stages
from ...transforms import split_transform
from ...transforms.normalize import imagenet_mean_std, normalize
from ..batches import ReaderLoader
from ..closing import ClosingDataLoader
from .cuda_feed import CudaFeeder, page_lock
from .slots import SharedBatches, slots_for
from .step import SlotWriter, TimedSlotWriter


class DeviceLoader(ReaderLoader):
    """A :class:`ReaderLoader` whose workers crop each sample to uint8 into shared batch slots,
    normalised here on the device (4x less to copy); slots and workers kept from pass to pass."""

    def __init__(self, reader: Reader, order: Order, settings: LoaderSettings, dist: DistInfo,
                 train: bool):
        super().__init__(reader, order, settings, dist, train)
        self.transform = split_transform(settings, train)
        self.mean, self.std = imagenet_mean_std(self.device)
        timed = train and stages.enabled()
        self._writer = (TimedSlotWriter if timed else SlotWriter)(
            reader, self.transform, self.bad, settings.max_image_pixels)
        self.stage_log = stages.StageLog() if timed else None
        self.loader = self._dataloader(self._writer, settings.workers)
        self._made = [self.loader]  # every DataLoader a pass used: close() stops them
        # (DataLoader, slots or None) of the last finished pass; None while a pass is suspended.
        self._idle: tuple[ClosingDataLoader, SharedBatches | None] | None = (self.loader, None)
        self._feeder = None  # CudaFeeder, made at the first pass on CUDA
        self._locked = False  # whether the current slots are page-locked
        self.set_epoch(0)

    @property
    def resolution(self) -> int:
        """The side (px) of this loader's images: its transform's, the one place it is kept."""
        transform = self.transform
        return transform.size[0] if hasattr(transform, "size") else transform.crop_size

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (3, self.resolution, self.resolution)

    def set_resolution(self, size: int) -> None:
        """Training: ``size`` px from the next pass on (``ValueError`` as _check_resolution)."""
        self._check_resolution(size)
        # workers started from now on fork with it; running ones take it from the batches
        self.transform.size = (size, size)

    def close(self) -> None:
        """Stop every worker this loader started, let the slots go; safe more than once."""
        made, self._made = self._made, []
        for loader in made:
            loader.close()
        self.loader = self._fresh_dataloader()
        self._idle = (self.loader, None)

    def _fresh_dataloader(self) -> ClosingDataLoader:
        """A DataLoader like ``self.loader`` (its workers and start method), none started."""
        loader = self._dataloader(self._writer, self.loader.num_workers,
                                  self.loader.multiprocessing_context)
        self._made.append(loader)
        return loader

    def _take(self) -> tuple[ClosingDataLoader, SharedBatches]:
        """The last finished pass's DataLoader (with its workers, if kept) and slots, else new."""
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

    def _pass(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        loader, pool = self._take()
        self._writer.pool = pool  # workers start (fork, or pickle it) with these slots
        plan = self._plan(self.image_shape)
        batches = iter(loader)
        filled = self._filled(batches, pool)
        erase = self._eraser()
        try:
            if self.device.type == "cuda":
                if self._feeder is None:
                    self._feeder = CudaFeeder(self.device, self.dtype, self.channels_last,
                                              self.mean, self.std, self.stage_log)
                yield from self._feeder.batches(pool, filled, self._locked, plan.pass_id, erase)
            else:
                yield from self._normalized(pool, filled, plan.pass_id, erase)
        finally:
            # unkept workers are joined as the iterator goes; kept ones finish in-flight batches
            filled.close()
            del filled, batches
            if any(loader is made for made in self._made):  # not one close() already stopped
                self._idle = (loader, pool)

    def _normalized(self, pool: SharedBatches, filled, pass_id: int, erase):
        """CPU: each written slot normalised into new memory, erased, released."""
        for number, slot, count in filled:
            copy_started = time.perf_counter()
            images, labels = pool.batch(slot, count)
            # New memory: the slot is refilled by a later batch once released.
            images = normalize(images, self.mean, self.std, self.channels_last)
            if erase is not None:
                images = erase(images, number)
            labels = labels.clone()
            if self.stage_log is not None:
                self.stage_log.add_copy(time.perf_counter() - copy_started)
            pool.release(slot, number, pass_id)
            yield images, labels

    def _filled(self, batches, pool: SharedBatches) -> Iterator[tuple[int, int, int]]:
        """This pass's written ``(number, slot, count)``, logged; DataError past the bad share."""
        log = self.stage_log
        images, batch = pool.stage_images.numpy(), pool.stage_batches.numpy()
        for number, slot, count, found in itertools.islice(batches, len(self)):
            self._check_bad(found)
            if log is not None:
                log.add_slot(images[slot], batch[slot], count)
            yield number, slot, count


build_loaders = DeviceLoader.pair
