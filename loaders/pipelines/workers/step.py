"""A DataLoader worker's whole job, one step per sample: read the record, check its header
(:func:`decode.acceptance.check`, whose frame the transform takes), transform it and write it
into the batch slot (:class:`SlotWriter`). :class:`TimedSlotWriter` times each stage into the
slot's stage rows (``loaders.timing.stages``); the untimed step reads no clock."""
from __future__ import annotations

import time

import torch

from decode.acceptance import check

from ...errors import DataError
from ...readers import Reader
from ...timing import stages
from ...transforms import TrainTransform
from ..bad_samples import BadSamples
from ..batches import NumberedBatch, SampleBatches


class SlotWriter(SampleBatches):
    """:class:`SampleBatches` writing ``transform(bytes, frame)`` of each sample (uint8 ``(3, H,
    W)``) and the labels into the slots of :attr:`pool` (a ``SharedBatches``, set before the
    workers start: they fork or unpickle with it), a batch giving ``(number, slot, count,
    found)``, ``found`` the samples newly found unreadable. A new image shape in a batch's plan
    goes to the slots and a training transform's ``size``. Raises :class:`DataError` for an image
    not uint8 of the slots' shape."""

    def __init__(self, reader: Reader, transform, bad: BadSamples, max_pixels: int):
        super().__init__(reader, bad, max_pixels)
        self.transform, self.pool = transform, None

    def sample(self, index: int) -> tuple[torch.Tensor, int]:
        """Sample ``index`` read, checked and transformed: ``(image, label)``."""
        data, label = self.reader.read(index)
        return self.transform(data, check(data, self.max_pixels)), label

    def __getitems__(self, batch: NumberedBatch) -> tuple[int, int, int, int]:
        if self.pool is None:
            raise RuntimeError("SlotWriter.pool must be set before iterating")
        shape = batch.plan.image_shape
        if shape is not None and tuple(shape) != self.pool.image_shape:
            self.pool.set_shape(shape)
            if isinstance(self.transform, TrainTransform):
                self.transform.size = tuple(shape[1:])
        return super().__getitems__(batch)

    def _batch(self, batch: NumberedBatch) -> tuple[int, int, int, int]:
        slot = self.pool.acquire(batch.number, batch.plan.pass_id)
        images, labels = self.pool.images[slot], self.pool.labels[slot]
        found = 0
        for i, index in enumerate(batch):
            found += self._put(images, labels, i, index)
        return batch.number, slot, len(batch), found

    def _put(self, images: torch.Tensor, labels: torch.Tensor, i: int, index: int) -> int:
        """Sample ``index`` (or its replacement) into row ``i``; the samples newly found bad."""
        (image, label), found = self[index]
        if image.shape != images.shape[1:] or image.dtype != torch.uint8:
            raise DataError(f"sample {index}: transform gave {image.dtype} "
                            f"{tuple(image.shape)}, expected uint8 {tuple(images.shape[1:])}")
        images[i].copy_(image)
        labels[i] = label
        return found


class TimedSlotWriter(SlotWriter):
    """:class:`SlotWriter` of a training transform writing each image's stages (read, header
    check and window, decode, resize, flip + policy, slot copy) and each batch's wall and CPU
    time into the slot's stage rows beside the pixels."""

    def __init__(self, reader: Reader, transform: TrainTransform, bad: BadSamples,
                 max_pixels: int):
        super().__init__(reader, transform, bad, max_pixels)
        self.clock = stages.StageClock()

    def sample(self, index: int) -> tuple[torch.Tensor, int]:
        t = self.clock.t
        start = time.perf_counter()
        data, label = self.reader.read(index)
        read = time.perf_counter()
        frame = check(data, self.max_pixels)
        t[stages.WINDOW] += time.perf_counter() - read  # a header parse, as the window's
        t[stages.READ] += read - start
        t[stages.BYTES] = len(data)
        image = stages.timed_transform(self.transform, data, frame, t)
        self.clock.sampled = time.perf_counter()  # the slot copy's start
        return image, label

    def _batch(self, batch: NumberedBatch) -> tuple[int, int, int, int]:
        pool, clock = self.pool, self.clock
        clock.begin_batch()
        slot = pool.acquire(batch.number, batch.plan.pass_id)
        slot_wait = time.perf_counter() - clock.started
        rows = pool.stage_images[slot].numpy()
        images, labels = pool.images[slot], pool.labels[slot]
        found = 0
        for i, index in enumerate(batch):
            clock.begin_image()
            found += self._put(images, labels, i, index)
            clock.end_image(rows, i)
        clock.end_batch(pool.stage_batches[slot].numpy(), slot_wait)
        return batch.number, slot, len(batch), found
