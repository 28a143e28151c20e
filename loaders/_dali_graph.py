"""The DALI side of ``--dali`` (``loaders/dali.py``): the sources of encoded images and labels,
the decode/augment graph, and turning its outputs into torch tensors.

Sources: a JPEG folder through ``fn.readers.file`` (:func:`folder_source`), or an LMDB written
by ``folder2lmdb.py`` through ``fn.external_source`` (:func:`lmdb_source`); both read exactly
the indices they are given, in that order (the loader's epoch order).

Graph (:func:`augment`): with a GPU, decode (nvJPEG, or the CPU with ``--dali-cpu``), resize,
crop, flip and normalise in DALI; CPU-only, DALI decodes (a training JPEG's RandomResizedCrop
window only) and :func:`finish_on_cpu` resizes, flips and normalises with the other backends'
torch code, because DALI's CPU resize is the slow step there.

DALI is imported only inside functions, so this module imports without it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ._common import IMAGENET_MEAN, IMAGENET_STD, float_batch, imagenet_mean_std, normalize_each
from .transforms import RRC_RATIO, RRC_SCALE, resize, resize_center_crop

_MEAN_255, _STD_255 = imagenet_mean_std()


@dataclass(frozen=True)
class GraphOptions:
    """How the decode/augment graph is placed and shaped (sizes in pixels)."""

    train: bool
    crop_size: int
    resize_size: int  # validation shorter side; unused for training
    cuda: bool  # pipeline has a GPU (device_id set); False: CPU-only
    decode_on_cpu: bool  # --dali-cpu, or no CUDA
    hw_decoder_load: float
    dtype: torch.dtype  # of the delivered images (loaders._common.input_dtype)
    channels_last: bool


def augment(encoded, opts: GraphOptions):
    """DALI graph: encoded images -> list of outputs before the labels.

    With a GPU: ``[images]``, normalised ``(3, crop, crop)`` (HWC with channels-last), float16
    if ``opts.dtype`` is, else float32 (no bfloat16 in DALI: ``_to_torch`` converts). CPU-only:
    ``[crops, mirror]`` for training (uint8 HWC RandomResizedCrop windows of varied size, int32
    flip flags) or ``[images]`` for validation (whole uint8 HWC images), which
    :func:`finish_on_cpu` resizes, flips and normalises: DALI's CPU ``fn.resize`` is the slow
    stage there, its region-of-interest JPEG decoding fast (``benchmarks/profile_dali_cpu.py``).
    Grayscale and CMYK JPEGs come out as RGB (``output_type=RGB``), as PIL's ``convert("RGB")``.
    """
    from nvidia.dali import fn, types

    decode = {"device": "cpu" if opts.decode_on_cpu else "mixed", "output_type": types.RGB,
              "adjust_orientation": False}  # pixels as stored, as the other loaders
    if not opts.decode_on_cpu:
        decode["hw_decoder_load"] = opts.hw_decoder_load
    if opts.train:
        images = fn.decoders.image_random_crop(encoded, random_area=list(RRC_SCALE),
                                               random_aspect_ratio=list(RRC_RATIO),
                                               num_attempts=100, **decode)
        mirror = fn.random.coin_flip(probability=0.5)
    else:
        images = fn.decoders.image(encoded, **decode)
        mirror = 0
    if not opts.cuda:
        return [images, mirror] if opts.train else [images]
    if opts.decode_on_cpu:
        images = images.gpu()  # decode on the CPU, resize and normalise on the GPU (as DLE RN50)
    if opts.train:
        images = fn.resize(images, resize_x=opts.crop_size, resize_y=opts.crop_size)
    else:
        images = fn.resize(images, resize_shorter=opts.resize_size)
    return [fn.crop_mirror_normalize(
        images, crop=(opts.crop_size, opts.crop_size), mirror=mirror,
        dtype=types.FLOAT16 if opts.dtype == torch.float16 else types.FLOAT,
        output_layout="HWC" if opts.channels_last else "CHW",
        mean=[255 * m for m in IMAGENET_MEAN], std=[255 * s for s in IMAGENET_STD])]


def finish_on_cpu(outputs, opts: GraphOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU-only pipeline outputs (see :func:`augment`) -> normalised float32 ``(N, 3, crop,
    crop)`` images and int64 ``(N,)`` labels, with the other backends' torch resize
    (``loaders.transforms``) and normalisation (``loaders._common.normalize_each``)."""
    images, *rest, labels = outputs
    size = opts.crop_size
    flips = np.array(rest[0].as_tensor()).reshape(-1) if opts.train else None

    def crops():
        for i in range(len(images)):
            # A view of DALI's buffer, valid until the next run(); resizing copies it out.
            image = torch.from_numpy(np.asarray(images[i])).permute(2, 0, 1)
            if opts.train:
                out = resize(image, (size, size))
                yield out.flip(-1) if flips[i] else out
            else:
                yield resize_center_crop(image, opts.resize_size, size)

    # Each crop is normalised straight after its resize, while it is in cache.
    out = float_batch((len(images), 3, size, size), torch.device("cpu"), opts.channels_last)
    return (normalize_each(crops(), out, _MEAN_255, _STD_255),
            torch.from_numpy(np.array(labels.as_tensor())).reshape(-1).to(torch.int64))


class LMDBBatches:
    """Batched (and parallel-safe) ``fn.external_source`` callable over an LMDB's records.

    Called with DALI's ``BatchInfo``, returns ``([encoded uint8 (bytes,)], [label int32 ()])``
    for batch ``info.iteration`` of ``order``, ``StopIteration`` after the last (possibly
    partial: nothing is padded). Pickles without an open LMDB; each worker opens its own.
    """

    def __init__(self, dataset, order: Sequence[int], batch_size: int):
        self.dataset, self.order, self.batch_size = dataset, list(order), batch_size

    def __call__(self, info):
        start = info.iteration * self.batch_size
        indices = self.order[start:start + self.batch_size]
        if not indices:
            raise StopIteration
        records = [self.dataset.read(i) for i in indices]
        return ([np.frombuffer(data, dtype=np.uint8) for data, _ in records],
                [np.array(label, dtype=np.int32) for _, label in records])


def folder_source(samples: Sequence[tuple[str, int]], order: Sequence[int], parallel: bool):
    """``fn.readers.file`` over exactly ``order`` (indices into ImageFolder's ``samples``).

    ``pad_last_batch`` repeats the last file to fill the final batch (:class:`DALILoader` trims
    it). ``parallel`` is unused: the reader's C++ threads read the files. Files are read, not
    mapped (``dont_use_mmap``): +2.5% images/s CPU-only, ahead in 4 of 4 interleaved rounds on
    the 2-core machine (likely the TLB shootdowns of unmapping each ~110 KB file; not verified).
    """
    from nvidia.dali import fn

    return fn.readers.file(files=[samples[i][0] for i in order],
                           labels=[samples[i][1] for i in order],
                           random_shuffle=False, pad_last_batch=True, dont_use_mmap=True,
                           name="Reader")


def lmdb_source(dataset, batch_size: int, order: Sequence[int], parallel: bool):
    """``fn.external_source`` of :class:`LMDBBatches`; ``parallel``: in DALI worker processes."""
    from nvidia.dali import fn, types

    extra = {"prefetch_queue_depth": 2} if parallel else {}
    return fn.external_source(source=LMDBBatches(dataset, order, batch_size), num_outputs=2,
                              batch=True, batch_info=True, parallel=parallel,
                              dtype=[types.UINT8, types.INT32], **extra)


def gpu_to_torch(tensor_list, device: torch.device) -> torch.Tensor:
    """Copy a dense DALI ``TensorListGPU`` into a new torch tensor on ``device``, queued on
    torch's current stream (so the host does not wait, and torch's next kernels do)."""
    from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

    tensor = tensor_list.as_tensor()
    out = torch.empty(tensor.shape(), dtype=to_torch_type[tensor.dtype], device=device)
    feed_ndarray(tensor, out, cuda_stream=torch.cuda.current_stream(device))
    return out
