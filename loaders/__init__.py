"""Data loaders, one module per backend.

``build_loaders(settings, dist) -> (train, val)`` builds the loaders of ``settings.backend``
(:class:`LoaderSettings`, resolved once per training process). Each loader yields ``(images,
labels)`` on ``dist.device`` (images ``settings.dtype`` NCHW normalised with the ImageNet
mean/std, labels int64), has an exact ``len()``, ``set_epoch(epoch)`` and ``classes``.
Adding a backend is one new module plus one line in :data:`BACKENDS`. Modules are imported
only when chosen, so a heavy dependency of one backend never slows or breaks the others.
"""
from __future__ import annotations

import importlib

from ._common import DataError, DistInfo, input_dtype, split_paths
from .decoders import crop_decoder_status, decoder_name
from ._errors import AcceleratorError
from ._malloc import retain_freed_memory
from ._settings import LoaderSettings
from ._throughput import measure as measure_throughput
from .transforms import image_library

# backend name (the --loader choice) -> module implementing build_loaders
BACKENDS = {
    "dali": "loaders.dali",
    "folder": "loaders.folder",
    "lmdb": "loaders.lmdb_records",
    "shards": "loaders.shards",
    "synthetic": "loaders.synthetic",
}

__all__ = ["AcceleratorError", "BACKENDS", "DataError", "DistInfo", "LoaderSettings",
           "build_loaders", "crop_decoder_status", "decoder_name", "image_library", "input_dtype",
           "measure_throughput", "retain_freed_memory", "split_paths"]


def build_loaders(settings: LoaderSettings, dist: DistInfo):
    """``(train, val)`` loaders of ``settings.backend`` (a key of :data:`BACKENDS`).

    Raises ``KeyError`` for an unknown backend and :class:`DataError` for bad data input.
    """
    module = importlib.import_module(BACKENDS[settings.backend])
    return module.build_loaders(settings, dist)

