"""The data-loading runtime: *readers* (``loaders.readers``) and *pipelines* (their bytes to
device batches, ``loaders.pipelines``). A new format: ``formats/X``, a reader, a line in READERS."""
from __future__ import annotations

import importlib
import os

from .errors import AcceleratorError, DataError
from .orders.positions import TRACE_ENV
from .pipelines import PIPELINES
from .readers import READERS, check_same_classes, open_reader, split_paths
from .settings import DistInfo, Loader, LoaderSettings, input_dtype
from .timing.throughput import measure as measure_throughput, tree_cpu_seconds

# The --loader choices: each names a (source, pipeline) pair (LoaderSettings.source/.pipeline);
# dali reads the source --lmdb or --loader shards names, folders otherwise.
BACKENDS = ("dali", "folder", "lmdb", "shards", "synthetic")


def build_loaders(settings: LoaderSettings, dist: DistInfo) -> tuple[Loader, Loader]:
    """``(train, val)`` of ``PIPELINES[settings.pipeline]`` over ``READERS[settings.source]``;
    sets PIL's bomb limit. Raises ``KeyError`` (a backend), :class:`DataError` (bad data)."""
    from decode.acceptance import limit_pil

    from .transforms.erasing import RandomErasing

    limit_pil(settings.max_image_pixels)
    pipeline = importlib.import_module(PIPELINES[settings.pipeline])
    if hasattr(pipeline, "require"):
        pipeline.require(dist)
    if settings.source is None:
        train_loader, val_loader = pipeline.build_loaders(settings, dist)
    else:
        train, val = (open_reader(settings.source, path, settings)
                      for path in (settings.train_path, settings.val_path))
        check_same_classes(train.classes, val.classes)
        train_loader, val_loader = pipeline.build_loaders(train, val, settings, dist)
        trace = os.environ.get(TRACE_ENV)  # tests: what each rank trained
        train_loader.trace = f"{trace}.rank{dist.rank}" if trace else None
    train_loader.erasing = (RandomErasing(settings.random_erase, settings.seed, dist.rank)
                            if settings.random_erase > 0 else None)
    return train_loader, val_loader


def close_all(*loaders) -> None:
    """Close ``loaders``, then the LMDB handles; re-raises the first error after all closed."""
    from formats.lmdb import close_all_readonly

    failures = []
    for loader in loaders:
        try:
            loader.close()
        except Exception as exc:  # noqa: BLE001 - the others are closed first
            failures.append(exc)
    close_all_readonly()
    if failures:
        raise failures[0]


def decoders_line(settings: LoaderSettings, device) -> str:
    """The decoders a run with ``settings`` uses on ``device``, for its first lines: the batch
    decoder of ``--decode-device cuda``/``cpu-nvimgcodec`` and its backend, else the workers'."""
    import decode

    if settings.pipeline != "gpu_decode":
        return decode.status_line()
    import torch

    from decode.gpu import probe_cuda, status_line
    if settings.decode_device == "cuda" and torch.device(device).type == "cuda":
        # the decoder the loaders will take (probed once per process), not merely one installed
        line = probe_cuda(device, settings.hw_decoder_load).line(settings.hw_decoder_load)
    else:
        line = status_line(settings.decode_device, device, settings.hw_decoder_load)
    return f"{line}; CPU fallback {decode.status_line()}"
