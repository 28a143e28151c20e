"""Pieces every backend shares: the rank/device context, paths, normalisation, and the
device-side loader (epoch orders are in ``loaders/orders.py``).

Backends decode and crop to uint8 on the CPU; DataLoader workers write each sample straight
into a reused shared-memory batch slot (``loaders/_shared_batches.py``), and
:class:`DeviceLoader` copies each batch to the training device and normalises it there (as
timm's PrefetchLoader and NVIDIA's DeepLearningExamples ConvNets do): a uint8 batch is 4x
smaller to pass between processes, pin and copy than a float one.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Dataset

from ._cuda_feed import CudaFeeder, normalize_into, page_lock
from ._errors import DataError
from ._bad_samples import TolerantDataset, too_many_unreadable
from .orders import Order, ResumableSampler, batches_per_epoch, check_one_batch
from ._settings import LoaderSettings
from ._shared_batches import (NumberedBatchSampler, PassPlan, SharedBatches, SlotWriter,
                              keep_as_is, slots_for)

# ImageNet channel statistics on the [0, 1] scale, as in pytorch/examples imagenet/main.py.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def imagenet_mean_std(device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """:data:`IMAGENET_MEAN` and :data:`IMAGENET_STD` on the 0-255 scale of uint8 pixels, as
    float32 ``(1, 3, 1, 1)`` tensors on ``device`` (the ``mean``/``std`` of :func:`normalize`)."""
    return tuple(torch.tensor(v, device=device).view(1, 3, 1, 1) * 255
                 for v in (IMAGENET_MEAN, IMAGENET_STD))


def input_dtype(amp: bool, amp_dtype: str, device: torch.device) -> torch.dtype:
    """dtype of the normalised images a loader delivers: the autocast dtype (``float16`` or
    ``bfloat16``, ``--amp-dtype``) under ``--amp`` on CUDA, where the model's first convolution
    would cast them to it anyway (half the bytes to write and read), else float32 (CPU
    autocast keeps float32 inputs)."""
    if amp and device.type == "cuda":
        return {"float16": torch.float16, "bfloat16": torch.bfloat16}[amp_dtype]
    return torch.float32


@dataclass
class DistInfo:
    """Where this process sits in the job.

    ``rank`` is the global rank (0..world_size-1), used for sharding: never the local rank, so
    that several nodes never read the same shard. ``device`` is where batches are delivered.
    ``distributed``: this process joined a process group (the model is wrapped in DDP), which
    a launched process does even at world size 1.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    distributed: bool = False

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the process that prints and writes files."""
        return self.rank == 0


def split_paths(data: str | None, train: str | None = None,
                val: str | None = None) -> tuple[str, str]:
    """The train and val roots: ``train``/``val`` (``--train``/``--val``) if given, else
    ``data/train`` and ``data/val`` (``DIR``).

    Raises :class:`DataError` if a root is unknown or does not exist (URLs, ``pipe:`` commands
    and brace patterns of the shard backend are checked by it, not here).
    """
    paths = []
    for split, given in (("train", train), ("val", val)):
        path = given or (os.path.join(data, split) if data else None)
        if path is None:
            raise DataError(f"no {split} data: give DIR (holding train/ and val/) or --{split} PATH")
        remote = "://" in path or path.startswith("pipe:") or "{" in path
        if not remote and not os.path.exists(path):
            raise DataError(f"{path}: no such file or directory")
        paths.append(path)
    return paths[0], paths[1]


def check_same_classes(train_classes: Sequence[str], val_classes: Sequence[str]) -> None:
    """Raise :class:`DataError` unless train and val list the same classes in the same order."""
    if list(train_classes) != list(val_classes):
        only_train = sorted(set(train_classes) - set(val_classes))[:3]
        only_val = sorted(set(val_classes) - set(train_classes))[:3]
        raise DataError(
            f"train and val have different classes ({len(train_classes)} vs {len(val_classes)}; "
            f"only in train: {only_train}, only in val: {only_val})")


class DeviceLoader:
    """Loads ``dataset`` (items: uint8 ``(3, crop_size, crop_size)`` image, int label) in the
    indices of ``order`` (an :class:`~loaders.orders.Order`: training
    :class:`~loaders.orders.RandomOrder` or :class:`~loaders.orders.BlockOrder`, validation
    :class:`~loaders.orders.ShardOrder`) with a DataLoader of ``workers`` processes, and yields
    ``(images, labels)`` ready for the model, ``batch_size`` per batch (training: whole
    batches only; validation: the last one may be partial).

    Yields ``images``: float32 ``(N, 3, H, W)`` on ``device`` (on CUDA: ``dtype``, e.g. the
    autocast dtype, see :func:`input_dtype`), normalised with
    :data:`IMAGENET_MEAN`/:data:`IMAGENET_STD` (channels-last memory format if
    ``channels_last``), and ``labels``: int64 ``(N,)`` on ``device``. ``len()`` is exact:
    :func:`~loaders.orders.batches_per_epoch` of the order, capped at ``max_batches``, less the
    batches skipped by ``set_epoch(epoch, start_batch)``. ``classes`` lists the class names
    (index = label). ``sampler`` is the :class:`~loaders.orders.ResumableSampler` over ``order``.

    Workers write uint8 batches into shared slots (``image_shape`` ``(3, H, W)``), which are
    reused from epoch to epoch; a training loader's workers are started once and kept from pass
    to pass (``persistent_workers``; :meth:`close` stops them), validation's per pass. On the
    CPU each batch is normalised out of its slot before it is yielded; on CUDA the slots are
    page-locked and each batch is copied to the GPU and normalised there on a side stream one
    batch ahead (:class:`~loaders._cuda_feed.CudaFeeder`). The random crops of training batch
    ``k`` of an epoch are drawn from :func:`~loaders._shared_batches.batch_seed` ``(seed,
    epoch, rank, k)``, whichever worker draws them and however many there are, and a resumed
    epoch (``set_epoch(epoch, start_batch)``) draws those of the uninterrupted run.
    A sample that fails to decode is replaced by the next readable one, named once on stderr
    and remembered for the loader's lifetime (``unreadable``, an
    :class:`~loaders._bad_samples.UnreadableSet` shared by the workers of every pass), so later
    epochs and passes never draw it again (:class:`~loaders._bad_samples.TolerantDataset`);
    when the distinct unreadable samples exceed ``max_bad_share`` of ``len(dataset)`` (the
    split), iterating raises :class:`DataError`. Raises
    :class:`DataError` at construction if a training ``order`` holds less than one batch.
    """

    # Workers outlive a pass: forking and starting them costs about 0.1 s per epoch on 2 cores
    # (docs/performance.md). ShardLoader turns it off: its workers fork with each epoch's plan.
    keeps_workers = True

    def __init__(self, dataset: Dataset, order: Order, *, train: bool, classes: Sequence[str],
                 batch_size: int, workers: int, device: torch.device, crop_size: int,
                 channels_last: bool, max_batches: int | None, seed: int, rank: int,
                 max_bad_share: float, dtype: torch.dtype, max_crop_size: int | None = None):
        if train:
            check_one_batch(order, batch_size)
        self.dataset = dataset  # the backend's, items (uint8 (3, crop, crop) image, int label)
        self.sampler = ResumableSampler(order)
        self.train, self.batch_size = train, batch_size
        self.dtype = dtype
        self.image_shape = (3, crop_size, crop_size)
        self.max_crop_size = max(crop_size, max_crop_size or 0)
        self.max_bad_share = max_bad_share
        self.start_batch = 0
        self.epoch = 0
        self.device = device
        self.classes = list(classes)
        self.channels_last = channels_last
        self.max_batches = max_batches
        self.seed = seed
        self.rank = rank
        self.mean, self.std = imagenet_mean_std(device)
        # Held here: each pass hands it the slots before the workers start.
        tolerant = TolerantDataset(dataset, shared=workers > 0)
        # Flags made here, before any worker starts, and kept for the loader's lifetime.
        self.unreadable = tolerant.unreadable
        # Workers that outlive a pass learn a new resolution from the batches (set_resolution).
        self._writer = SlotWriter(tolerant, getattr(dataset, "transform", None) if train else None)
        # drop_last for training: no tiny last batch for BatchNorm.
        self._batches = NumberedBatchSampler(self.sampler, batch_size, drop_last=train)
        # The workers' base seed; the crops are seeded per batch (PassPlan).
        self._generator = torch.Generator().manual_seed(_mix_seed(seed, 0, rank))
        self.loader = self._dataloader(workers)
        # (DataLoader, slots or None) of the last finished pass; None while a pass is suspended.
        self._idle: tuple[DataLoader, SharedBatches | None] | None = (self.loader, None)
        self._feeder = None  # CudaFeeder, made at the first pass on CUDA
        self._locked = False  # whether the current slots are page-locked
        self.set_epoch(0)

    def _dataloader(self, workers: int, context=None) -> DataLoader:
        return DataLoader(
            self._writer, batch_sampler=self._batches, collate_fn=keep_as_is,
            num_workers=workers, generator=self._generator,
            prefetch_factor=4 if workers > 0 else None, multiprocessing_context=context,
            persistent_workers=self.train and workers > 0 and self.keeps_workers)

    def __len__(self) -> int:
        total = batches_per_epoch(len(self.sampler.order), self.batch_size, self.train,
                                  self.max_batches)
        return max(0, total - self.start_batch)

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Make this epoch's shuffle and augmentation a function of (seed, epoch, rank), and
        start it at batch ``start_batch`` (for a resumed epoch; the batches before it are the
        ones already trained on)."""
        self.sampler.set_epoch(epoch)
        self.sampler.start = start_batch * self.batch_size
        self.start_batch = start_batch
        self.epoch = epoch

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
        self.dataset.transform.size = (size, size)  # workers started from now on fork with it
        self.image_shape = (3, size, size)  # running ones take it from the batches

    def close(self) -> None:
        """Stop the workers kept between passes (joined; they would otherwise live as long as
        this loader). A later pass starts new ones."""
        pool = self._idle[1] if self._idle is not None else None
        self.loader = self._fresh_dataloader()
        self._idle = (self.loader, pool)

    def _fresh_dataloader(self) -> DataLoader:
        """A DataLoader like ``self.loader`` (its workers and start method), none started."""
        return self._dataloader(self.loader.num_workers, self.loader.multiprocessing_context)

    def _take(self) -> tuple[DataLoader, SharedBatches]:
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
        try:
            if self.device.type == "cuda":
                if self._feeder is None:
                    self._feeder = CudaFeeder(self.device, self.dtype, self.channels_last,
                                              self.mean, self.std)
                yield from self._feeder.batches(pool, filled, self._locked, plan.pass_id)
            else:
                for number, slot, count in filled:
                    images, labels = pool.batch(slot, count)
                    # New memory: the slot is refilled by a later batch once released.
                    images = normalize(images, self.mean, self.std, self.channels_last)
                    labels = labels.clone()
                    pool.release(slot, number, plan.pass_id)
                    yield images, labels
        finally:
            # Workers of this pass that are not kept are shut down (joined) as the iterator
            # goes; kept ones finish the batches in flight before the next pass starts.
            filled.close()
            del filled, batches
            self._idle = (loader, pool)

    def _filled(self, batches) -> Iterator[tuple[int, int, int]]:
        """``(number, slot, count)`` of this pass's written slots, ``len(self)`` of them;
        raises :class:`DataError` once the distinct unreadable samples of the split exceed
        ``max_bad_share`` of its size (counted only after a batch that found a new one)."""
        total = len(self)
        size = len(self.dataset)
        allowed = self.max_bad_share * size
        for step, (number, slot, count, found) in enumerate(batches):
            if step == total:
                return
            if found:
                bad = self.unreadable.count()
                if bad > allowed:
                    raise too_many_unreadable(bad, self.max_bad_share, size)
            yield number, slot, count


def normalize(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
              channels_last: bool = False) -> torch.Tensor:
    """uint8 ``(N, 3, H, W)`` -> new float32 ``(N, 3, H, W)`` ``(images - mean) / std`` on the
    images' device, NCHW or channels-last memory format. ``mean``/``std``: float32
    ``(1, 3, 1, 1)`` on the 0-255 scale."""
    if images.device.type != "cpu":
        return normalize_into(images, 1 / std, -mean / std, torch.float32, channels_last)
    return normalize_each(images, float_batch(images.shape, images.device, channels_last),
                          mean, std)


def float_batch(shape, device: torch.device, channels_last: bool = False) -> torch.Tensor:
    """An uninitialised float32 ``(N, 3, H, W)`` batch, NCHW or channels-last."""
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    return torch.empty(shape, dtype=torch.float32, device=device, memory_format=memory_format)


def normalize_each(images: Iterable[torch.Tensor], out: torch.Tensor, mean: torch.Tensor,
                   std: torch.Tensor) -> torch.Tensor:
    """CPU: write ``(image - mean) / std`` of each uint8 ``(3, H, W)`` image (any iterable, a
    generator included) into ``out[i]``, float32 ``(N, 3, H, W)``; returns ``out``.

    Computed as ``image * (1/std) - mean/std`` (within 2.4e-7 of the quotient), image by image
    so that its float copy (0.6 MB at 224 px) stays in cache for the multiply and the add,
    where passes over a whole float batch stream it through memory each time. A uint8 ->
    float32 ``copy_`` then in-place ``mul_``/``add_`` takes 2.0 ms for 64 images at 224 px on
    one core (AMD EPYC, torch 2.14), against 5.5 ms for one mixed-dtype ``addcmul`` (which
    PyTorch does not vectorise) and 2.9 ms for the same three ops over the whole batch: the
    main process normalises here while the loader workers decode on the same cores. Raises
    ``ValueError`` if the counts differ.
    """
    scale, shift = 1 / std[0], -mean[0] / std[0]
    images = iter(images)
    for count, target in enumerate(out):
        image = next(images, None)
        if image is None:
            raise ValueError(f"normalize_each: {count} images for a batch of {len(out)}")
        target.copy_(image).mul_(scale).add_(shift)
    if next(images, None) is not None:
        raise ValueError(f"normalize_each: more images than the batch of {len(out)}")
    return out


def _mix_seed(seed: int, epoch: int, rank: int) -> int:
    return (seed * 1_000_003 + epoch * 10_007 + rank) % (2**63)


def loader_options(settings: LoaderSettings, dist: DistInfo, train: bool) -> dict:
    """:class:`DeviceLoader`'s keyword arguments but ``classes`` for one split (train: crop
    ``train_crop_size``, slots for ``train_max_crop_size``, ``train_batches``; validation:
    ``val_crop_size``, ``val_batches``)."""
    return dict(train=train, batch_size=settings.batch_size, workers=settings.workers,
                device=dist.device,
                crop_size=settings.train_crop_size if train else settings.val_crop_size,
                channels_last=settings.channels_last,
                max_batches=settings.train_batches if train else settings.val_batches,
                seed=settings.seed, rank=dist.rank, max_bad_share=settings.max_bad_share,
                dtype=settings.dtype,
                max_crop_size=settings.train_max_crop_size if train else None)
