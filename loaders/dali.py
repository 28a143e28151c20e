"""NVIDIA DALI backend (``--dali``): JPEG decode, crop and normalisation inside a DALI pipeline.

Two sources feed the same decode/augment graph:

* a JPEG folder (ImageNet layout) through ``fn.readers.file``, with the file list and labels
  of torchvision's ``ImageFolder`` (so labels equal the folder loader's by construction);
* an LMDB written by ``folder2lmdb.py`` (``--dali --lmdb``) through ``fn.external_source``,
  reading records with :class:`loaders.lmdb_records.LMDBDataset` (format in ``_lmdb_codec``).

With CUDA, decoding is nvJPEG (``device="mixed"``, hardware decoder share
``--dali-hw-decoder-load``) and the rest, labels included, runs on the GPU; ``--dali-cpu``
decodes on the CPU and resizes and normalises on the GPU, as NVIDIA's DeepLearningExamples RN50
does. Without CUDA the pipelines run CPU-only (``device_id=None``): DALI reads and decodes (only
the RandomResizedCrop window of a training JPEG), and torch resizes, flips and normalises with
the other backends' code, because DALI's CPU resize is the slow step there (:func:`_augment`);
``-j`` single-threaded pipelines take turns, one batch each (:meth:`DALILoader._num_pipelines`).
EXIF orientation is not applied (``adjust_orientation=False``): as in every loader here and in
the ``ImageFolder`` + PIL pipeline of pytorch/examples, a JPEG's pixels are used as stored.

Order: this module decides which samples each rank reads, in which order, every epoch (the
``DistributedSampler`` permutation for training, :class:`ShardSampler` for validation) and hands
DALI that exact list, not using DALI's shuffling and sharding. New pipelines are built for every
pass, seeded from (seed, epoch, rank) and the pipeline's index, so an epoch's order is a function
of (seed, epoch, rank) and its augmentation of (seed, epoch, rank, CPU-only pipelines) alone.

DALI is imported only inside functions: this module imports without it, and ``build_loaders``
raises :class:`DataError` naming the pip package to install when it is missing or, on CUDA,
built for another CUDA major than torch.
"""
from __future__ import annotations

import importlib.metadata
import math
import re
from dataclasses import dataclass
from functools import partial
from typing import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from ._errors import AcceleratorError
from ._robust import DECODE_ERRORS, report_unreadable, too_many_unreadable
from ._transforms import decode, read_file, resize, resize_center_crop
from ._common import (IMAGENET_MEAN, IMAGENET_STD, DataError, DistInfo, ShardSampler,
                      _mix_seed, check_same_classes, float_batch, imagenet_mean_std,
                      input_dtype, normalize_each, split_paths)

# Share of JPEGs for the hardware JPEG decoder (fn.decoders.image ``hw_decoder_load``). DALI
# 2.4's default is 0.65; its doc says the best value "should be found empirically" and links
# the one per-GPU figure NVIDIA published, 0.75 on A100 (quoted in NVIDIA/DALI#5362):
# https://developer.nvidia.com/blog/loading-data-fast-with-dali-and-new-jpeg-decoder-in-a100/
# DeepLearningExamples RN50 and DALI's RN50 example keep the default. GPUs without a hardware
# decoder ignore the value.
DEFAULT_HW_DECODER_LOAD = 0.65
A100_HW_DECODER_LOAD = 0.75
# DALI's and CUDA's words for a failed GPU or driver ("CUDA runtime API error cudaErrorMemory
# Allocation", "CUDA driver API error", "CUDA allocation failed", "out of memory"): not bad data.
_CUDA_FAILURE = re.compile(r"cuda (error|runtime|driver|allocation)|cudaerror|cuda_error|"
                           r"out of memory", re.IGNORECASE)
# RandomResizedCrop's ranges (Szegedy et al. 2015; torchvision and DeepLearningExamples RN50).
RANDOM_AREA = (0.08, 1.0)
RANDOM_ASPECT_RATIO = (3 / 4, 4 / 3)
_MEAN_255, _STD_255 = imagenet_mean_std()


def dali_pip_package(cuda_version: str | None) -> str:
    """The DALI wheel for torch's CUDA ``cuda_version`` ("12.8" -> ``nvidia-dali-cuda120``,
    "13.0" -> ``nvidia-dali-cuda130``; None, a torch without CUDA -> the CUDA 13 wheel)."""
    return f"nvidia-dali-cuda{(cuda_version or '13').split('.')[0]}0"


def check_dali_wheel(cuda_version: str | None, installed: Sequence[str]) -> None:
    """Raise :class:`DataError` if one of the distributions ``installed`` is a DALI wheel
    (``nvidia-dali[-nightly]-cudaXY0``) for another CUDA major than ``cuda_version``. Both
    wheels write ``nvidia/dali``, so the fix uninstalls both before installing the right one."""
    wanted = dali_pip_package(cuda_version)
    for name in (n.lower().replace("_", "-") for n in installed):
        if (cuda_version and re.fullmatch(r"nvidia-dali(-[a-z]+)?-cuda\d+", name)
                and not name.endswith(wanted[len("nvidia-dali-"):])):
            raise DataError(f"--dali: {name} is built for another CUDA major than torch's "
                            f"{cuda_version}: pip uninstall -y {name} {wanted} && "
                            f"pip install {wanted}")


def _require_dali(device: torch.device):
    """Import DALI or raise :class:`DataError` with the one line that says which wheel to
    install: DALI is missing, or (on CUDA) built for another CUDA major than torch."""
    try:
        import nvidia.dali  # noqa: F401
    except (ImportError, OSError):
        raise DataError(f"--dali needs NVIDIA DALI, which is not installed: "
                        f"pip install {dali_pip_package(torch.version.cuda)}") from None
    if device.type == "cuda":
        check_dali_wheel(torch.version.cuda, [d.metadata["Name"] or ""
                                              for d in importlib.metadata.distributions()])


def default_hw_decoder_load(device: torch.device) -> float:
    """``hw_decoder_load`` for the GPU ``device``: :data:`A100_HW_DECODER_LOAD` on an A100, else
    DALI's default (the GPU's name is read only for a CUDA ``device``)."""
    if device.type == "cuda" and "A100" in torch.cuda.get_device_name(device).upper():
        return A100_HW_DECODER_LOAD
    return DEFAULT_HW_DECODER_LOAD


@dataclass(frozen=True)
class Plan:
    """Which dataset indices one rank reads per epoch, and how many batches that makes.

    Training: the permutation of ``DistributedSampler(shuffle=True, seed, drop_last=True)`` for
    the epoch (every rank the same count), cut to whole batches. Validation: indices
    ``rank, rank + world_size, ...`` (:class:`ShardSampler`), every sample exactly once across
    ranks, the last batch possibly partial. ``max_batches`` caps both (``--train-batches``).
    """

    num_samples: int
    batch_size: int
    train: bool
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    max_batches: int | None = None

    def order(self, epoch: int) -> list[int]:
        """Dataset indices this rank reads in ``epoch``, in reading order (no padding)."""
        if self.train:
            sampler = DistributedSampler(range(self.num_samples), num_replicas=self.world_size,
                                         rank=self.rank, shuffle=True, seed=self.seed,
                                         drop_last=True)
            sampler.set_epoch(epoch)
        else:
            sampler = ShardSampler(self.num_samples, self.rank, self.world_size)
        return list(sampler)[:self.num_batches * self.batch_size]

    @property
    def num_batches(self) -> int:
        """Batches per epoch on this rank: the loader's exact ``len()``."""
        if self.train:
            n = (self.num_samples // self.world_size) // self.batch_size
        else:
            n = math.ceil(len(range(self.rank, self.num_samples, self.world_size)) / self.batch_size)
        return n if self.max_batches is None else min(n, self.max_batches)


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


def _augment(encoded, opts: GraphOptions):
    """DALI graph: encoded images -> list of outputs before the labels.

    With a GPU: ``[images]``, normalised ``(3, crop, crop)`` (HWC with channels-last), float16
    if ``opts.dtype`` is, else float32 (no bfloat16 in DALI: ``_to_torch`` converts). CPU-only:
    ``[crops, mirror]`` for training (uint8 HWC RandomResizedCrop windows of varied size, int32
    flip flags) or ``[images]`` for validation (whole uint8 HWC images), which
    :func:`_finish_on_cpu` resizes, flips and normalises: DALI's CPU ``fn.resize`` is the slow
    stage there, its region-of-interest JPEG decoding fast (``benchmarks/profile_dali_cpu.py``).
    Grayscale and CMYK JPEGs come out as RGB (``output_type=RGB``), as PIL's ``convert("RGB")``.
    """
    from nvidia.dali import fn, types

    decode = {"device": "cpu" if opts.decode_on_cpu else "mixed", "output_type": types.RGB,
              "adjust_orientation": False}  # pixels as stored, as the other loaders
    if not opts.decode_on_cpu:
        decode["hw_decoder_load"] = opts.hw_decoder_load
    if opts.train:
        images = fn.decoders.image_random_crop(encoded, random_area=list(RANDOM_AREA),
                                               random_aspect_ratio=list(RANDOM_ASPECT_RATIO),
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


def _finish_on_cpu(outputs, opts: GraphOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU-only pipeline outputs (see :func:`_augment`) -> normalised float32 ``(N, 3, crop,
    crop)`` images and int64 ``(N,)`` labels, with the other backends' torch resize
    (``loaders._transforms``) and normalisation (``loaders._common.normalize_each``)."""
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


def _folder_source(samples: Sequence[tuple[str, int]], order: Sequence[int], parallel: bool):
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


def _lmdb_source(dataset, batch_size: int, order: Sequence[int], parallel: bool):
    """``fn.external_source`` of :class:`LMDBBatches`; ``parallel``: in DALI worker processes."""
    from nvidia.dali import fn, types

    extra = {"prefetch_queue_depth": 2} if parallel else {}
    return fn.external_source(source=LMDBBatches(dataset, order, batch_size), num_outputs=2,
                              batch=True, batch_info=True, parallel=parallel,
                              dtype=[types.UINT8, types.INT32], **extra)


class DALILoader:
    """One split's DALI pipelines, rebuilt for every pass, as a loader of the usual contract.

    Yields ``images``: ``(N, 3, H, W)`` ``opts.dtype`` (float32, or the ``--amp-dtype`` under
    ``--amp`` on CUDA) on ``device``, normalised with the ImageNet mean/std, channels-last
    memory format with ``--channels-last``; ``labels``: int64 ``(N,)`` on ``device`` (with CUDA
    both are copied out of DALI's GPU buffers on torch's current stream, not blocking the host).
    ``len()`` is exact; the last validation batch may be smaller than ``batch_size`` and holds
    no padding. ``classes`` lists the class names (index = label). ``set_epoch(epoch)`` selects
    the order and the augmentation seed. A sample DALI cannot decode is found with our CPU
    decoder, reported on stderr and replaced by the next readable one; iterating raises
    :class:`DataError` when more than ``max_bad_share`` of a pass fails or DALI fails for
    another reason, and :class:`AcceleratorError` at once for a CUDA failure (out of memory...).

    With CUDA one pipeline runs ``num_threads`` CPU threads. CPU-only, ``cpu_pipelines``
    pipelines (default: one per thread, each single-threaded) take turns, pipeline ``p``
    producing batches ``p, p + n, ...`` (see :meth:`_num_pipelines`).
    """

    def __init__(self, plan: Plan, make_source, opts: GraphOptions, classes: Sequence[str],
                 device: torch.device, num_threads: int, py_workers: int, seed: int,
                 read_encoded=None, describe=str, max_bad_share: float = 0.01,
                 cpu_pipelines: int | None = None):
        self.plan, self.opts, self.classes, self.device = plan, opts, list(classes), device
        self.make_source = make_source  # (order, parallel) -> DALI node(s) (encoded, label)
        self.read_encoded = read_encoded  # index -> encoded bytes, to find undecodable files
        self.describe = describe  # index -> path or record, for messages
        self.max_bad_share, self.seed = max_bad_share, seed
        self.num_threads, self.py_workers = max(1, num_threads), py_workers
        self.cpu_pipelines = cpu_pipelines
        self.epoch = self.start_batch = 0

    def __len__(self) -> int:
        return self.plan.num_batches - self.start_batch

    @property
    def batch_size(self) -> int:
        """Images per batch on this rank."""
        return self.plan.batch_size

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Make the next pass's order and augmentation a function of (seed, epoch, rank), and
        start it at batch ``start_batch`` (a resumed epoch)."""
        self.epoch, self.start_batch = epoch, start_batch

    def order(self) -> list[int]:
        """Dataset indices the next pass yields, in order (for tests and debugging)."""
        order = self.plan.order(self.epoch if self.plan.train else 0)
        return order[self.start_batch * self.plan.batch_size:]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order, step, bad = self.order(), 0, 0
        batch = self.plan.batch_size
        allowed = self.max_bad_share * len(order)
        while step < len(self):
            # DALI cannot skip a file it fails to decode: find it, swap it for a readable
            # sample, and rebuild the pipelines from the failed batch on.
            pipes, first = self._build_pipelines(order[step * batch:], len(self) - step), step
            while step < len(self):
                try:  # only run(): a torch error while copying out is not DALI's
                    # Pipeline p holds batches first + p, first + p + len(pipes), ...
                    outputs = pipes[(step - first) % len(pipes)].run()
                except RuntimeError as exc:
                    failure = _cuda_failure(exc)
                    if failure:
                        raise AcceleratorError(f"DALI: CUDA error on the {self._split} split: "
                                               f"{failure}") from exc
                    # Each pipeline runs up to its queue depth ahead: probe all in flight.
                    lookahead = len(pipes) * (self._queue_depth(len(pipes)) + 1)
                    bad += self._replace_unreadable(order, step, exc, lookahead)
                    if bad > allowed:
                        raise too_many_unreadable(bad, self.max_bad_share, "pass") from None
                    break
                images, labels = self._to_torch(outputs)
                take = min(len(order) - step * batch, len(labels))
                step += 1
                yield images[:take], labels[:take]
            pipes = outputs = None  # free the pipelines (and their GPU memory) before rebuilding

    @property
    def _split(self) -> str:
        return "training" if self.plan.train else "validation"

    def _replace_unreadable(self, order: list[int], step: int, exc: RuntimeError,
                            lookahead: int) -> int:
        """Probe the samples of batches ``step .. step + lookahead`` (DALI runs a few batches
        ahead) with our CPU decoder; report each unreadable one on stderr and replace it in
        ``order`` by the next readable dataset index. Returns how many were replaced; raises
        :class:`DataError` with DALI's message if none of them is unreadable."""
        batch = self.plan.batch_size
        window = range(step * batch, min(len(order), (step + lookahead) * batch))
        replaced = 0
        for position in window:
            index = order[position]
            while not self._readable(index):
                index = (index + 1) % self.plan.num_samples
                replaced += 1
                if replaced > len(window):
                    raise DataError(f"DALI: {replaced} unreadable samples near batch {step}: "
                                    "is this dataset damaged?")
            order[position] = index
        if replaced == 0:
            lines = _message_lines(exc)
            raise DataError(f"DALI failed on the {self._split} split at or shortly after batch "
                            f"{step} of this pass: {lines[-1] if lines else exc}") from None
        return replaced

    def _readable(self, index: int) -> bool:
        try:
            decode(self.read_encoded(index))
        except DECODE_ERRORS as exc:
            report_unreadable(self.describe(index), exc)
            return False
        return True

    def _num_pipelines(self, batches: int) -> int:
        """How many pipelines take turns over ``batches`` batches: 1 with CUDA; CPU-only,
        ``cpu_pipelines`` or one per thread. A multi-threaded DALI operator finishes a batch
        before it starts the next, so its threads idle while a batch's last images decode, and
        more so while the main thread resizes on the same cores; single-threaded pipelines
        taking turns have no such barrier (``profile_dali_cpu.py``, README *DALI loader*)."""
        if self.opts.cuda:
            return 1
        return max(1, min(self.cpu_pipelines or self.num_threads, batches))

    def _queue_depth(self, pipelines: int) -> int:
        # CPU-only, the main thread resizes while DALI decodes ahead: deeper queues keep both
        # busy (two pipelines on 2 cores: +5-8% images/s at depth 4 over DALI's default 2);
        # at most 8 queued batches in all (1 each from 8 pipelines on) bound their memory.
        return 2 if self.opts.cuda else max(1, min(4, 8 // pipelines))

    def _build_pipelines(self, order: list[int], batches: int) -> list:
        """Built pipelines that together yield the first ``batches`` batches of ``order``:
        pipeline ``p`` reads batches ``p, p + n, p + 2n, ...`` (``n`` pipelines)."""
        batch = self.plan.batch_size
        n = self._num_pipelines(batches)
        chunks = [order[i * batch:(i + 1) * batch] for i in range(batches)]
        pipes = [self._pipeline([i for chunk in chunks[p::n] for i in chunk], p, n)
                 for p in range(n)]
        for pipe in pipes:  # fork the external-source workers before any pipeline has threads
            if self.py_workers > 0:
                pipe.start_py_workers()
        for pipe in pipes:
            pipe.build()
        return pipes

    def _pipeline(self, order: list[int], index: int, pipelines: int):
        """Pipeline ``index`` of ``pipelines`` over exactly ``order``, not yet built."""
        from nvidia.dali import pipeline_def

        parallel, parallel_kw = self.py_workers > 0, {}
        if parallel:
            # fork is fast and safe before CUDA is initialised in this process; after that
            # only spawn is safe (workers then pay for importing torch at every pass).
            parallel_kw = {"py_num_workers": math.ceil(self.py_workers / pipelines),
                           "py_start_method": "spawn" if torch.cuda.is_initialized() else "fork"}

        @pipeline_def
        def graph():
            encoded, labels = self.make_source(order, parallel)
            if self.opts.cuda:  # copied with the images, not a blocking pageable copy
                labels = labels.gpu()
            return (*_augment(encoded, self.opts), labels)

        epoch = self.epoch if self.plan.train else 0
        device_id = (self.device.index if self.device.index is not None
                     else torch.cuda.current_device()) if self.opts.cuda else None
        seed = (_mix_seed(self.seed, epoch, self.plan.rank) + index) % 2**31
        return graph(batch_size=self.plan.batch_size,
                     num_threads=max(1, self.num_threads // pipelines),
                     device_id=device_id, seed=seed,
                     prefetch_queue_depth=self._queue_depth(pipelines), **parallel_kw)

    def _to_torch(self, outputs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.opts.cuda:
            return _finish_on_cpu(outputs, self.opts)
        images, labels = (_gpu_to_torch(out, self.device) for out in outputs)
        if self.opts.dtype == torch.bfloat16:  # DALI has no bfloat16 output: convert on the GPU
            images = images.to(torch.bfloat16)
        if self.opts.channels_last:
            images = images.permute(0, 3, 1, 2)  # NHWC storage viewed as channels-last NCHW
        return images, labels.reshape(-1).to(torch.int64)


def _gpu_to_torch(tensor_list, device: torch.device) -> torch.Tensor:
    """Copy a dense DALI ``TensorListGPU`` into a new torch tensor on ``device``, queued on
    torch's current stream (so the host does not wait, and torch's next kernels do)."""
    from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

    tensor = tensor_list.as_tensor()
    out = torch.empty(tensor.shape(), dtype=to_torch_type[tensor.dtype], device=device)
    feed_ndarray(tensor, out, cuda_stream=torch.cuda.current_stream(device))
    return out


def _message_lines(exc: Exception) -> list[str]:
    """The lines of a DALI error that say something (no blanks, no "Current pipeline ...")."""
    return [line.strip() for line in str(exc).splitlines()
            if line.strip() and not line.startswith("Current pipeline")]


def _cuda_failure(exc: Exception) -> str | None:
    """One line for a DALI error that names a CUDA / driver failure: the message from the last
    line naming one on ("Error in thread 0: CUDA runtime API error cudaErrorInvalidValue (1):
    invalid argument"); None if no line names one (a damaged file, say)."""
    lines = _message_lines(exc)
    hits = [i for i, line in enumerate(lines) if _CUDA_FAILURE.search(line)]
    return " ".join(lines[hits[-1]:]) if hits else None


def _graph_options(args, dist: DistInfo, train: bool) -> GraphOptions:
    """The split's graph options from the parsed flags; ``--dali-hw-decoder-load`` unset ->
    :func:`default_hw_decoder_load`. Raises :class:`DataError` for a load outside [0, 1]."""
    cuda = dist.device.type == "cuda"
    load = args.dali_hw_decoder_load
    if load is None:
        load = default_hw_decoder_load(dist.device)
    elif not 0 <= load <= 1:
        raise DataError(f"--dali-hw-decoder-load {load}: must be between 0 and 1")
    return GraphOptions(
        train=train, crop_size=args.train_crop_size if train else args.val_crop_size,
        resize_size=args.val_resize_size, cuda=cuda, decode_on_cpu=not cuda or args.dali_cpu,
        hw_decoder_load=load, dtype=input_dtype(args.amp, args.amp_dtype, dist.device),
        channels_last=bool(args.channels_last))


def _open_split(path: str, use_lmdb: bool, batch_size: int):
    """``(num_samples, classes, make_source, read_encoded, describe)`` for one split; raises
    :class:`DataError`.

    ``make_source(order, parallel)`` adds the source of ``(encoded, label)`` to a DALI graph;
    ``read_encoded(index)`` returns a sample's encoded bytes, ``describe(index)`` its name.
    """
    if use_lmdb:
        from .lmdb_records import LMDBDataset

        dataset = LMDBDataset(path)
        return (len(dataset), dataset.classes, partial(_lmdb_source, dataset, batch_size),
                lambda i: dataset.read(i)[0], dataset.name_of)
    from .folder import open_image_folder

    folder = open_image_folder(path)  # ImageFolder: its classes and labels by construction
    return (len(folder.samples), folder.classes, partial(_folder_source, folder.samples),
            lambda i: read_file(folder.samples[i][0]), folder.name_of)


def build_loaders(args, dist: DistInfo):
    """``(train, val)`` :class:`DALILoader` s over JPEG folders, or LMDBs with ``--lmdb``.

    Threads: ``args.workers`` DALI CPU threads (at least 1; CPU-only, as many single-threaded
    pipelines); with ``--lmdb`` also as many parallel external-source worker processes in all
    (0: records are read in the main process).
    Raises :class:`DataError` if DALI is not installed (or, on CUDA, built for another CUDA
    major than torch), for bad input paths, mismatched class lists, or a training shard smaller
    than one batch.
    """
    _require_dali(dist.device)
    built, classes_by_split = [], []
    for train, path in zip((True, False), split_paths(args)):
        num_samples, classes, make_source, read_encoded, describe = _open_split(
            path, bool(args.lmdb), args.batch_size)
        plan = Plan(num_samples, args.batch_size, train, seed=args.seed, rank=dist.rank,
                    world_size=dist.world_size,
                    max_batches=args.train_batches if train else args.val_batches)
        if train and num_samples // dist.world_size < args.batch_size:
            raise DataError(
                f"training set has {num_samples // dist.world_size} images per process, fewer "
                f"than one batch of {args.batch_size}: lower -b/--batch-size")
        built.append(DALILoader(plan, make_source, _graph_options(args, dist, train), classes,
                                dist.device, num_threads=args.workers,
                                py_workers=args.workers if args.lmdb else 0, seed=args.seed,
                                read_encoded=read_encoded, describe=describe,
                                max_bad_share=args.max_bad_share))
        classes_by_split.append(classes)
    check_same_classes(*classes_by_split)
    return built[0], built[1]
