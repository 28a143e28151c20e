"""Pieces every backend shares: the rank/device context, samplers, and the device-side loader.

Backends decode and crop to uint8 on the CPU, collate uint8 batches, and :class:`DeviceLoader`
copies each batch to the training device and normalises it there (as timm's PrefetchLoader and
NVIDIA's DeepLearningExamples ConvNets do): a uint8 batch is 4x smaller to collate, pin and copy
than a float one.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ._errors import DataError
from ._lean_sampler import LeanDistributedSampler
from ._robust import SkipSampler, TolerantDataset, too_many_unreadable

# ImageNet channel statistics on the [0, 1] scale, as in pytorch/examples imagenet/main.py.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class DistInfo:
    """Where this process sits in the job.

    ``rank`` is the global rank (0..world_size-1), used for sharding: never the local rank, so
    that several nodes never read the same shard. ``device`` is where batches are delivered.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the process that prints and writes files."""
        return self.rank == 0


def split_paths(args) -> tuple[str, str]:
    """The train and val roots: ``--train``/``--val`` if given, else ``DIR/train`` and ``DIR/val``.

    Raises :class:`DataError` if a root is unknown or does not exist.
    """
    paths = []
    for split in ("train", "val"):
        path = getattr(args, split) or (os.path.join(args.data, split) if args.data else None)
        if path is None:
            raise DataError(f"no {split} data: give DIR (holding train/ and val/) or --{split} PATH")
        if not os.path.exists(path):
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


class ShardSampler(Sampler[int]):
    """Validation sampler: rank ``r`` of ``w`` reads indices ``r, r+w, r+2w, ...`` in order.

    Every sample is read exactly once across ranks and none is padded or repeated (unlike
    ``DistributedSampler``), so a metric summed over ranks equals the single-process one.
    """

    def __init__(self, num_samples: int, rank: int = 0, world_size: int = 1):
        self.indices = range(rank, num_samples, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)

    def set_epoch(self, epoch: int) -> None:
        """Validation order does not depend on the epoch."""


class DeviceLoader:
    """Wraps a DataLoader of uint8 batches and yields ``(images, labels)`` ready for the model.

    Yields ``images``: float32 ``(N, 3, H, W)`` on ``device``, normalised with
    :data:`IMAGENET_MEAN`/:data:`IMAGENET_STD` (channels-last memory format if
    ``channels_last``), and ``labels``: int64 ``(N,)`` on ``device``. ``len()`` is exact:
    the DataLoader's batch count, capped at ``max_batches``, less the batches skipped by
    ``set_epoch(epoch, start_batch)``. ``classes`` lists the class names (index = label).

    Batches from a :class:`~loaders._robust.TolerantDataset` carry a count of replaced
    (undecodable) samples; when an epoch's total exceeds ``max_bad_share`` of its images,
    iterating raises :class:`DataError`.
    """

    def __init__(self, loader: DataLoader, device: torch.device, classes: Sequence[str],
                 channels_last: bool = False, max_batches: int | None = None,
                 seed: int = 0, rank: int = 0, max_bad_share: float = 0.01):
        self.loader = loader
        self.max_bad_share = max_bad_share
        self.start_batch = 0
        self.device = device
        self.classes = list(classes)
        self.channels_last = channels_last
        self.max_batches = max_batches
        self.seed = seed
        self.rank = rank
        self.mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1) * 255
        self.set_epoch(0)

    def __len__(self) -> int:
        n = len(self.loader)  # what is left after start_batch
        return n if self.max_batches is None else max(0, min(n, self.max_batches - self.start_batch))

    @property
    def batch_size(self) -> int:
        """Images per batch on this rank."""
        return self.loader.batch_size

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Make this epoch's shuffle and augmentation a function of (seed, epoch, rank), and
        start it at batch ``start_batch`` (for a resumed epoch; the batches before it are the
        ones already trained on)."""
        sampler = self.loader.sampler
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        if start_batch and not isinstance(sampler, SkipSampler):
            raise ValueError("this loader cannot start an epoch part-way")
        if isinstance(sampler, SkipSampler):
            sampler.start = start_batch * self.loader.batch_size
        self.start_batch = start_batch
        if self.loader.generator is not None:
            # The DataLoader draws its workers' base seed from this generator at each __iter__.
            self.loader.generator.manual_seed(_mix_seed(self.seed, epoch, self.rank))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        total = len(self)
        allowed = self.max_bad_share * (self.start_batch + total) * self.loader.batch_size
        bad = 0
        for step, (images, labels, *replaced) in enumerate(self.loader):
            if step == total:
                break
            if replaced:
                bad += int(replaced[0].sum())
                if bad > allowed:
                    raise too_many_unreadable(bad, self.max_bad_share, "epoch")
            yield self.to_device(images, labels)

    def to_device(self, images: torch.Tensor, labels: torch.Tensor):
        """uint8 NCHW CPU batch -> normalised float32 NCHW device batch, int64 labels."""
        non_blocking = self.device.type == "cuda"
        images = images.to(self.device, non_blocking=non_blocking)
        labels = labels.to(self.device, dtype=torch.int64, non_blocking=non_blocking)
        memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        images = images.float().sub_(self.mean).div_(self.std).contiguous(memory_format=memory_format)
        return images, labels


def _mix_seed(seed: int, epoch: int, rank: int) -> int:
    return (seed * 1_000_003 + epoch * 10_007 + rank) % (2**63)


def make_loader(dataset: Dataset, args, dist: DistInfo, train: bool,
                classes: Sequence[str], sampler: Sampler | None = None) -> DeviceLoader:
    """Build the DataLoader over ``dataset`` for one split and wrap it in a :class:`DeviceLoader`.

    Training: ``DistributedSampler``-order shard of this global rank (memory-lean:
    :class:`~loaders._lean_sampler.LeanDistributedSampler`), shuffled from (seed, epoch),
    ``drop_last`` on the sampler (same count on every rank) and on the batches (no tiny last
    batch for BatchNorm), startable part-way (:class:`~loaders._robust.SkipSampler`).
    Validation: :class:`ShardSampler`, every sample exactly once. Undecodable samples are
    replaced (:class:`~loaders._robust.TolerantDataset`). ``sampler`` replaces the training
    default; it must shard by ``dist`` itself, give every rank the same ``len()`` and have
    ``set_epoch`` (e.g. :class:`loaders._order.BlockShuffleSampler`).
    Raises :class:`DataError` if the training shard holds less than one batch.
    """
    if train:
        sampler = SkipSampler(sampler or LeanDistributedSampler(
            dataset, num_replicas=dist.world_size, rank=dist.rank, shuffle=True,
            seed=args.seed, drop_last=True))
    else:
        sampler = ShardSampler(len(dataset), dist.rank, dist.world_size)
    if train and len(sampler) < args.batch_size:
        raise DataError(
            f"training set has {len(sampler)} images per process, fewer than one batch of "
            f"{args.batch_size}: lower -b/--batch-size")
    workers = args.workers
    loader = DataLoader(
        TolerantDataset(dataset), batch_size=args.batch_size, sampler=sampler, num_workers=workers,
        pin_memory=dist.device.type == "cuda", drop_last=train,
        generator=torch.Generator(), prefetch_factor=4 if workers > 0 else None,
    )
    max_batches = args.train_batches if train else args.val_batches
    return DeviceLoader(loader, dist.device, classes, channels_last=args.channels_last,
                        max_batches=max_batches, seed=args.seed, rank=dist.rank,
                        max_bad_share=getattr(args, "max_bad_share", 0.01))


def batches_per_epoch(num_samples: int, batch_size: int, world_size: int, train: bool) -> int:
    """Batches one rank sees per epoch: the count :func:`make_loader` produces."""
    if train:
        return (num_samples // world_size) // batch_size
    return math.ceil(math.ceil(num_samples / world_size) / batch_size)
