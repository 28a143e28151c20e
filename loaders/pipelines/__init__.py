"""Pipelines: a reader's samples to normalised device batches, each module with
``build_loaders(train_reader, val_reader, settings, dist) -> (train, val)`` (``synthetic``:
``build_loaders(settings, dist)``) and, if it needs a library, ``require(dist)``."""

# name -> module, imported only when chosen: one's heavy dependency never slows the others
PIPELINES = {
    "workers": "loaders.pipelines.workers.loader",
    "gpu_decode": "loaders.pipelines.gpu_decode",
    "dali": "loaders.pipelines.dali",
    "synthetic": "loaders.pipelines.synthetic",
}
