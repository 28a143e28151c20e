"""Data loaders, one module per backend.

Each backend module exposes ``build_loaders(args, dist) -> (train, val)``; each loader yields
``(images, labels)`` on ``dist.device`` (images float32 NCHW normalised with the ImageNet
mean/std, labels int64), has an exact ``len()``, ``set_epoch(epoch)`` and ``classes``.
Adding a backend is one new module plus one line in :data:`BACKENDS`. Modules are imported
only when chosen, so a heavy dependency of one backend never slows or breaks the others.
"""
from __future__ import annotations

import importlib

from ._common import DataError, DistInfo
from ._errors import AcceleratorError
from ._malloc import retain_freed_memory

# backend name (the --loader choice) -> module implementing build_loaders
BACKENDS = {
    "dali": "loaders.dali",
    "folder": "loaders.folder",
    "lmdb": "loaders.lmdb_records",
    "synthetic": "loaders.synthetic",
}

__all__ = ["AcceleratorError", "BACKENDS", "DataError", "DistInfo", "build_loaders", "retain_freed_memory"]


def build_loaders(backend: str, args, dist: DistInfo):
    """``(train, val)`` loaders of ``backend`` (a key of :data:`BACKENDS`).

    Raises ``KeyError`` for an unknown backend and :class:`DataError` for bad data input.
    """
    module = importlib.import_module(BACKENDS[backend])
    return module.build_loaders(args, dist)
