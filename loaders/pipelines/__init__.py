"""Pipelines: how a reader's encoded samples become normalised device batches. Each module has
``build_loaders(train_reader, val_reader, settings, dist) -> (train, val)`` over any
:class:`~loaders.readers.Reader` (``synthetic``: ``build_loaders(settings, dist)``, no reader); one
that needs a library checks it in ``require(dist)`` before any split is opened. ``workers/``
(DataLoader workers decode and crop), ``gpu_decode/`` (workers read, this process decodes each
batch with nvImageCodec: ``--decode-device``), ``dali/`` (NVIDIA DALI decodes and crops) and
``synthetic`` (``--dummy``); they share ``batches``, ``bad_samples`` and ``closing``."""

# name -> module, imported only when chosen: one's heavy dependency never slows the others
PIPELINES = {
    "workers": "loaders.pipelines.workers",
    "gpu_decode": "loaders.pipelines.gpu_decode",
    "dali": "loaders.pipelines.dali",
    "synthetic": "loaders.pipelines.synthetic",
}
