"""The DataLoader-workers pipeline (``--loader folder|lmdb|shards``, ``--decode-device cpu``):
``loader`` (:class:`DeviceLoader`), ``slots`` (the shared-memory batch slots the workers write
into) and ``cuda_feed`` (page-locked slots and the side-stream copy to a GPU)."""
from __future__ import annotations

from .loader import DeviceLoader, build_loaders

__all__ = ["DeviceLoader", "build_loaders"]
