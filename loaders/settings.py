"""What every reader and pipeline is built from, and what every loader is (:class:`Loader`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Protocol, runtime_checkable

import torch

from decode.acceptance import MAX_PIXELS


@dataclass(frozen=True)
class LoaderSettings:
    """Per-process loader settings from ``main.py``: ``backend`` (``--loader``) names a
    (:attr:`source`, :attr:`pipeline`) pair; sizes in pixels; ``batch_size`` and ``workers``
    (or DALI threads) this process's; ``dtype`` the images' on the device."""

    backend: str
    train_path: str | None
    val_path: str | None
    batch_size: int
    workers: int
    seed: int
    lmdb: bool
    train_crop_size: int
    val_resize_size: int
    val_crop_size: int
    train_batches: int | None
    val_batches: int | None
    max_bad_share: float
    channels_last: bool
    dtype: torch.dtype
    lmdb_order: str
    lmdb_block_size: int
    lmdb_buffer_blocks: int
    lmdb_readahead: str
    dali_cpu: bool
    dali_hw_decoder_load: float | None
    shards: bool = False
    # Largest training crop side (px) of the run (--max-res): batch slots' size. 0: train_crop_size
    train_max_crop_size: int = 0
    # torchvision's recipe flags (--auto-augment None: none)
    auto_augment: str | None = None
    ra_magnitude: int = 9
    augmix_severity: int = 3
    interpolation: str = "bilinear"
    ra_sampler: bool = False
    ra_reps: int = 3
    # --random-erase: the share of training images erased on the device batch (0: none)
    random_erase: float = 0.0
    # --decode-device: "cpu" (the workers decode), or "cuda"/"cpu-nvimgcodec" (gpu_decode)
    decode_device: str = "cpu"
    hw_decoder_load: float | None = None
    # --allow-cpu-decode: --decode-device cuda runs on the CPU fallback where no GPU decoder works
    allow_cpu_decode: bool = False
    # Streamed shards: a failed open or read is tried again (formats.shards.Retries)
    shard_retries: int = 2
    shard_retry_delay: float = 10.0
    # --max-image-pixels: refused from the header before decoding, as the converters do (0: none)
    max_image_pixels: int = MAX_PIXELS

    @property
    def pipeline(self) -> str:
        """A ``loaders.PIPELINES`` key."""
        if self.backend in ("dali", "synthetic"):
            return self.backend
        return "workers" if self.decode_device == "cpu" else "gpu_decode"

    @property
    def source(self) -> str | None:
        """A ``loaders.READERS`` key, or None for synthetic data."""
        if self.backend == "synthetic":
            return None
        if self.backend != "dali":
            return self.backend
        return "lmdb" if self.lmdb else "shards" if self.shards else "folder"

    def crop_size(self, train: bool) -> int:
        """The side (px) of one split's images."""
        return self.train_crop_size if train else self.val_crop_size

    def max_crop_size(self, train: bool) -> int:
        """The largest side (px) of a split's images this run: what batch memory is sized for."""
        return max(self.train_crop_size, self.train_max_crop_size) if train else self.val_crop_size

    def max_batches(self, train: bool) -> int | None:
        """One split's batch cap per epoch (None: all)."""
        return self.train_batches if train else self.val_batches


@dataclass
class DistInfo:
    """Where this process sits in the job: the global ``rank``, ``device`` for the batches;
    ``distributed``: it joined a process group (DDP), even at world size 1."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    distributed: bool = False

    @property
    def is_main(self) -> bool:
        """Global rank 0: the process that prints and writes files."""
        return self.rank == 0


def input_dtype(amp: bool, amp_dtype: str, device: torch.device) -> torch.dtype:
    """The dtype of a loader's images: the autocast dtype (``--amp-dtype``) under ``--amp`` on
    CUDA, which the first convolution would cast to anyway; else float32 (as CPU autocast)."""
    if amp and device.type == "cuda":
        return {"float16": torch.float16, "bfloat16": torch.bfloat16}[amp_dtype]
    return torch.float32


@runtime_checkable
class Loader(Protocol):
    """Every loader (``tests/loaders/test_contract.py``): images ``settings.dtype`` ``(N, 3, H,
    W)`` normalised, int64 labels ``(N,)``, on ``DistInfo.device``; an exact ``len()`` after
    :meth:`set_epoch`; :meth:`close` stops all it started (safe more than once)."""

    classes: list[str]
    batch_size: int

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...

    def __len__(self) -> int: ...

    def set_epoch(self, epoch: int, start_batch: int = 0, rest=None) -> None:
        """``epoch`` from batch ``start_batch``; ``rest``: a resumed epoch dealt anew."""

    @property
    def resolution(self) -> int: ...  # the side (px) of the images yielded

    def set_resolution(self, size: int) -> None:
        """Training: images of ``size`` px from the next pass on (progressive resizing)."""

    def close(self) -> None: ...

    def stage_summary(self) -> dict | None: ...

    def reset_stages(self) -> None: ...
