"""The DALI side of ``--dali``: the graph's source, the
decode/augment graph, and turning its outputs into torch tensors.

Source (:func:`source`): one batched ``fn.external_source`` fed by a
``feed.BatchFeed``, which the loader points at each pass's order, so a pipeline is built
once per run and reused every epoch (as in NVIDIA's DALI ResNet-50 example): each batch's
encoded images and labels and, for training, each sample's RandomResizedCrop window (drawn on
the host from (seed, epoch, rank, batch number)), flip and output size, so an epoch's
augmentation does not depend on what the pipeline ran before.

Graph (:func:`augment`): with a GPU, decode (nvJPEG and the hardware decoder, or the CPU with
``--dali-cpu``), resize, crop, flip and normalise in DALI; CPU-only, DALI decodes (a training
JPEG's RandomResizedCrop window only) and :func:`finish_on_cpu` resizes, flips and normalises
with the other pipelines' torch code, because DALI's CPU resize is the slow step there.

DALI is imported only inside functions, so this module imports without it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from decode import resize

from ...errors import DataError
from ...settings import DistInfo, LoaderSettings
from ...timing.batch_stages import no_clock
from ...transforms import resize_center_crop
from ...transforms.normalize import (IMAGENET_MEAN, IMAGENET_STD, float_batch, imagenet_mean_std,
                                     normalize_each)
from .augment import DaliAugment
from .environment import default_hw_decoder_load

_MEAN_255, _STD_255 = imagenet_mean_std()
_INTERP = {"nearest": "INTERP_NN", "bicubic": "INTERP_CUBIC"}  # --interpolation -> DALI's


# nvJPEG's buffers sized for the largest ImageNet JPEGs, as NVIDIA's DeepLearningExamples RN50
# (image_classification/dali.py) and DALI's ResNet-50 example set them "to avoid reallocations
# in runtime" (DALI 2.4's defaults: 16 MiB device / 8 MiB host padding, no hints). The paddings
# are per decoding thread (DALI's nvJPEG decoder keeps a device buffer and pinned host buffers
# per thread), and those examples run 4 threads: :func:`nvjpeg_memory` keeps their total,
# each of ``threads`` threads getting a share, so -j 16 does not pin 16 x 134 MiB of host memory
# and take 16 x 201 MiB of the GPU's (a larger image grows its thread's buffer once).
NVJPEG_PADDING = dict(device_memory_padding=211025920, host_memory_padding=140544512)
NVJPEG_HINTS = dict(preallocate_width_hint=5980, preallocate_height_hint=6430)
NVJPEG_EXAMPLE_THREADS = 4


def nvjpeg_memory(threads: int) -> dict:
    """``fn.decoders.*`` arguments for the mixed (nvJPEG) decode on ``threads`` CPU threads:
    the examples' paddings in bytes per thread for up to :data:`NVJPEG_EXAMPLE_THREADS`
    threads, their 4-thread total split evenly beyond, and the hardware decoder's size hints
    (pixels; one decoder, not per thread)."""
    share = NVJPEG_EXAMPLE_THREADS / max(NVJPEG_EXAMPLE_THREADS, threads)
    return {**{k: int(v * share) for k, v in NVJPEG_PADDING.items()}, **NVJPEG_HINTS}


def decode_args(opts: "GraphOptions") -> dict:
    """The decoder's arguments for ``opts``: RGB pixels as stored (no EXIF orientation, as the
    other loaders), on the CPU or mixed; mixed adds :func:`nvjpeg_memory` for
    ``opts.threads``, ``hw_decoder_load`` and ``jpeg_fancy_upsampling=True``: nvJPEG's default
    chroma upsampling differs from libjpeg-turbo's "fancy" one, which DALI's CPU backend, the
    CPU loaders and nvImageCodec (``decode.gpu``) use, so the same image would train on other
    pixels under ``--dali``."""
    from nvidia.dali import types

    args = {"device": "cpu" if opts.decode_on_cpu else "mixed", "output_type": types.RGB,
            "adjust_orientation": False}
    if not opts.decode_on_cpu:
        args.update(nvjpeg_memory(opts.threads), hw_decoder_load=opts.hw_decoder_load,
                    jpeg_fancy_upsampling=True)
    return args


@dataclass(frozen=True)
class GraphOptions:
    """How the decode/augment graph is placed and shaped (sizes in pixels)."""

    train: bool
    crop_size: int
    resize_size: int  # validation shorter side; unused for training
    cuda: bool  # pipeline has a GPU (device_id set); False: CPU-only
    decode_on_cpu: bool  # --dali-cpu, or no CUDA
    hw_decoder_load: float
    dtype: torch.dtype  # of the delivered images (loaders.settings.input_dtype)
    channels_last: bool
    augment: object = None  # training's --auto-augment: an augment.DaliAugment, or None
    interpolation: str = "bilinear"  # --interpolation of the resizes
    threads: int = 1  # the pipeline's CPU threads (-j): nvJPEG's buffers are per thread


def stored_shape(encoded):
    """Each image's ``(H, W, C)`` as stored, float64, from its header: the shape the decoder
    (``adjust_orientation=False``) decodes. ``fn.peek_image_shape`` applies EXIF orientation by
    default: an EXIF-rotated JPEG's window was drawn for the turned shape and left the stored
    image, and DALI stopped on it, or crashed the process."""
    from nvidia.dali import fn, types

    return fn.cast(fn.peek_image_shape(encoded, adjust_orientation=False), dtype=types.FLOAT64)


def inside(anchor, shape, size):
    """``(anchor, shape)`` (float32 ``(x, y)``, ``(w, h)`` nodes) clamped into the image of
    ``size`` (:func:`stored_shape`): the same window for every window drawn from the size the
    host read from the same header, but one that leaves its image would stop DALI's decoder,
    and DALI has crashed the process on that error; :func:`window_mismatch` names
    it instead."""
    from nvidia.dali import fn, math as dmath, types

    limit = fn.cast(fn.stack(size[1], size[0]), dtype=types.FLOAT)  # (W, H)
    shape = dmath.min(shape, limit)
    return dmath.clamp(anchor, 0.0, limit - shape), shape


def augment(encoded, opts: GraphOptions, train_inputs=None):
    """DALI graph: encoded images -> list of outputs before the labels. ``train_inputs``
    (training): the external source's ``(anchors, shapes, flips, sizes or None)`` nodes (see
    ``feed.BatchFeed``).

    With a GPU: ``[images]``, normalised ``(3, crop, crop)`` (HWC with channels-last), float16
    if ``opts.dtype`` is, else float32 (no bfloat16 in DALI: ``_to_torch`` converts). CPU-only:
    ``[crops, mirror]`` for training (uint8 HWC RandomResizedCrop windows of varied size, int32
    flip flags) or ``[images]`` for validation (whole uint8 HWC images), which
    :func:`finish_on_cpu` resizes, flips and normalises: DALI's CPU ``fn.resize`` is the slow
    stage there, its region-of-interest JPEG decoding fast (``benchmarks/profile_dali_cpu.py``).
    Training lists end with the :data:`WINDOW_CHECKS` outputs that :func:`window_mismatch`
    reads. Grayscale and CMYK JPEGs come out as RGB (``output_type=RGB``), as PIL's
    ``convert("RGB")``; EXIF orientation is not applied, in the window either (pixels as stored,
    as every loader here: docs/loaders.md, *Orientation*).
    """
    from nvidia.dali import fn, types

    decode = decode_args(opts)
    if opts.train:
        anchor, shape, mirror, sizes, aug_draws = train_inputs
        size = stored_shape(encoded)
        images = fn.decoders.image_slice(encoded, *inside(anchor, shape, size),
                                         normalized_anchor=False, normalized_shape=False,
                                         **decode)
        # images.shape() is metadata: on the host even for GPU images, without a copy
        checks = [images.shape(), anchor, shape, size]
    else:
        images = fn.decoders.image(encoded, **decode)
        mirror, checks = 0, []
    if not opts.cuda:
        return [images, mirror, *checks] if opts.train else [images]
    if opts.decode_on_cpu:
        images = images.gpu()  # decode on the CPU, resize and normalise on the GPU (as DLE RN50)
    interp = ({} if opts.interpolation == "bilinear"
              else {"interp_type": getattr(types, _INTERP[opts.interpolation])})
    if opts.train:  # the side can change between epochs (progressive resizing): an input
        images = fn.resize(images, resize_x=sizes, resize_y=sizes, **interp)
        crop = {}
        if opts.augment is not None:  # flip, then the policy (torchvision's order)
            images = opts.augment.graph(fn.flip(images, horizontal=mirror), aug_draws)
            mirror = 0
    else:
        images = fn.resize(images, resize_shorter=opts.resize_size, **interp)
        crop = {"crop": (opts.crop_size, opts.crop_size)}
    return [fn.crop_mirror_normalize(
        images, mirror=mirror, **crop,
        dtype=types.FLOAT16 if opts.dtype == torch.float16 else types.FLOAT,
        output_layout="HWC" if opts.channels_last else "CHW",
        mean=[255 * m for m in IMAGENET_MEAN], std=[255 * s for s in IMAGENET_STD]), *checks]


# The last outputs of a training graph before the labels: the decoded windows' shapes (int64
# (H, W, C) each), the drawn windows' anchors (x, y) and shapes (w, h) (float32), and the
# images' stored shapes (float64 (H, W, C)).
WINDOW_CHECKS = 4


def window_mismatch(outputs) -> tuple[int, str] | None:
    """``(position in the batch, one-line reason)`` of the first sample of a training batch
    (the pipeline's outputs, labels last) whose RandomResizedCrop window leaves its stored
    image, or whose decoded window is not that ``h x w x 3``; None if every sample is right.
    Reads shape metadata only, never pixels, so it runs before anything reads a buffer."""
    decoded, anchors, shapes, sizes = (np.array(out.as_tensor()).reshape(len(out), -1)
                                       for out in outputs[-1 - WINDOW_CHECKS:-1])
    for position in range(len(decoded)):
        (x, y), (w, h) = anchors[position].astype(np.int64), shapes[position].astype(np.int64)
        height, width = sizes[position][:2].astype(np.int64)
        if min(x, y) < 0 or x + w > width or y + h > height:
            return position, (f"its RandomResizedCrop window {w}x{h} at ({x}, {y}) leaves the "
                              f"{width}x{height} image as stored")
        if tuple(decoded[position]) != (h, w, 3):
            got = "x".join(str(v) for v in decoded[position])
            return position, f"DALI decoded {got} pixels for its {h}x{w}x3 window"
    return None


def finish_on_cpu(outputs, opts: GraphOptions, augment_seed: int | None = None,
                  seconds: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU-only pipeline outputs (see :func:`augment`) -> normalised float32 ``(N, 3, crop,
    crop)`` images and int64 ``(N,)`` labels, with the other backends' torch resize
    (``loaders.transforms``) and normalisation (``normalize.normalize_each``); training crops
    then go through ``opts.augment``'s torch policy, its draws from torch's generator
    seeded with ``augment_seed`` (the batch's, as the DataLoader workers seed theirs).
    ``seconds``, if given, gets the wall seconds of the resizes (``"resize"``), of the flips
    and policy (``"augment"``) and of the rest (``"copy"``: the normalisation, the labels)."""
    clock = time.perf_counter if seconds is not None else no_clock
    started = clock()
    spent = {"resize": 0.0, "augment": 0.0}
    images, *rest, labels = outputs
    size, interp = opts.crop_size, opts.interpolation
    flips = np.array(rest[0].as_tensor()).reshape(-1) if opts.train else None
    policy = opts.augment.torch_policy if opts.train and opts.augment is not None else None

    def crops():
        for i in range(len(images)):
            # A view of DALI's buffer, valid until the next run(); resizing copies it out.
            image = torch.from_numpy(np.asarray(images[i])).permute(2, 0, 1)
            began = clock()
            if opts.train:
                out = resize(image, (size, size), interp)
                resized = clock()
                out = out.flip(-1) if flips[i] else out
                out = out if policy is None else policy(out)
                spent["augment"] += clock() - resized
            else:
                out = resize_center_crop(image, opts.resize_size, size, interp)
                resized = clock()
            spent["resize"] += resized - began
            yield out

    # Each crop is normalised straight after its resize, while it is in cache.
    out = float_batch((len(images), 3, size, size), torch.device("cpu"), opts.channels_last)
    with torch.random.fork_rng(devices=[], enabled=policy is not None):
        if policy is not None:
            torch.default_generator.manual_seed(augment_seed)
        out = normalize_each(crops(), out, _MEAN_255, _STD_255)
    labels = torch.from_numpy(np.array(labels.as_tensor())).reshape(-1).to(torch.int64)
    if seconds is not None:
        seconds.update(spent, copy=time.perf_counter() - started - sum(spent.values()))
    return out, labels


def outputs_to_torch(outputs, opts: GraphOptions, device: torch.device, augment_seed: int,
                     seconds: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's pipeline outputs as the loader yields them: CPU-only :func:`finish_on_cpu`
    (``augment_seed``: its policy's); with CUDA ``opts.dtype`` images (channels-last NCHW
    views of DALI's NHWC with ``opts.channels_last``) and int64 labels on ``device``, taken
    without a copy (:func:`gpu_to_torch`) on torch's current stream. ``seconds``, if given,
    gets ``"copy"``, the host's wall seconds of the hand-over (CPU-only also ``"resize"``
    and ``"augment"``)."""
    if not opts.cuda:
        return finish_on_cpu(outputs, opts, augment_seed, seconds)
    started = time.perf_counter()
    images, labels = (gpu_to_torch(out, device) for out in (outputs[0], outputs[-1]))
    if opts.dtype == torch.bfloat16:  # DALI has no bfloat16: the one copy, on the GPU
        images = images.to(torch.bfloat16)
    if opts.channels_last:
        images = images.permute(0, 3, 1, 2)  # NHWC storage viewed as channels-last NCHW
    labels = labels.reshape(-1).to(torch.int64)
    if seconds is not None:
        seconds["copy"] = time.perf_counter() - started
    return images, labels


def source(feed):
    """The graph's source: ``(encoded, labels, train_inputs or None)`` from one batched
    ``fn.external_source`` calling ``feed`` (a ``feed.BatchFeed``) on the thread that runs
    the pipeline; ``train_inputs``: ``(anchors, shapes, flips, sizes or None, the
    ``--auto-augment`` policy's draws or None)``. Uniform inputs
    come as one ``(N, ...)`` array each, which DALI takes in one piece (2.49 ms per batch as
    per-sample lists vs 0.55 ms), and nothing is copied (``no_copy``)."""
    from nvidia.dali import fn, types

    dtypes = ([types.UINT8, types.INT32]
              + ([types.FLOAT, types.FLOAT, types.INT32] if feed.train else [])
              + ([types.FLOAT] if feed.sizes else []) + ([types.INT32] if feed.augment else []))
    # no_copy: DALI reads the feed's arrays in place (the feed keeps them alive until then)
    # instead of copying each batch on the training thread (5-8 ms per 256 images here)
    outs = fn.external_source(source=feed, num_outputs=len(dtypes), batch=True,
                              batch_info=True, parallel=False, dtype=dtypes, no_copy=True)
    train = (*outs[2:], None, None)[:5] if feed.train else None
    return outs[0], outs[1], train


def gpu_to_torch(tensor_list, device: torch.device) -> torch.Tensor:
    """A dense DALI ``TensorListGPU`` as a torch tensor on ``device`` without a copy (DLPack;
    DALI 2.4's dynamic executor keeps the buffer while torch holds it, as its PyTorch iterator
    does), ordered on torch's current stream: the pipeline ran with it as its output stream."""
    with torch.cuda.device(device):
        return torch.from_dlpack(tensor_list.as_tensor())


def graph_options(settings: LoaderSettings, dist: DistInfo, train: bool) -> GraphOptions:
    """The split's graph options from ``settings``; ``dali_hw_decoder_load`` None ->
    :func:`default_hw_decoder_load`. Raises :class:`DataError` for a load outside [0, 1]."""
    cuda = dist.device.type == "cuda"
    load = settings.dali_hw_decoder_load
    if load is None:
        load = default_hw_decoder_load(dist.device)
    elif not 0 <= load <= 1:
        raise DataError(f"--dali-hw-decoder-load {load}: must be between 0 and 1")
    policy = None
    if train and settings.auto_augment is not None:
        policy = DaliAugment(settings.auto_augment, settings.interpolation,
                             settings.ra_magnitude, settings.augmix_severity)
        policy.check(cuda)
    return GraphOptions(
        train=train, crop_size=settings.train_crop_size if train else settings.val_crop_size,
        resize_size=settings.val_resize_size, cuda=cuda,
        decode_on_cpu=not cuda or settings.dali_cpu, hw_decoder_load=load,
        dtype=settings.dtype, channels_last=settings.channels_last, augment=policy,
        interpolation=settings.interpolation, threads=max(1, settings.workers))
