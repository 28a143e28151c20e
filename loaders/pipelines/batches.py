"""What the pipelines share: batches numbered per pass, seeded by (seed, epoch, rank, batch)
whichever worker draws them (:class:`NumberedBatchSampler`), and :class:`ReaderLoader`, a
loader's decoding-free part."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from ..draws import seed_sequence
from ..orders import Order, train_batch_size
from ..orders.positions import PositionedLoader, RestOfEpoch
from ..readers import Reader
from ..settings import DistInfo, LoaderSettings
from ..timing.stages import StagedLoader
from .bad_samples import BadSamples, check_share, fetch_readable
from .closing import ClosingDataLoader

PREFETCH_FACTOR = 4  # DataLoader's batches in flight per worker


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """One 63-bit seed of (seed, epoch, rank): the workers' base seed, DALI's pipeline seed."""
    return (seed * 1_000_003 + epoch * 10_007 + rank) % (2**63)


def batch_seed(seed: int, epoch: int, rank: int, batch: int) -> int:
    """Training batch ``batch``'s torch seed: 64 bits of ``SeedSequence`` of the four."""
    return int(seed_sequence(seed, epoch, rank, batch).generate_state(1, np.uint64)[0])


@dataclass(frozen=True)
class PassPlan:
    """What every batch of one pass carries to the workers."""

    pass_id: int = 0  # the loader's pass number: slot release tickets, ShardReader.follow
    image_shape: tuple[int, int, int] | None = None  # the slots' (3, H, W); None: as made
    seed_key: tuple[int, int, int, int] | None = None  # seed, epoch, rank, first batch (or None)
    limit: int | None = None  # batches at most (None: all)
    reading: tuple | None = None  # streamed shards' pass, for ShardReader.follow

    def seed(self, number: int) -> int | None:
        """:func:`batch_seed` of batch ``number`` of this pass, or None."""
        if self.seed_key is None:
            return None
        seed, epoch, rank, first = self.seed_key
        return batch_seed(seed, epoch, rank, first + number)


class NumberedBatch(list):
    """Dataset indices that know their ``number`` in the pass (from 0) and the pass's ``plan``."""

    def __init__(self, indices: Sequence[int], number: int, plan: PassPlan = PassPlan()):
        super().__init__(indices)
        self.number, self.plan = number, plan


class NumberedBatchSampler(Sampler[NumberedBatch]):
    """``order.order(epoch)`` from index ``start`` on, or ``rest`` when set (an epoch dealt anew),
    in :class:`NumberedBatch` es of ``batch_size`` (the last shorter unless ``drop_last``), at
    most ``plan.limit``; ``plan`` is taken as a pass starts."""

    def __init__(self, order: Order, batch_size: int, drop_last: bool):
        self.order, self.batch_size, self.drop_last = order, batch_size, drop_last
        self.epoch = self.start = 0
        self.rest: list[int] | None = None
        self.plan = PassPlan()

    def indices(self) -> Iterator[int]:
        """The pass's dataset indices, in order."""
        if self.rest is not None:
            return iter(self.rest)
        return itertools.islice(iter(self.order.order(self.epoch)), self.start, None)

    def __iter__(self) -> Iterator[NumberedBatch]:
        return self._batches(self.plan)  # the plan as the pass starts

    def _batches(self, plan: PassPlan) -> Iterator[NumberedBatch]:
        indices = self.indices()
        for number in itertools.count() if plan.limit is None else range(plan.limit):
            batch = list(itertools.islice(indices, self.batch_size))
            if not batch or (self.drop_last and len(batch) < self.batch_size):
                return
            yield NumberedBatch(batch, number, plan)

    def __len__(self) -> int:
        n = len(self.rest) if self.rest is not None else max(0, len(self.order) - self.start)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


class SampleBatches(Dataset):
    """:class:`NumberedBatch` es of ``reader``'s samples (:meth:`_batch`, damaged ones replaced)
    under their seed, torch's generator put back after (``-j 0``: the training process's)."""

    def __init__(self, reader: Reader, bad: BadSamples, max_pixels: int):
        self.reader, self.bad, self.max_pixels = reader, bad, max_pixels

    def __getitem__(self, index: int):
        """``(sample(j), found)``: ``j`` is ``index`` or its replacement (fetch_readable)."""
        return fetch_readable(self.sample, index, self.bad)

    def __getitems__(self, batch: NumberedBatch):
        if batch.plan.reading is not None:  # a kept worker learns each pass's reading plan
            self.reader.follow(batch.plan.reading)
        seed = batch.plan.seed(batch.number)
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.default_generator.manual_seed(seed)
            return self._batch(batch)


def keep_as_is(batch):
    """``collate_fn`` for a dataset whose ``__getitems__`` already made the batch."""
    return batch


def hand_over(tensors: tuple, done: torch.cuda.Event | None, device: torch.device) -> tuple:
    """``tensors`` made on a side stream up to event ``done``, usable on ``device``'s current
    stream (waited for, ``record_stream``); CPU tensors (``done`` None) as they are."""
    if done is not None:
        main = torch.cuda.current_stream(device)
        main.wait_event(done)
        for tensor in tensors:
            tensor.record_stream(main)
    return tensors


class ReaderLoader(StagedLoader, PositionedLoader):
    """One split of ``reader`` in ``order``, read by a subclass's DataLoader (``self.loader``) of
    :class:`NumberedBatch` es or its own threads (``forks = False``): the order, passes, damaged
    samples. Raises :class:`DataError` for an empty training order."""

    forks = True  # its workers are processes: the damaged-sample flags go to shared memory

    def __init__(self, reader: Reader, order: Order, settings: LoaderSettings, dist: DistInfo,
                 train: bool):
        batch_size = train_batch_size(order, settings.batch_size) if train else settings.batch_size
        self.reader, self.train, self.batch_size = reader, train, batch_size
        self.sampler = NumberedBatchSampler(order, batch_size, drop_last=train)
        self.position_order = order
        self.classes = list(reader.classes)
        self.device, self.rank = dist.device, dist.rank
        self.dtype, self.channels_last = settings.dtype, settings.channels_last
        self.seed, self.max_bad_share = settings.seed, settings.max_bad_share
        self.max_batches = settings.max_batches(train)
        self.max_crop_size = settings.max_crop_size(train)
        self.workers_configured = settings.workers  # -j, for stage_summary
        self._reading, self._pass_numbers = None, itertools.count()  # shards. plan, passes
        # Flags made before any worker starts, kept for the loader's lifetime.
        self.bad = BadSamples(len(reader), reader.name_of,
                              shared=self.forks and settings.workers > 0)
        self.unreadable = self.bad.unreadable
        # The workers' base seed; augmentations are seeded per batch (PassPlan).
        self._generator = torch.Generator().manual_seed(epoch_seed(self.seed, 0, self.rank))

    @classmethod
    def pair(cls, train: Reader, val: Reader, settings: LoaderSettings, dist: DistInfo, *args):
        """``(train, val)`` loaders of this class (``args`` after ``train``) in their orders."""
        return (cls(train, train.train_order(settings, dist), settings, dist, True, *args),
                cls(val, val.val_order(settings, dist), settings, dist, False, *args))

    def _dataloader(self, dataset, workers: int, context=None) -> ClosingDataLoader:
        """A DataLoader of ``workers`` processes over ``dataset``'s numbered batches."""
        return ClosingDataLoader(
            dataset, batch_sampler=self.sampler, collate_fn=keep_as_is, num_workers=workers,
            generator=self._generator, prefetch_factor=PREFETCH_FACTOR if workers > 0 else None,
            multiprocessing_context=context,
            persistent_workers=workers > 0)

    def set_epoch(self, epoch: int, start_batch: int = 0,
                  rest: RestOfEpoch | None = None) -> None:
        super().set_epoch(epoch, start_batch, rest)
        self.sampler.epoch, self.sampler.start = epoch, start_batch * self.batch_size
        self.sampler.rest = self.rest_indices
        if not self.reader.random_access:
            # A pass dealt anew reads local shards at random (streams refuse it: engine.position)
            resumed = start_batch and self.sampler.rest is None
            self._reading = self.reader.plan_pass(self.sampler.order, epoch,
                                                  list(self.sampler.indices()) if resumed else None)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self._delivered(self._pass())  # a subclass's pass, traced where asked

    def pass_indices(self) -> list[int]:
        """The next pass's dataset indices, in order (before unreadable ones are replaced)."""
        return list(itertools.islice(self.sampler.indices(), len(self) * self.batch_size))

    def _plan(self, image_shape=None) -> PassPlan:
        """The next pass's :class:`PassPlan`, handed to the batch sampler."""
        seed_key = (self.seed, self.epoch, self.rank, self.start_batch) if self.train else None
        pass_id = next(self._pass_numbers)
        reading = self._reading and (pass_id, *self._reading)
        plan = PassPlan(pass_id, image_shape, seed_key, len(self), reading)
        self.sampler.plan = plan  # taken by the pass that starts now
        return plan

    def _check_resolution(self, size: int) -> None:
        """Raise ``ValueError`` unless a training loader can yield ``size`` px."""
        if not self.train:
            raise ValueError("set_resolution: validation sizes are fixed (--val-crop-size)")
        if not 0 < size <= self.max_crop_size:
            raise ValueError(f"set_resolution({size}): at most {self.max_crop_size} px")

    def _check_bad(self, found: int = 1) -> None:
        """After ``found`` (default: some) newly unreadable samples: :func:`check_share`."""
        if found:
            check_share(self.unreadable, self.max_bad_share, len(self.reader))
