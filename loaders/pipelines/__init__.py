"""Pipelines: how a reader's encoded samples become normalised device batches. Each module has
``build_loaders(train_reader, val_reader, settings, dist) -> (train, val)`` and takes any
:class:`~loaders.readers.Reader` (``synthetic`` reads none: ``build_loaders(settings, dist)``);
one that needs a library checks it in ``require(dist)`` before any split is opened.

* ``workers/``: DataLoader worker processes decode and crop (``loaders.transforms``) into
  reused shared-memory batch slots; the training process copies each batch to the device and
  normalises it there, on a side stream one batch ahead on CUDA;
* ``gpu_decode/``: DataLoader workers read the bytes and draw the windows; the training process
  decodes each batch's windows with nvImageCodec (on the GPU, or its CPU backend), resizes,
  flips and normalises them (``--decode-device``);
* ``dali/``: NVIDIA DALI decodes (nvJPEG on a GPU, libjpeg-turbo on the CPU), crops and
  normalises;
* ``synthetic``: one random batch made once on the device (``--dummy``: the model's ceiling).

What they share: ``batches`` (numbered batches, their seeds, a DataLoader over a reader),
``bad_samples`` (unreadable samples replaced, reported once and remembered) and ``closing``
(stopping every DataLoader worker on every way out of a run).
"""

# pipeline name (LoaderSettings.pipeline) -> module, imported only when chosen (a heavy
# dependency of one never slows or breaks the others)
PIPELINES = {
    "workers": "loaders.pipelines.workers",
    "gpu_decode": "loaders.pipelines.gpu_decode",
    "dali": "loaders.pipelines.dali",
    "synthetic": "loaders.pipelines.synthetic",
}
