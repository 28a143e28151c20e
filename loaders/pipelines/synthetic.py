"""``--dummy``: random batches made once on the device in ImageNet-1k's sizes (pytorch/examples'
``FakeData``), nothing decoded or copied per step: the model's ceiling."""
from __future__ import annotations

from contextlib import contextmanager

import torch

from ..errors import DataError
from ..orders import RandomOrder, ShardOrder
from ..orders.positions import PositionedLoader
from ..settings import DistInfo, LoaderSettings
from ..timing.stages import StagedLoader
from ..transforms.normalize import imagenet_mean_std, normalize

TRAIN_IMAGES = 1_281_167  # ImageNet-1k train split
VAL_IMAGES = 50_000
NUM_CLASSES = 1000


class SyntheticLoader(StagedLoader, PositionedLoader):
    """A real loader's batch count over ``num_samples`` images, each the same normalised noise."""

    def __init__(self, num_samples: int, settings: LoaderSettings, dist: DistInfo, train: bool):
        self.batch_size = batch_size = settings.batch_size
        self.classes = [f"class{i:04d}" for i in range(NUM_CLASSES)]
        # The batch count of a real loader over an epoch of this size (same order lengths).
        self.position_order = (RandomOrder if train else ShardOrder)(num_samples, dist.rank,
                                                                    dist.world_size)
        self.max_batches, self.rank = settings.max_batches(train), dist.rank
        self.train, self.seed, self.device = train, settings.seed + dist.rank, dist.device
        self.channels_last, self.dtype = settings.channels_last, settings.dtype
        gen = torch.Generator().manual_seed(self.seed)
        size = settings.crop_size(train)
        with _allocating(batch_size, size, dist.device):
            self.labels = torch.randint(0, NUM_CLASSES, (batch_size,),
                                        generator=gen).to(dist.device)
        self._batches: dict[int, torch.Tensor] = {}  # side (px) -> images, made once per side
        self.images = self._batch(size)

    @property
    def resolution(self) -> int:
        return self.images.shape[-1]

    def set_resolution(self, size: int) -> None:
        """Training: images of ``size`` px from now on. Raises ``ValueError`` for validation."""
        if not self.train:
            raise ValueError("set_resolution: validation sizes are fixed (--val-crop-size)")
        self.images = self._batch(size)

    def _batch(self, size: int) -> torch.Tensor:
        """The batch of side ``size``, made once."""
        if size not in self._batches:
            gen = torch.Generator().manual_seed(self.seed * 7919 + size)
            with _allocating(self.batch_size, size, self.device):
                pixels = torch.randint(0, 256, (self.batch_size, 3, size, size), generator=gen,
                                       dtype=torch.uint8)
                self._batches[size] = normalize(pixels, *imagenet_mean_std(),
                                                self.channels_last).to(self.device, self.dtype)
        return self._batches[size]

    def close(self) -> None:
        """No workers to stop."""

    def __iter__(self):
        erase = self._eraser()  # erased in place: a copy, else the erasures add up
        return self._delivered((self.images if erase is None else erase(self.images.clone(), n),
                                self.labels) for n in range(len(self)))


@contextmanager
def _allocating(batch_size: int, size: int, device: torch.device):
    """Turn running out of memory while making a batch into one :class:`DataError` line."""
    try:
        yield
    except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError included
        if "memory" not in str(exc) and not isinstance(exc, MemoryError):
            raise
        gib = batch_size * 3 * size * size * 4 / (1 << 30)
        raise DataError(f"--dummy: cannot allocate one batch of {batch_size} images of {size} px "
                        f"on {device} (about {gib:.1f} GiB as float32); lower -b/--batch-size") \
            from None


def build_loaders(settings: LoaderSettings, dist: DistInfo):
    """``(train, val)`` synthetic loaders with the sizes of ImageNet-1k."""
    return (SyntheticLoader(TRAIN_IMAGES, settings, dist, train=True),
            SyntheticLoader(VAL_IMAGES, settings, dist, train=False))
