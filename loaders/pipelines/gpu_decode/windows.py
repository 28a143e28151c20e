"""The DataLoader workers' part of the batch-decode pipeline (:class:`WindowBatches`): each
sample's bytes read and its window drawn, a batch's packed as tensors, with the stage figures
travelling with the batch as the pixels do."""
from __future__ import annotations

import time

import numpy as np
import torch
from torch.utils.data import Dataset

from decode import decode, image_size
from decode.acceptance import MAX_PIXELS, check

from ...readers import Reader
from ...timing import stages
from ...transforms import TrainTransform, center_crop_plan
from ..bad_samples import BadSamples, fetch_readable
from ..batches import NumberedBatch, seeded

# Columns of a batch's ``stages`` rows: read and window seconds, the record's bytes.
READ, WINDOW, BYTES = range(3)


class WindowBatches(Dataset):
    """``reader``'s samples for the batch decoder. Item ``i``: ``((bytes, window, flip, i,
    frame), label)``, training's RandomResizedCrop window as the CPU loaders draw it (``frame``
    None), or validation's central crop region and frame (``val_sizes`` = ``(resize, crop)``);
    sizes from the header checked by the acceptance rule (``max_pixels``), else a whole decode
    (which raises for non-images). A :class:`~loaders.pipelines.batches.NumberedBatch` -> a dict:
    ``data`` uint8 (the encoded bytes end to end), ``offsets`` int64 ``(N + 1,)``, ``windows``
    int64 ``(N, 4)`` (top, left, height, width), ``flips`` bool ``(N,)``, ``labels``/``indices``
    int64 ``(N,)``, ``frames`` int64 ``(N, 6)`` (-1 for training), ints ``number`` and
    ``found``; with a ``clock`` (a ``StageClock``) also ``stages`` float64 ``(N, 3)``
    (:data:`READ`, :data:`WINDOW`, :data:`BYTES`) and ``stage_batch`` float64
    ``(stages.BATCH_COLUMNS,)``. Draws follow the batch's seed; damaged samples are replaced as
    ``bad`` has it (:func:`fetch_readable`)."""

    def __init__(self, reader: Reader, val_sizes: tuple[int, int] | None, bad: BadSamples,
                 clock=None, max_pixels: int = MAX_PIXELS):
        self.reader, self.val_sizes, self.bad, self.clock = reader, val_sizes, bad, clock
        self.max_pixels = max_pixels
        self.draw = TrainTransform()

    def __len__(self) -> int:
        return len(self.reader)

    def window(self, index: int):
        """Sample ``index``'s item (see the class); the clock gets the read's and window's
        seconds (added over a replaced sample's tries) and the record's bytes."""
        clock = self.clock
        started = time.perf_counter() if clock is not None else 0.0
        data, label = self.reader.read(index)
        if clock is not None:
            read = time.perf_counter()
            clock.t[stages.READ] += read - started
            clock.t[stages.BYTES] = len(data)
        frame = check(data, self.max_pixels)
        if self.val_sizes is None:
            window, flip, _ = self.draw.window(data, lambda d: image_size(d, frame), frame)
        else:
            size = image_size(data, frame)
            if size is None:  # no header parser reads it: the whole decode raises, or sizes it
                size = tuple(decode(data).shape[-2:])
            window, frame = center_crop_plan(*size, *self.val_sizes)
            return (data, window, False, index, frame), label
        if clock is not None:
            clock.t[stages.WINDOW] += time.perf_counter() - read
        return (data, window, flip, index, None), label

    def __getitem__(self, index: int):
        return fetch_readable(self.window, index, self.bad)

    def __getitems__(self, batch: NumberedBatch) -> dict:
        return seeded(batch, self._read)

    def _read(self, batch: NumberedBatch) -> dict:
        clock = self.clock
        if clock is not None:
            clock.begin_batch()
            rows = np.zeros((len(batch), 3))
        datas, windows, flips, labels, indices, frames, found = [], [], [], [], [], [], 0
        for i, index in enumerate(batch):
            if clock is not None:
                clock.begin_image()
            ((data, window, flip, used, frame), label), new_bad = self[index]
            if clock is not None:
                rows[i] = clock.t[stages.READ], clock.t[stages.WINDOW], clock.t[stages.BYTES]
            frames.append(frame or (-1,) * 6)
            datas.append(data)
            windows.append(window)
            flips.append(flip)
            labels.append(label)
            indices.append(used)
            found += new_bad
        sizes = np.fromiter((len(d) for d in datas), dtype=np.int64, count=len(datas))
        joined = torch.empty(int(sizes.sum()), dtype=torch.uint8)
        joined.numpy()[:] = np.frombuffer(b"".join(datas), dtype=np.uint8)
        offsets = torch.zeros(len(datas) + 1, dtype=torch.int64)
        offsets[1:] = torch.from_numpy(np.cumsum(sizes))
        out = dict(data=joined, offsets=offsets, number=batch.number, found=found,
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
