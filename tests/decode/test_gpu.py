"""decode.gpu's batch window decoder, on nvImageCodec's CPU backend (the GPU backends run the
same code and are checked by ``make gpu-check``): windows equal the CPU loaders' window decode,
declined images decoded on the CPU and counted, undecodable ones reported, torchvision's
path, the status lines."""
import glob
import io
import os
import random

import pytest
import torch

import decode
from decode import gpu, jpeg
from tests.helpers.badcorpus import make_bad_corpus

pytestmark = pytest.mark.skipif(not jpeg.window.available(), reason="nvImageCodec not installed")


def _files(sample, count=24):
    return sorted(glob.glob(os.path.join(sample, "train", "*", "*")))[:count]


def _windows(datas, seed=0):
    rng = random.Random(seed)
    out = []
    for data in datas:
        height, width = decode.image_size(data)
        h, w = rng.randint(1, height), rng.randint(1, width)
        out.append((rng.randint(0, height - h), rng.randint(0, width - w), h, w))
    return out


def test_batch_windows_equal_the_cpu_window_decode(sample):
    datas = [open(f, "rb").read() for f in _files(sample)]
    windows = _windows(datas)
    decoder = gpu.WindowDecoder("cpu-nvimgcodec", torch.device("cpu"))
    out = decoder.decode(datas, windows, (64, 48))
    assert out.images.dtype == torch.uint8 and out.images.shape == (len(datas), 3, 64, 48)
    assert not out.fallback and not out.failed
    for data, window, image in zip(datas, windows, out.images):
        expected = decode.resize(jpeg.window.decode_window(data, *window), (64, 48))
        assert torch.equal(image, expected)


def test_raw_records_are_cut_not_decoded(sample):
    """A batch mixing JPEGs and raw-pixel records (``decode.raw``, a ``--raw-budget`` store,
    RGB and grayscale) as NumPy slices, as the pipeline hands them over: each raw region is
    the CPU path's (``decode.decode_window``) pixel for pixel, each JPEG its window decode's,
    none counted as declined; a
    truncated raw record fails as an unreadable sample."""
    import numpy as np

    from decode import raw

    jpegs = [open(f, "rb").read() for f in _files(sample, 6)]
    records = [raw.encode_raw(decode.decode(d), gray=k == 1) for k, d in enumerate(jpegs[:3])]
    datas = [*jpegs[3:], *records]
    windows = _windows(datas, seed=1)
    decoder = gpu.WindowDecoder("cpu-nvimgcodec", torch.device("cpu"))
    out = decoder.decode([np.frombuffer(d, np.uint8) for d in datas], windows, (40, 56))
    assert not out.fallback and not out.failed
    for data, window, image in zip(datas, windows, out.images):
        expected = (decode.decode_window(data, window, (40, 56)) if raw.is_raw(data)
                    else decode.resize(jpeg.window.decode_window(data, *window), (40, 56)))
        assert torch.equal(image, expected)
    broken = decoder.decode([records[0][:-7]], windows[3:4], (40, 56))
    assert broken.fallback == [0] and [i for i, _ in broken.failed] == [0]


def test_declined_images_are_decoded_on_the_cpu_and_undecodable_ones_reported(tmp_path):
    from decode.acceptance import Refused, check

    def accepted(data):  # what the loaders hand a decoder: never a bomb or a lying header
        try:
            check(data)
        except Refused:
            return False
        return True

    corpus = make_bad_corpus(str(tmp_path))
    paths = sorted(glob.glob(os.path.join(str(tmp_path), "**", "*.*"), recursive=True))
    paths = [p for p in paths if accepted(open(p, "rb").read())]
    datas = [open(p, "rb").read() for p in paths]
    windows = []
    for data in datas:
        size = decode.image_size(data) or (1, 1)
        windows.append((0, 0, *size))
    out = gpu.WindowDecoder("cpu-nvimgcodec", torch.device("cpu")).decode(datas, windows, (16, 16))
    failed = {i for i, _ in out.failed}
    names = {os.path.basename(paths[i]) for i in out.fallback}
    assert {"cmyk.JPEG", "png_inside.JPEG", "text.JPEG", "zero_bytes.JPEG"} <= names
    assert "baseline.JPEG" not in names
    for i, data in enumerate(datas):
        try:
            whole = decode.decode(data)
        except (OSError, RuntimeError, ValueError):
            assert i in failed, paths[i]  # nothing decodes it: the caller's bad-sample rules
            continue
        if i in failed:  # decodes whole, but not to its header's size
            continue
        top, left, h, w = windows[i]
        expected = decode.resize(whole[:, top:top + h, left:left + w], (16, 16))
        if i in out.fallback:  # decoded as the CPU loaders decode it
            assert torch.equal(out.images[i], expected), paths[i]
    assert corpus.classes


def test_torchvision_path_decodes_whole_images_then_the_window(sample):
    datas = [open(f, "rb").read() for f in _files(sample, 6)] + [b"not an image"]
    windows = _windows(datas[:-1]) + [(0, 0, 4, 4)]
    # kind "cuda" without nvImageCodec runs torchvision's decode_jpeg on the given device
    decoder = gpu.WindowDecoder("cuda", torch.device("cpu"), library=None)
    out = decoder.decode(datas, windows, (32, 32))
    assert [i for i, _ in out.failed] == [6] and out.fallback == [6]
    for data, window, image in zip(datas[:-1], windows, out.images):
        top, left, h, w = window
        whole = decode.decode(data)
        expected = decode.resize(whole[:, top:top + h, left:left + w], (32, 32))
        assert (image.int() - expected.int()).abs().max() <= 1
    assert "torchvision" in decoder.status()


def test_torchvision_path_leaves_cmyk_and_non_jpegs_to_the_cpu_rule():
    """Only 1- and 3-component JPEGs go to torchvision's decode_jpeg (nvJPEG on CUDA); a CMYK
    JPEG or a PNG named .JPEG is decoded by the CPU loaders' cascade, as with nvImageCodec."""
    from PIL import Image

    def encoded(image, fmt):
        out = io.BytesIO()
        image.save(out, fmt)
        return out.getvalue()

    rgb = Image.new("RGB", (40, 30), (200, 30, 90))
    datas = [encoded(rgb.convert("CMYK"), "JPEG"), encoded(rgb, "PNG"),
             encoded(rgb, "JPEG"), encoded(rgb.convert("L"), "JPEG")]
    windows = [(2, 3, 20, 24)] * 4
    decoder = gpu.WindowDecoder("cuda", torch.device("cpu"), library=None)
    out = decoder.decode(datas, windows, (16, 16))
    assert out.fallback == [0, 1] and not out.failed
    for data, image in zip(datas, out.images):
        whole = decode.decode(data)[:, 2:22, 3:27]
        expected = decode.resize(whole, (16, 16))
        assert (image.int() - expected.int()).abs().max() <= 1


def test_status_lines_name_the_decoder_and_backend():
    line = gpu.status_line("cpu-nvimgcodec", torch.device("cpu"))
    assert "nvImageCodec" in line and "CPU backend" in line
    cuda = gpu.status_line("cuda", torch.device("cuda:0"), 0.4)
    assert "hardware JPEG decoder" in cuda and "load 0.4" in cuda and "cuda:0" in cuda
    with pytest.raises(ValueError):
        gpu.WindowDecoder("tpu", torch.device("cpu"))
    with pytest.raises(RuntimeError, match="needs nvImageCodec"):
        gpu.WindowDecoder("cpu-nvimgcodec", torch.device("cpu"), library=None)


def test_a_cuda_decoder_that_decodes_into_host_memory_is_named_not_trusted():
    """The start-up probe of ``--decode-device cuda`` (``probe_cuda``): a "cuda" decoder whose
    windows land in host memory (torchvision's decode_jpeg on the CPU here) does not count as
    decoding on the GPU; without a CUDA device neither decoder is chosen and each says why,
    which the run's first line repeats instead of naming nvImageCodec on CUDA."""
    host = gpu.WindowDecoder("cuda", torch.device("cpu"), library=None)
    assert gpu.device_decode_problem(host) == "decoded into host memory, not the GPU's"
    choice = gpu.probe_cuda(torch.device("cpu"))
    assert choice.library is None and len(choice.problems) == 2
    assert gpu.probe_cuda(torch.device("cpu")) is choice  # probed once per process
    line = choice.line(0.65)
    assert line.startswith("batch windows: no GPU decoder decodes on cpu (") and "\n" not in line
    assert "every window on the CPU" in line


def test_nvjpeg_wheel_names_and_non_blocking_copies_keep_values():
    """CUDA 13's nvJPEG wheel is ``nvidia-nvjpeg`` (``-cu13`` is a placeholder); the host-to-
    device helper keeps shape, strides' values and dtype (its page-locked, non-blocking copy
    runs on a GPU: tests/loaders/test_gpu_decode_cuda.py)."""
    assert gpu.nvjpeg_pip_package("13.0") == "nvidia-nvjpeg"
    assert gpu.nvjpeg_pip_package(None) == "nvidia-nvjpeg"
    assert gpu.nvjpeg_pip_package("12.8") == "nvidia-nvjpeg-cu12"
    view = torch.arange(24, dtype=torch.uint8).view(2, 3, 4).permute(1, 0, 2)
    assert torch.equal(gpu.to_device(view, torch.device("cpu")), view)
