"""What every reader and pipeline of ``loaders/`` is built from: :class:`LoaderSettings` (what
``main.py`` resolves once per training process; never the argparse namespace), :class:`DistInfo`
(this process's place in the job) and :func:`input_dtype` (the dtype of the delivered images).

Every loader yields ``(images, labels)`` on ``DistInfo.device``: images ``settings.dtype``
``(N, 3, H, W)`` normalised with the ImageNet mean/std (``loaders.transforms.normalize``),
labels int64 ``(N,)``; it has an exact ``len()``, ``set_epoch(epoch, start_batch=0)`` (its
order and its augmentation a function of (seed, epoch, rank, batch)), ``classes``,
``resolution`` / ``set_resolution(px)`` and ``close()``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from decode.acceptance import MAX_PIXELS

__all__ = ["DistInfo", "LoaderSettings", "input_dtype"]


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
    # torchvision's recipe flags (loaders.transforms.auto_augment; loaders.orders): the crops'
    # --auto-augment policy (None: none) with --ra-magnitude and --augmix-severity, every
    # resize's and geometric op's --interpolation, and --ra-sampler with --ra-reps.
    auto_augment: str | None = None
    ra_magnitude: int = 9
    augmix_severity: int = 3
    interpolation: str = "bilinear"
    ra_sampler: bool = False
    ra_reps: int = 3
    # --decode-device: "cpu" (the workers decode), "cuda" or "cpu-nvimgcodec"
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

    def crop_size(self, train: bool) -> int:
        """The side (px) of one split's images: ``train_crop_size`` or ``val_crop_size``."""
        return self.train_crop_size if train else self.val_crop_size

    def max_crop_size(self, train: bool) -> int:
        """The largest side (px) one split's images take in this run (progressive resizing:
        ``train_max_crop_size``); what batch memory is sized for."""
        return max(self.train_crop_size, self.train_max_crop_size) if train else self.val_crop_size

    def max_batches(self, train: bool) -> int | None:
        """One split's batch cap per epoch (``--train-batches``/``--val-batches``; None: all)."""
        return self.train_batches if train else self.val_batches


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


def input_dtype(amp: bool, amp_dtype: str, device: torch.device) -> torch.dtype:
    """dtype of the normalised images a loader delivers: the autocast dtype (``float16`` or
    ``bfloat16``, ``--amp-dtype``) under ``--amp`` on CUDA, where the model's first convolution
    would cast them to it anyway (half the bytes to write and read), else float32 (CPU
    autocast keeps float32 inputs)."""
    if amp and device.type == "cuda":
        return {"float16": torch.float16, "bfloat16": torch.bfloat16}[amp_dtype]
    return torch.float32
