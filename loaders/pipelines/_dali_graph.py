"""The DALI side of ``--dali`` (``loaders/dali.py``): the sources of encoded images and labels,
the decode/augment graph, and turning its outputs into torch tensors.

Source: one ``fn.external_source`` fed by a :class:`PassFeed`, which the loader points at each
pass's order, so a pipeline is built once per run and reused every epoch (as in NVIDIA's DALI
ResNet-50 example): a JPEG folder's file names (read by ``fn.io.file.read``), or the encoded
records of an LMDB or shards; the labels; and for training each sample's RandomResizedCrop
draws, flip and output size, drawn from (seed, epoch, rank, batch number) on the host, so an
epoch's augmentation does not depend on what the pipeline ran before.

Graph (:func:`augment`): with a GPU, decode (nvJPEG, or the CPU with ``--dali-cpu``), resize,
crop, flip and normalise in DALI; CPU-only, DALI decodes (a training JPEG's RandomResizedCrop
window only) and :func:`finish_on_cpu` resizes, flips and normalises with the other backends'
torch code, because DALI's CPU resize is the slow step there.

DALI is imported only inside functions, so this module imports without it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from decode import resize

from ..normalize import IMAGENET_MEAN, IMAGENET_STD, float_batch, imagenet_mean_std, normalize_each
from ..transforms import RRC_ATTEMPTS, RRC_RATIO, RRC_SCALE, resize_center_crop

_MEAN_255, _STD_255 = imagenet_mean_std()
_INTERP = {"nearest": "INTERP_NN", "bicubic": "INTERP_CUBIC"}  # --interpolation -> DALI's


@dataclass(frozen=True)
class GraphOptions:
    """How the decode/augment graph is placed and shaped (sizes in pixels)."""

    train: bool
    crop_size: int
    resize_size: int  # validation shorter side; unused for training
    cuda: bool  # pipeline has a GPU (device_id set); False: CPU-only
    decode_on_cpu: bool  # --dali-cpu, or no CUDA
    hw_decoder_load: float
    dtype: torch.dtype  # of the delivered images (loaders.contract.input_dtype)
    channels_last: bool
    augment: object = None  # training's --auto-augment: a _dali_augment.DaliAugment, or None
    interpolation: str = "bilinear"  # --interpolation of the resizes


def stored_shape(encoded):
    """Each image's ``(H, W, C)`` as stored, float64, from its header: the shape the decoder
    (``adjust_orientation=False``) decodes. ``fn.peek_image_shape`` applies EXIF orientation by
    default: an EXIF-rotated JPEG's window was drawn for the turned shape and left the stored
    image, and DALI stopped on it, or crashed the process (issue 35)."""
    from nvidia.dali import fn, types

    return fn.cast(fn.peek_image_shape(encoded, adjust_orientation=False), dtype=types.FLOAT64)


def random_window(size, draws):
    """RandomResizedCrop's window of each image of ``size`` (:func:`stored_shape`), computed in
    the graph from its uniforms ``draws`` (float64 ``(4 * RRC_ATTEMPTS,)``, see
    :func:`crop_draws`) exactly as :func:`loaders.transforms.random_resized_crop_params` does
    on the CPU (torchvision's ``RandomResizedCrop.get_params``): up to ``RRC_ATTEMPTS`` windows
    of area share in ``RRC_SCALE`` and log-uniform aspect ratio in ``RRC_RATIO``, the first that
    fits placed uniformly, else the central crop with the ratio clamped. Returns ``(anchor,
    shape)``, ``(x, y)`` and ``(w, h)`` in whole pixels (float32), for ``fn.decoders.image_slice``.

    The attempts are computed together, as ``(RRC_ATTEMPTS,)`` vectors: each graph operator
    costs a CPU pipeline about the same per batch whatever its tensors' size, and one node per
    attempt and step (about 250) made ``--dali --dali-cpu`` a quarter slower."""
    from nvidia.dali import fn, math as dmath, types

    height, width = size[0], size[1]
    log_lo, log_hi = math.log(RRC_RATIO[0]), math.log(RRC_RATIO[1])
    u_area, u_ratio, u_top, u_left = (draws[i::4] for i in range(4))  # (RRC_ATTEMPTS,) each
    target = height * width * (RRC_SCALE[0] + u_area * (RRC_SCALE[1] - RRC_SCALE[0]))
    aspect = dmath.exp(log_lo + u_ratio * (log_hi - log_lo))
    w = dmath.floor(dmath.sqrt(target * aspect) + 0.5)
    h = dmath.floor(dmath.sqrt(target / aspect) + 0.5)
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    # The first attempt that fits scores highest (all 0 if none fits). Whole pixels below
    # 2**24 are exact in float32, which DALI's reductions need.
    score = fn.cast(fits, dtype=types.FLOAT) * types.Constant(
        np.arange(RRC_ATTEMPTS, 0, -1, dtype=np.float32))
    best = fn.reductions.max(score)
    chosen = fn.cast((score == best) & (best > 0), dtype=types.FLOAT)

    def pick(values):  # the chosen attempt's value, 0 where none fits
        return fn.reductions.sum(chosen * fn.cast(values, dtype=types.FLOAT))

    w_sel, h_sel = pick(w), pick(h)
    top, left = (pick(dmath.floor(u * (side - s + 1.0)))
                 for u, side, s in ((u_top, height, h), (u_left, width, w)))
    unchosen = fn.cast(best == 0, dtype=types.FLOAT)
    w_c, h_c = _central_window(height, width)
    top_c, left_c = dmath.floor((height - h_c) / 2.0), dmath.floor((width - w_c) / 2.0)
    w_sel, h_sel, top, left = (
        chosen_value + unchosen * fn.cast(central, dtype=types.FLOAT)
        for chosen_value, central in ((w_sel, w_c), (h_sel, h_c), (top, top_c), (left, left_c)))
    return fn.stack(left, top), fn.stack(w_sel, h_sel)


def _central_window(height, width):
    """torchvision's fallback window ``(w, h)``: the whole image with its aspect ratio clamped
    to ``RRC_RATIO`` (graph nodes, float64)."""
    from nvidia.dali import fn, math as dmath, types

    ratio = width / height
    narrow = fn.cast(ratio < min(RRC_RATIO), dtype=types.FLOAT64)
    wide = fn.cast(ratio > max(RRC_RATIO), dtype=types.FLOAT64)
    w = (1.0 - wide) * width + wide * dmath.floor(height * max(RRC_RATIO) + 0.5)
    h = (1.0 - narrow) * height + narrow * dmath.floor(width / min(RRC_RATIO) + 0.5)
    return w, h


def inside(anchor, shape, size):
    """``(anchor, shape)`` clamped into the image of ``size`` (graph nodes as
    :func:`random_window` returns them): the same window for every window it draws, but one
    that leaves its image would stop DALI's decoder, and DALI has crashed the process on that
    error (issue 35); :func:`window_mismatch` names it instead."""
    from nvidia.dali import fn, math as dmath, types

    limit = fn.cast(fn.stack(size[1], size[0]), dtype=types.FLOAT)  # (W, H)
    shape = dmath.min(shape, limit)
    return dmath.clamp(anchor, 0.0, limit - shape), shape


def augment(encoded, opts: GraphOptions, train_inputs=None):
    """DALI graph: encoded images -> list of outputs before the labels. ``train_inputs``
    (training): the external source's ``(draws, flips, sizes)`` nodes of :class:`PassFeed`.

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

    decode = {"device": "cpu" if opts.decode_on_cpu else "mixed", "output_type": types.RGB,
              "adjust_orientation": False}  # pixels as stored, as the other loaders
    if not opts.decode_on_cpu:
        decode["hw_decoder_load"] = opts.hw_decoder_load
    if opts.train:
        draws, mirror, sizes, aug_draws = train_inputs
        size = stored_shape(encoded)
        anchor, shape = random_window(size, draws)
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


def finish_on_cpu(outputs, opts: GraphOptions,
                  augment_seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU-only pipeline outputs (see :func:`augment`) -> normalised float32 ``(N, 3, crop,
    crop)`` images and int64 ``(N,)`` labels, with the other backends' torch resize
    (``loaders.transforms``) and normalisation (``loaders.normalize.normalize_each``); training
    crops then go through ``opts.augment``'s torch policy, its draws from torch's generator
    seeded with ``augment_seed`` (the batch's, as the DataLoader workers seed theirs)."""
    images, *rest, labels = outputs
    size, interp = opts.crop_size, opts.interpolation
    flips = np.array(rest[0].as_tensor()).reshape(-1) if opts.train else None
    policy = opts.augment.torch_policy if opts.train and opts.augment is not None else None

    def crops():
        for i in range(len(images)):
            # A view of DALI's buffer, valid until the next run(); resizing copies it out.
            image = torch.from_numpy(np.asarray(images[i])).permute(2, 0, 1)
            if opts.train:
                out = resize(image, (size, size), interp)
                out = out.flip(-1) if flips[i] else out
                yield out if policy is None else policy(out)
            else:
                yield resize_center_crop(image, opts.resize_size, size, interp)

    # Each crop is normalised straight after its resize, while it is in cache.
    out = float_batch((len(images), 3, size, size), torch.device("cpu"), opts.channels_last)
    with torch.random.fork_rng(devices=[], enabled=policy is not None):
        if policy is not None:
            torch.default_generator.manual_seed(augment_seed)
        out = normalize_each(crops(), out, _MEAN_255, _STD_255)
    return out, torch.from_numpy(np.array(labels.as_tensor())).reshape(-1).to(torch.int64)


def crop_draws(seed: int, epoch: int, rank: int, batch: int, count: int):
    """RandomResizedCrop uniforms and flips of batch ``batch`` of an epoch: float64
    ``(count, 4 * RRC_ATTEMPTS)`` uniforms in [0, 1) (area share, aspect ratio, top, left per
    attempt, as :func:`loaders.transforms.random_resized_crop_params` takes them) and int32
    ``(count,)`` flips, a function of (seed, epoch, rank, batch) alone: a rebuilt pipeline or a
    resumed epoch draws the same."""
    rng = np.random.default_rng([seed, epoch, rank, batch])
    draws = rng.random((count, 4 * RRC_ATTEMPTS))
    return draws, (rng.random(count) < 0.5).astype(np.int32)


class PassFeed:
    """``fn.external_source`` callable (``batch=True``, ``batch_info=True``, main thread) of
    one pipeline, which the loader points at a pass with :meth:`start`.

    Pipeline ``index`` of ``pipelines`` yields batches ``index, index + pipelines, ...`` of the
    pass's ``order``. Each call returns ``[data, labels]`` (``read(i)`` gives sample ``i``'s
    uint8 1-D array, an encoded image or file name, and its label; labels int32 ``()``), plus
    for training float64 ``(4 * RRC_ATTEMPTS,)`` crop uniforms, int32 flips and, if ``sizes``
    (the GPU graph resizes in DALI), float32 output sides; raises ``StopIteration`` after the
    pass's last (possibly partial, never padded) batch.
    """

    def __init__(self, read: Callable[[int], tuple[np.ndarray, int]], train: bool,
                 batch_size: int, seed: int, rank: int, sizes: bool = True, augment=None):
        self.read, self.train, self.batch_size = read, train, batch_size
        self.sizes = train and sizes
        self.augment = augment if self.sizes else None  # the GPU graph's policy draws
        self.seed, self.rank = seed, rank
        self.start([], epoch=0, first_batch=0, size=0, index=0, pipelines=1)

    def start(self, order: Sequence[int], epoch: int, first_batch: int, size: int, index: int,
              pipelines: int) -> None:
        """Feed ``order`` from now on: its batch ``b`` is batch ``first_batch + b`` of epoch
        ``epoch`` (for the draws), cropped to ``size`` px."""
        self.order, self.epoch, self.first_batch = list(order), epoch, first_batch
        self.size, self.index, self.pipelines = size, index, pipelines

    def __call__(self, info):
        batch = self.index + info.iteration * self.pipelines
        indices = self.order[batch * self.batch_size:(batch + 1) * self.batch_size]
        if not indices:
            raise StopIteration
        samples = [self.read(i) for i in indices]
        out = [[data for data, _ in samples], [np.array(label, np.int32) for _, label in samples]]
        if self.train:
            draws, flips = crop_draws(self.seed, self.epoch, self.rank, self.first_batch + batch,
                                      len(indices))
            out += [list(draws), list(flips)]
        if self.sizes:
            out.append([np.array(self.size, np.float32)] * len(indices))
        if self.augment is not None:
            out.append(self.augment.host_draws(self.seed, self.epoch, self.rank,
                                               self.first_batch + batch, len(indices)))
        return out


def file_name(reader, index: int) -> tuple[np.ndarray, int]:
    """:attr:`PassFeed.read` of a reader of local files (``Reader.file_of``, JPEG folders): the
    file name as uint8, for ``fn.io.file.read``."""
    path, label = reader.file_of(index)
    return np.frombuffer(path.encode(), dtype=np.uint8), label


def record(reader, index: int) -> tuple[np.ndarray, int]:
    """:attr:`PassFeed.read` of any other reader (LMDB, shard records): the encoded image as
    uint8."""
    data, label = reader.read(index)
    return np.frombuffer(data, dtype=np.uint8), label


def source(feed: PassFeed, files: bool):
    """The graph's source: ``(encoded, labels, train_inputs or None)``. ``files``: the feed gives
    file names, read by ``fn.io.file.read`` in DALI's threads (plain reads, not mapped:
    +2.5% images/s CPU-only on 2 cores with the former ``fn.readers.file``)."""
    from nvidia.dali import fn, types

    dtypes = ([types.UINT8, types.INT32] + ([types.FLOAT64, types.INT32] if feed.train else [])
              + ([types.FLOAT] if feed.sizes else []) + ([types.INT32] if feed.augment else []))
    outs = fn.external_source(source=feed, num_outputs=len(dtypes), batch=True,
                              batch_info=True, parallel=False, dtype=dtypes)
    encoded = fn.io.file.read(outs[0], dont_use_mmap=True) if files else outs[0]
    # (draws, flips, sizes or None, the policy's draws or None)
    train = (*outs[2:], None, None)[:4] if feed.train else None
    return encoded, outs[1], train


def gpu_to_torch(tensor_list, device: torch.device) -> torch.Tensor:
    """Copy a dense DALI ``TensorListGPU`` into a new torch tensor on ``device``, queued on
    torch's current stream (so the host does not wait, and torch's next kernels do)."""
    from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

    tensor = tensor_list.as_tensor()
    out = torch.empty(tensor.shape(), dtype=to_torch_type[tensor.dtype], device=device)
    feed_ndarray(tensor, out, cuda_stream=torch.cuda.current_stream(device))
    return out
