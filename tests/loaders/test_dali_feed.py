"""What DALI is fed (``loaders/pipelines/dali/feed.py``) and what it checks first on a GPU:
the host windows are the CPU loaders', the feed reads in a thread of its own in the order DALI
asks, and the probe that nvJPEG decodes on the GPU says why not where it would not."""
import os

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("nvidia.dali")

from loaders import DataError  # noqa: E402


def test_host_windows_are_the_cpu_loaders(tiny, sample_images):
    """The windows the feed hands DALI are the ones ``random_resized_crop_params`` (torchvision's
    algorithm: 10 attempts, then the central crop) gives for the same uniforms and the size PIL
    reads (independently of the acceptance rule's header parse, whose frames the feed takes): on
    the sample's and ``tiny``'s; every fourth image gets uniforms near 1 for every attempt (the
    whole area at ratio 4/3 fits no image but an exactly 4:3 one), so the central fallback is
    exercised."""
    import glob

    from decode.acceptance import check
    from loaders.pipelines.dali.feed import crop_draws, host_windows
    from loaders.transforms import RRC_RATIO, RRC_SCALE, random_resized_crop_params

    paths = sorted(glob.glob(os.path.join(sample_images, "train", "*", "*")))[:48]
    paths += sorted(glob.glob(os.path.join(tiny.root, "train", "*", "*")))[:16]
    blobs = [open(p, "rb").read() for p in paths]
    draws, _ = crop_draws(seed=3, epoch=1, rank=0, batch=0, count=len(blobs))
    draws[::4] = 1.0 - 1e-12
    sizes = [Image.open(p).size for p in paths]
    expected = []
    for (width, height), uniforms in zip(sizes, draws):
        top, left, h, w = random_resized_crop_params(height, width, RRC_SCALE, RRC_RATIO,
                                                     list(uniforms))
        expected.append((left, top, w, h))
    anchors, shapes = host_windows([check(blob) for blob in blobs], draws)
    assert anchors.dtype == shapes.dtype == np.float32 and anchors.shape == (len(blobs), 2)
    assert [(*map(int, a), *map(int, s)) for a, s in zip(anchors, shapes)] == expected
    assert sum(w == width and h == height for (_, _, w, h), (width, height)
               in zip(expected, sizes)) > 0  # some fallbacks were the whole image


def test_the_feed_reads_off_the_training_thread_in_order(tiny):
    """A feed prepares its batches in a thread of its own, ahead of DALI, in the order DALI asks
    for them (pipeline p of n: batches p, p + n, ...); past the end it says StopIteration every
    time DALI asks; a read error reaches the caller as raised."""
    import threading
    from types import SimpleNamespace

    from loaders.pipelines.dali.feed import BatchFeed, FeedPass

    threads = []

    def read(index):
        threads.append(threading.current_thread())
        if index == 99:
            raise DataError("record 99: gone")
        return bytes([255, 216, 255, index]), index % 4, None

    opts = SimpleNamespace(train=False, cuda=False, augment=None)  # a GraphOptions' fields
    feed = BatchFeed(read, opts, batch_size=2, seed=0, rank=0)
    feed.start(FeedPass(tuple(range(10)), 0, 0, 32, 1, 2))  # batches 1, 3
    got = [feed(SimpleNamespace(iteration=k)) for k in range(2)]
    assert [list(batch[1]) for batch in got] == [[2, 3], [2, 3]]  # indices 2, 3 and 6, 7
    assert [bytes(a)[3] for a in got[1][0]] == [6, 7]
    for k in (2, 3):
        with pytest.raises(StopIteration):
            feed(SimpleNamespace(iteration=k))
    assert threads and threading.main_thread() not in threads
    feed.start(FeedPass((0, 99), 0, 0, 32, 0, 1))
    with pytest.raises(DataError, match="record 99: gone"):
        feed(SimpleNamespace(iteration=0))
    feed.close()


def test_the_gpu_feed_carries_the_auto_augment_draws(tiny):
    """With ``--auto-augment`` on the GPU graph, each training batch also carries the policy's
    draws: int32 ``(N, slots, 3)``, those ``DaliAugment.host_draws`` gives for the batch's
    (seed, epoch, rank, batch), after the output sides; the CPU graph (no sizes) none."""
    import glob
    from types import SimpleNamespace

    from decode.acceptance import check
    from loaders.pipelines.dali.augment import DaliAugment
    from loaders.pipelines.dali.feed import BatchFeed, FeedPass

    paths = sorted(glob.glob(os.path.join(tiny.root, "train", "*", "*")))[:6]
    blobs = [open(p, "rb").read() for p in paths]
    policy = DaliAugment("ra")
    gpu = SimpleNamespace(train=True, cuda=True, augment=policy)  # a GraphOptions' fields
    feed = BatchFeed(lambda i: (blobs[i], i % 2, check(blobs[i])), gpu, batch_size=3, seed=5,
                     rank=1)
    feed.start(FeedPass(tuple(range(6)), 2, 7, 32, 1, 1))  # batch 1 of the pass = 8 of epoch 2
    batch = feed(SimpleNamespace(iteration=0))
    feed.close()
    assert len(batch) == 7 and batch[6].dtype == np.int32 and batch[6].shape == (3, 2, 3)
    assert np.array_equal(batch[6], np.stack(policy.host_draws(5, 2, 1, 8, 3)))
    cpu = BatchFeed(lambda i: (blobs[i], 0, None), SimpleNamespace(train=True, cuda=False,
                                                             augment=policy),
                    batch_size=3, seed=5, rank=1)
    assert cpu.augment is None


def test_gpu_decoding_probe_says_why_it_would_not_happen(monkeypatch):
    """Before a CUDA run, the loader asks nvImageCodec (DALI's decoding library) to decode a
    probe JPEG with its GPU backends only: on this machine (no GPU) it says why not, in one
    line; an install whose GPU backends hand back host memory, or nothing, is caught too."""
    from types import SimpleNamespace

    from loaders.pipelines.dali import gpu_decoding_problem

    cuda = torch.device("cuda", 0)
    reason = gpu_decoding_problem(cuda)
    assert reason and "\n" not in reason
    kinds = SimpleNamespace(STRIDED_DEVICE="device", STRIDED_HOST="host")

    def library(result):
        class Decoder:
            def __init__(self, device_id, backends):
                assert device_id == 0 and len(backends) == 2

            def decode(self, data):
                assert data[:3] == b"\xff\xd8\xff"
                return result

        return SimpleNamespace(Decoder=Decoder, Backend=lambda kind: kind, ImageBufferKind=kinds,
                               BackendKind=SimpleNamespace(GPU_ONLY=1, HW_GPU_ONLY=2))

    assert gpu_decoding_problem(cuda, library(SimpleNamespace(buffer_kind="device"))) is None
    assert "host memory" in gpu_decoding_problem(cuda, library(
        SimpleNamespace(buffer_kind="host")))
    assert "libnvjpeg" in gpu_decoding_problem(cuda, library(None))


def test_crop_draws_take_any_seed_as_the_other_pipelines_do():
    """``--seed`` is any int: a negative one is taken modulo 2**64, as ``batch_seed`` and the
    epoch orders take it (NumPy refuses negative entropy), and a non-negative one unchanged."""
    from loaders.pipelines.dali.feed import crop_draws

    negative, flips = crop_draws(seed=-1, epoch=2, rank=1, batch=3, count=4)
    wrapped, wrapped_flips = crop_draws(seed=2**64 - 1, epoch=2, rank=1, batch=3, count=4)
    assert np.array_equal(negative, wrapped) and np.array_equal(flips, wrapped_flips)
    plain, _ = crop_draws(seed=5, epoch=2, rank=1, batch=3, count=4)
    assert np.array_equal(plain, np.random.default_rng([5, 2, 1, 3]).random((4, plain.shape[1])))
