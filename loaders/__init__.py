"""The data-loading runtime: one module per backend, and the pieces they share.

``build_loaders(settings, dist) -> (train, val)`` builds the loaders of ``settings.backend``
(:class:`LoaderSettings`, resolved once per training process). Each loader yields ``(images,
labels)`` on ``dist.device`` (images ``settings.dtype`` NCHW normalised with the ImageNet
mean/std, labels int64), has an exact ``len()``, ``set_epoch(epoch)``, ``classes`` and
``close()`` (stops the worker processes or pipelines it keeps between passes).

- Backends (:data:`BACKENDS`; one new module plus one line adds one, imported only when chosen):
  ``folder`` (JPEG class folders), ``lmdb_records`` (``--lmdb``), ``shards`` (WebDataset tar
  shards, local or streamed), ``dali`` (NVIDIA DALI), ``synthetic`` (``--dummy``); and
  ``imagefolder_lmdb``, ``ImageFolderLMDB`` for users' own scripts.
- Public building blocks: ``decoders`` (whole-image JPEG/PNG/... decode), ``jpeg_window``
  (decoding a RandomResizedCrop window only), ``transforms`` (uint8 RandomResizedCrop + flip,
  resize + centre crop), ``orders`` and ``stream_orders`` (epoch orders: ``order(epoch) ->
  indices``), ``shard_streams`` (where a split's shards are: folders, URLs, ``pipe:``).
- Private runtime: ``_settings`` (LoaderSettings), ``_common`` (DeviceLoader, normalisation),
  ``_shared_batches`` (shared-memory batch slots), ``_cuda_feed`` (page-locked slots, side
  stream), ``_bad_samples`` (replacing and remembering undecodable samples), ``_lean_sampler``,
  ``_dali_graph``, ``_throughput``, ``_malloc``, ``_errors``.

What is written to disk and read back (the LMDB and shard layouts, image checks) is
``formats/``'s.
"""
from __future__ import annotations

import importlib

from ._common import DataError, DistInfo, input_dtype, split_paths
from ._errors import AcceleratorError
from ._settings import LoaderSettings
from ._throughput import measure as measure_throughput

# backend name (the --loader choice) -> module implementing build_loaders
BACKENDS = {
    "dali": "loaders.dali",
    "folder": "loaders.folder",
    "lmdb": "loaders.lmdb_records",
    "shards": "loaders.shards",
    "synthetic": "loaders.synthetic",
}

__all__ = ["AcceleratorError", "BACKENDS", "DataError", "DistInfo", "LoaderSettings",
           "build_loaders", "input_dtype", "measure_throughput", "split_paths"]


def build_loaders(settings: LoaderSettings, dist: DistInfo):
    """``(train, val)`` loaders of ``settings.backend`` (a key of :data:`BACKENDS`).

    Raises ``KeyError`` for an unknown backend and :class:`DataError` for bad data input.
    """
    module = importlib.import_module(BACKENDS[settings.backend])
    return module.build_loaders(settings, dist)

