"""The loader contract: what every reader and pipeline of ``loaders/`` takes and raises, in one
public module.

* :class:`LoaderSettings`: what ``main.py`` resolves once per training process, the only thing
  readers and pipelines read (never the argparse namespace);
* :class:`DistInfo`: this process's place in the job (global rank, world size, device);
* errors: :class:`DataError` (bad data input, one line for the user; defined in
  ``formats.errors`` and raised there too) and :class:`AcceleratorError` (the GPU failed);
* :func:`check_rank`, :func:`epoch_seed`, :func:`check_same_classes`, :func:`split_paths`,
  :func:`input_dtype`: the checks and derivations every loader shares.

Every loader yields ``(images, labels)`` on ``DistInfo.device``: images ``settings.dtype``
``(N, 3, H, W)`` normalised with the ImageNet mean/std (``loaders.normalize``), labels int64
``(N,)``; it has an exact ``len()``, ``set_epoch(epoch, start_batch=0)`` (its order and its
augmentation a function of (seed, epoch, rank, batch)), ``classes``, ``resolution`` /
``set_resolution(px)`` and ``close()``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Sequence

import torch

from decode.acceptance import MAX_PIXELS
from formats.errors import DataError

__all__ = ["AcceleratorError", "DataError", "DistInfo", "LoaderSettings", "check_rank",
           "check_same_classes", "epoch_seed", "input_dtype", "split_paths"]


class AcceleratorError(Exception):
    """The GPU or its driver failed (CUDA out of memory, a CUDA error inside a DALI pipeline):
    not a data problem, so nothing is retried or skipped; a one-line message for the user."""


@dataclass(frozen=True)
class LoaderSettings:
    """Per-process loader settings, computed once by ``main.py`` from the command line and the
    process's place in the job; readers and pipelines read nothing else (never the argparse
    namespace).

    ``backend`` is the ``--loader`` choice (``loaders.BACKENDS``), which names a
    (:attr:`source`, :attr:`pipeline`) pair. Sizes are in pixels, ``batch_size`` in images per
    step **of this process** and ``workers`` the DataLoader worker processes (or DALI threads)
    of this process, both already divided among a node's training processes.
    ``train_path``/``val_path`` are the split roots (None for ``synthetic``); ``lmdb``: they
    are LMDBs from ``folder2lmdb.py`` (the ``lmdb`` backend, or ``dali`` reading LMDBs);
    ``shards``: they are WebDataset shard splits from ``folder2shards.py`` (the ``shards``
    backend, or ``dali`` reading local shards). ``dtype``: the images' dtype on the device
    (float32, or the autocast dtype on CUDA, see :func:`input_dtype`).
    """

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
    # Largest training crop side the run will ask for (progressive resizing, --max-res): batch
    # slots are sized for it once. 0: train_crop_size.
    train_max_crop_size: int = 0
    # torchvision's recipe flags (loaders.auto_augment; loaders.orders): the training crops'
    # --auto-augment policy (None: none) with --ra-magnitude and --augmix-severity, every
    # resize's and geometric op's --interpolation, and --ra-sampler with --ra-reps.
    auto_augment: str | None = None
    ra_magnitude: int = 9
    augmix_severity: int = 3
    interpolation: str = "bilinear"
    ra_sampler: bool = False
    ra_reps: int = 3
    # --decode-device: "cpu" (the workers decode, today's path), "cuda" or "cpu-nvimgcodec"
    # (the workers read and draw windows, this process decodes each batch: gpu_decode), and
    # --hw-decoder-load (the hardware JPEG decoder's share; None: decode.gpu's default).
    decode_device: str = "cpu"
    hw_decoder_load: float | None = None
    # --allow-cpu-decode: --decode-device cuda starts even where no GPU decoder decodes (every
    # window then on the CPU fallback); without it such a run refuses to start in one line.
    allow_cpu_decode: bool = False
    # Streamed shards (HTTP, pipe:): a failed open or read is tried --shard-retries more times,
    # the first after --shard-retry-delay seconds, doubled each time (formats.shards.Retries).
    shard_retries: int = 2
    shard_retry_delay: float = 10.0
    # --max-image-pixels: an image whose header claims more pixels is refused before it is
    # decoded, as the converters refuse it (decode.acceptance; 0: no limit).
    max_image_pixels: int = MAX_PIXELS

    @property
    def pipeline(self) -> str:
        """How bytes become device batches: ``"workers"`` (DataLoader workers, shared slots,
        side-stream feed), ``"gpu_decode"`` (``decode_device`` other than ``"cpu"``: workers
        read, this process decodes batches), ``"dali"`` or ``"synthetic"`` (a key of
        ``loaders.PIPELINES``)."""
        if self.backend in ("dali", "synthetic"):
            return self.backend
        return "workers" if self.decode_device == "cpu" else "gpu_decode"

    @property
    def source(self) -> str | None:
        """Where the samples are read from: ``"folder"``, ``"lmdb"`` or ``"shards"`` (a key of
        ``loaders.READERS``; DALI reads LMDBs with ``lmdb``, shards with ``shards``); None for
        synthetic data."""
        if self.backend == "synthetic":
            return None
        if self.backend != "dali":
            return self.backend
        return "lmdb" if self.lmdb else "shards" if self.shards else "folder"


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


def check_rank(rank: int, world_size: int) -> None:
    """Raise ``ValueError`` unless ``0 <= rank < world_size`` (and ``world_size >= 1``)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside 0..{world_size - 1}")


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """One 63-bit seed from (seed, epoch, rank): the DataLoader workers' base seed and DALI's
    pipeline seed (neither draws an augmentation: those are drawn per batch)."""
    return (seed * 1_000_003 + epoch * 10_007 + rank) % (2**63)


def input_dtype(amp: bool, amp_dtype: str, device: torch.device) -> torch.dtype:
    """dtype of the normalised images a loader delivers: the autocast dtype (``float16`` or
    ``bfloat16``, ``--amp-dtype``) under ``--amp`` on CUDA, where the model's first convolution
    would cast them to it anyway (half the bytes to write and read), else float32 (CPU
    autocast keeps float32 inputs)."""
    if amp and device.type == "cuda":
        return {"float16": torch.float16, "bfloat16": torch.bfloat16}[amp_dtype]
    return torch.float32


def split_paths(data: str | None, train: str | None = None,
                val: str | None = None) -> tuple[str, str]:
    """The train and val roots: ``train``/``val`` (``--train``/``--val``) if given, else
    ``data/train`` and ``data/val`` (``DIR``).

    Raises :class:`DataError` if a root is unknown or does not exist (URLs, ``pipe:`` commands
    and brace patterns of the shard reader are checked by it, not here).
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
