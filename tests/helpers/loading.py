"""Building loaders with small explicit settings and reading their batches back."""
from __future__ import annotations

import os

import torch


def loader_settings(backend: str = "folder", data: str | None = None, **overrides):
    """A :class:`loaders.LoaderSettings` with small explicit test values: ``backend``, the
    splits ``data/train`` and ``data/val`` (or ``train_path``/``val_path``), batch 4, no
    workers, seed 0, 32-px crops (val resize 32), every batch, float32 NCHW, random LMDB
    order (blocks of 256, 8 open), readahead auto (the CLI defaults); ``lmdb`` is True for the lmdb backend.
    ``overrides`` replace any field."""
    from loaders import LoaderSettings

    fields = dict(
        backend=backend, train_path=os.path.join(data, "train") if data else None,
        val_path=os.path.join(data, "val") if data else None, batch_size=4, workers=0,
        seed=0, lmdb=backend == "lmdb", train_crop_size=32, val_resize_size=32,
        val_crop_size=32, train_batches=None, val_batches=None, max_bad_share=0.01,
        channels_last=False, dtype=torch.float32, lmdb_order="random", lmdb_block_size=256,
        lmdb_buffer_blocks=8, lmdb_readahead="auto", dali_cpu=False, dali_hw_decoder_load=None)
    fields.update(overrides)
    return LoaderSettings(**fields)


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest absolute difference of two uint8 tensors of one shape (no widening copy)."""
    return int((torch.maximum(a, b) - torch.minimum(a, b)).max())


def to_uint8(images: torch.Tensor):
    """Normalised float ``(N, 3, H, W)`` batch -> the uint8 pixels it came from (numpy)."""
    from loaders.transforms.normalize import imagenet_mean_std

    mean, std = imagenet_mean_std()
    return (images * std + mean).round().clamp(0, 255).to(torch.uint8).numpy()


def check_set_epoch_reproducible(build_train) -> list:
    """Loaders from ``build_train()`` give the same batches (order and augmentation) for the
    same ``set_epoch`` and others for another epoch. Returns the first epoch's batches."""
    def epoch_batches(epoch):
        train = build_train()
        train.set_epoch(epoch)
        return list(train)

    first, again, other = epoch_batches(3), epoch_batches(3), epoch_batches(4)
    assert len(first) == len(again) == len(other)
    for (a_img, a_lab), (b_img, b_lab) in zip(first, again):
        assert torch.equal(a_lab, b_lab) and torch.equal(a_img, b_img)
    assert not all(torch.equal(a, b) for (_, a), (_, b) in zip(first, other))
    return first


def batches_and_stages(settings, count: int) -> tuple[list, dict | None]:
    """The first ``count`` training batches of epoch 1 of the loaders ``settings`` build (one
    process), cloned, and the training loader's ``stage_summary()`` after them (None when the
    stages are not measured); both loaders closed."""
    import loaders

    train, val = loaders.build_loaders(settings, loaders.DistInfo())
    try:
        train.set_epoch(1)
        out = [(images.clone(), labels.clone()) for _, (images, labels) in zip(range(count), train)]
        return out, train.stage_summary()
    finally:
        train.close()
        val.close()
