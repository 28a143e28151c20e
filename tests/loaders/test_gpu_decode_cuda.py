"""The batch-decode pipeline on a CUDA GPU (``--decode-device cuda``; skipped without one,
``make gpu-check`` runs it): windows decoded into GPU memory by nvImageCodec, the loader
contract there (CUDA images of the autocast dtype, channels-last, labels that match the
pixels), every reader, and pixels within a few levels of the CPU loaders' on the real sample."""
import numpy as np
import pytest
import torch

import loaders
from decode import decode, gpu, resize
from loaders import DistInfo
from tests.helpers.loading import loader_settings, to_uint8
from tools.datagen import label_from_pixels

pytestmark = pytest.mark.gpu

# nvJPEG's IDCT and chroma upsampling against libjpeg-turbo's, then the float resize
GPU_MEAN_BOUND = 1.0


def _device():
    return torch.device("cuda", 0)


def test_windows_are_decoded_into_gpu_memory(sample):
    import glob
    import os

    paths = sorted(glob.glob(os.path.join(sample, "train", "*", "*")))[:16]
    datas = [open(p, "rb").read() for p in paths]
    regions = []
    for data in datas:
        h, w = decode(data).shape[-2:]
        regions.append((h // 4, w // 4, h // 2, w // 2))
    decoder = gpu.WindowDecoder("cuda", _device())
    out = decoder.decode(datas, regions, (64, 64), torch.cuda.current_stream().cuda_stream)
    assert out.images.is_cuda and not out.fallback and not out.failed
    assert decoder.on_device == len(datas)
    for data, (t, l, h, w), image in zip(datas, regions, out.images):
        cpu = resize(decode(data)[:, t:t + h, l:l + w], (64, 64), dtype=torch.float32)
        assert float((image.cpu() - cpu).abs().mean()) <= GPU_MEAN_BOUND


@pytest.mark.parametrize("source", ["folder", "lmdb", "shards"])
@pytest.mark.parametrize("amp, channels_last", [(False, False), (True, True)])
def test_contract_on_cuda(tiny, tiny_shards, source, amp, channels_last):
    data = {"folder": tiny.root, "lmdb": tiny.lmdb, "shards": tiny_shards}[source]
    dtype = loaders.input_dtype(amp, "float16", _device())
    settings = loader_settings(source, data=data, lmdb=source == "lmdb",
                               shards=source == "shards", workers=2, decode_device="cuda",
                               dtype=dtype, channels_last=channels_last)
    train, val = loaders.build_loaders(settings, DistInfo(device=_device()))
    for loader in (train, val):
        for images, labels in loader:
            assert images.is_cuda and labels.is_cuda and images.dtype == dtype
            assert images.is_contiguous(memory_format=torch.channels_last) == channels_last
            pixels = to_uint8(images.float().cpu())
            assert [label_from_pixels(p, tiny.num_classes) for p in pixels] == \
                labels.cpu().tolist()
        loader.close()


def test_pixels_near_the_cpu_loaders(sample):
    sizes = dict(batch_size=25, workers=2, train_crop_size=224, val_resize_size=256,
                 val_crop_size=224)
    runs = {}
    for device, where in (("cpu", torch.device("cpu")), ("cuda", _device())):
        train, val = loaders.build_loaders(
            loader_settings("folder", data=sample, decode_device=device, **sizes),
            DistInfo(device=where))
        runs[device] = [to_uint8(images.cpu()) for images, _ in train]
        train.close()
        val.close()
    diff = np.concatenate([np.abs(a.astype(np.int16) - b.astype(np.int16))
                           for a, b in zip(runs["cpu"], runs["cuda"], strict=True)])
    assert diff.mean() <= 0.1 + GPU_MEAN_BOUND, (diff.mean(), diff.max())


def test_probe_chooses_nvimgcodec_and_host_copies_do_not_block():
    """With nvJPEG installed the start-up probe picks nvImageCodec on the GPU; a raw record's
    window and a batch's flip indices go to the device from page-locked memory without a
    synchronising copy (torch's sync debug mode raises on one)."""
    from decode import raw

    assert gpu.probe_cuda(_device()).library == "nvimgcodec"
    image = torch.randint(0, 256, (3, 40, 60), dtype=torch.uint8)
    record = raw.encode_raw(image)
    decoder = gpu.WindowDecoder("cuda", _device())
    flips = torch.tensor([True, False, True]).nonzero().flatten()
    torch.cuda.set_sync_debug_mode("error")
    try:
        window = decoder._raw(record, (4, 6, 20, 30))
        where = gpu.to_device(flips, _device())
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(window.cpu(), image[:, 4:24, 6:36])
    assert where.cpu().tolist() == [0, 2]
