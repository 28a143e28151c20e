"""What a backend needs to build its loaders, resolved once per training process."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LoaderSettings:
    """Per-process loader settings, computed once by ``main.py`` from the command line and the
    process's place in the job; backends read nothing else (never the argparse namespace).

    Sizes are in pixels, ``batch_size`` in images per step **of this process** and ``workers``
    the DataLoader worker processes (or DALI threads) of this process, both already divided
    among a node's training processes. ``train_path``/``val_path`` are the split roots (None
    for ``synthetic``); ``lmdb``: they are LMDBs from ``folder2lmdb.py`` (the ``lmdb`` backend,
    or ``dali`` reading LMDBs); ``shards``: they are WebDataset shard splits from
    ``folder2shards.py`` (the ``shards`` backend, or ``dali`` reading local shards). ``dtype``: the images' dtype on the device (float32, or the
    autocast dtype on CUDA, see :func:`loaders._common.input_dtype`).
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
