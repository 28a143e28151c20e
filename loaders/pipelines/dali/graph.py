"""The DALI graph of ``--dali`` (:func:`pipeline_outputs`), CPU-only finished in torch
(:func:`finish_on_cpu`). DALI is imported only inside functions."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from decode import resize

from ...timing.stages import no_clock
from ...transforms import resize_center_crop
from ...transforms.normalize import (IMAGENET_MEAN, IMAGENET_STD, float_batch, imagenet_mean_std,
                                     normalize_each)

_MEAN_255, _STD_255 = imagenet_mean_std()
_INTERP = {"nearest": "INTERP_NN", "bicubic": "INTERP_CUBIC"}  # --interpolation -> DALI's


# nvJPEG's buffers (bytes per decoding thread) sized for the largest ImageNet JPEGs "to avoid
# reallocations in runtime", as NVIDIA's DeepLearningExamples RN50 (image_classification/dali.py)
# and DALI's ResNet-50 example set them for their 4 threads (DALI 2.4: 16 MiB device / 8 MiB
# host); that total is split beyond, so -j 16 does not pin 16 x 134 MiB. Size hints: pixels.
NVJPEG_PADDING = dict(device_memory_padding=211025920, host_memory_padding=140544512)
NVJPEG_HINTS = dict(preallocate_width_hint=5980, preallocate_height_hint=6430)
NVJPEG_EXAMPLE_THREADS = 4


def decode_args(opts: "GraphOptions") -> dict:
    """The decoder's arguments: RGB pixels as stored (no EXIF orientation), CPU or mixed (+
    nvJPEG's paddings and hints, ``hw_decoder_load``, libjpeg-turbo's "fancy" upsampling)."""
    from nvidia.dali import types

    args = {"device": "cpu" if opts.decode_on_cpu else "mixed", "output_type": types.RGB,
            "adjust_orientation": False}
    if not opts.decode_on_cpu:
        share = NVJPEG_EXAMPLE_THREADS / max(NVJPEG_EXAMPLE_THREADS, opts.threads)
        args.update({k: int(v * share) for k, v in NVJPEG_PADDING.items()}, **NVJPEG_HINTS,
                    hw_decoder_load=opts.hw_decoder_load, jpeg_fancy_upsampling=True)
    return args


@dataclass(frozen=True)
class GraphOptions:
    """How the decode/augment graph is placed and shaped (sizes in pixels)."""

    train: bool
    crop_size: int
    resize_size: int  # validation shorter side
    cuda: bool  # the pipeline has a GPU (device_id set)
    decode_on_cpu: bool  # --dali-cpu, or no CUDA
    hw_decoder_load: float
    dtype: torch.dtype  # of the delivered images (loaders.settings.input_dtype)
    channels_last: bool
    augment: object = None  # training's --auto-augment: an augment.DaliAugment, or None
    interpolation: str = "bilinear"
    threads: int = 1  # the pipeline's CPU threads (-j): nvJPEG's buffers are per thread


def pipeline_outputs(feed, opts: GraphOptions) -> tuple:
    """DALI graph of one pipeline reading ``feed`` (``feed.BatchFeed``) through one batched
    ``fn.external_source`` (0.55 ms per batch; 2.49 with lists): the images' outputs, then int32
    ``(N,)`` labels. With a GPU: ``(images,)``, normalised ``(3, crop, crop)`` (HWC with
    channels-last), float16 if ``opts.dtype`` is, else float32 (DALI has no bfloat16). CPU-only,
    for :func:`finish_on_cpu` (DALI's CPU resize is slow, its region decode fast:
    ``benchmarks/pipelines/dali_cpu.py``): training's ``(crops, mirror)`` (uint8 HWC windows,
    int32 flips), validation's ``(images,)`` (whole uint8 HWC). Training's end with the
    :data:`WINDOW_CHECKS` outputs. Grayscale and CMYK come out RGB, EXIF orientation unapplied
    (docs/loaders.md, *Orientation*). A training window is clamped into the stored image (else
    DALI's decoder stops or crashes); :func:`window_mismatch` names one that left it."""
    from nvidia.dali import fn, math as dmath, types

    dtypes = ([types.UINT8, types.INT32]
              + ([types.FLOAT, types.FLOAT, types.INT32] if feed.train else [])
              + ([types.FLOAT] if feed.sizes else []) + ([types.INT32] if feed.augment else []))
    # no_copy: DALI reads the feed's arrays in place, not copying 256 images (5-8 ms) here
    encoded, labels, *train_inputs = fn.external_source(
        source=feed, num_outputs=len(dtypes), batch=True, batch_info=True, parallel=False,
        dtype=dtypes, no_copy=True)
    if opts.cuda:  # copied with the images, not a blocking pageable copy
        labels = labels.gpu()
    decode = decode_args(opts)
    if opts.train:
        anchor, shape, mirror, sizes, aug_draws = (*train_inputs, None, None)[:5]
        size = fn.cast(fn.peek_image_shape(encoded, adjust_orientation=False),
                       dtype=types.FLOAT64)  # (H, W, C)
        limit = fn.cast(fn.stack(size[1], size[0]), dtype=types.FLOAT)  # (W, H)
        inside = dmath.min(shape, limit)  # the drawn anchor and shape go to the checks
        images = fn.decoders.image_slice(encoded, dmath.clamp(anchor, 0.0, limit - inside),
                                         inside, normalized_anchor=False,
                                         normalized_shape=False, **decode)
        # images.shape() is metadata: on the host even for GPU images, without a copy
        checks = [images.shape(), anchor, shape, size]
    else:
        images = fn.decoders.image(encoded, **decode)
        mirror, checks = 0, []
    if not opts.cuda:
        return (images, mirror, *checks, labels) if opts.train else (images, labels)
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
    return (fn.crop_mirror_normalize(
        images, mirror=mirror, **crop,
        dtype=types.FLOAT16 if opts.dtype == torch.float16 else types.FLOAT,
        output_layout="HWC" if opts.channels_last else "CHW",
        mean=[255 * m for m in IMAGENET_MEAN], std=[255 * s for s in IMAGENET_STD]), *checks,
        labels)


# A training graph's last outputs before the labels: decoded window shapes (int64 HWC), drawn
# anchors and shapes (float32 (x, y), (w, h)) and stored shapes (float64 HWC).
WINDOW_CHECKS = 4


def window_mismatch(outputs) -> tuple[int, str] | None:
    """``(position, one-line reason)`` of the first sample of a training batch's outputs whose
    window leaves its stored image or decoded to other than ``h x w x 3``; None if all are right.
    Reads shape metadata only, so it runs before anything reads a buffer."""
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
    """CPU-only outputs -> normalised float32 ``(N, 3, crop, crop)`` images and int64 ``(N,)``
    labels by the other pipelines' torch resize and normalisation (training: ``opts.augment``'s
    torch policy seeded with ``augment_seed``). ``seconds`` gets the wall seconds of ``"resize"``,
    ``"augment"`` (flips and policy) and ``"copy"`` (the rest)."""
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
