"""Pipelines: how a reader's encoded samples become normalised device batches, each with
``build_loaders(train_reader, val_reader, settings, dist) -> (train, val)`` (``synthetic``:
``build_loaders(settings, dist)``) and, if it needs a library, ``require(dist)``: ``workers/``
(DataLoader workers decode and crop), ``gpu_decode`` (workers read, this process decodes each
batch with nvImageCodec), ``dali/`` (NVIDIA DALI) and ``synthetic`` (``--dummy``)."""

# name -> module, imported only when chosen: one's heavy dependency never slows the others
PIPELINES = {
    "workers": "loaders.pipelines.workers",
    "gpu_decode": "loaders.pipelines.gpu_decode",
    "dali": "loaders.pipelines.dali",
    "synthetic": "loaders.pipelines.synthetic",
}
