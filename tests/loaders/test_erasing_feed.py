"""``--random-erase`` in each pipeline's device feed (``loaders.orders.positions.PositionedLoader``
erases): every training batch a pipeline yields is its unerased batch erased by ``RandomErasing``
with the draws of (seed, epoch, rank, batch), a resumed epoch's batches numbered from its start; on
a GPU (``gpu`` tests) the side stream's erasing equals the CPU's erasing of the same batch."""
import dataclasses

import pytest
import torch

import loaders
from loaders import DistInfo
from loaders.transforms.erasing import RandomErasing
from tests.helpers.loading import loader_settings

CPU_CASES = [("folder", "cpu", 0), ("folder", "cpu", 2), ("synthetic", "cpu", 0)]
try:
    import nvidia.nvimgcodec  # noqa: F401
    CPU_CASES.append(("folder", "cpu-nvimgcodec", 1))
except ImportError:
    pass
try:
    import nvidia.dali  # noqa: F401
    CPU_CASES.append(("dali", "cpu", 1))
except ImportError:
    pass

SEED, EPOCH, START = 3, 2, 1


def _batches(settings, device, erase: float):
    """The training batches of epoch :data:`EPOCH` from batch :data:`START`, on the CPU."""
    settings = dataclasses.replace(settings, random_erase=erase)
    train, val = loaders.build_loaders(settings, DistInfo(device=device))
    try:
        train.set_epoch(EPOCH, start_batch=START)
        return [(images.float().cpu(), labels.cpu()) for images, labels in train]
    finally:
        loaders.close_all(train, val)


def check_erased_in_feed(settings, device) -> None:
    plain = _batches(settings, device, 0.0)
    erased = _batches(settings, device, 1.0)
    erasing = RandomErasing(1.0, settings.seed, rank=0)
    assert len(plain) == len(erased) >= 2
    for k, ((images, labels), (got, got_labels)) in enumerate(zip(plain, erased)):
        assert torch.equal(labels, got_labels)
        assert torch.equal(got, erasing(images.clone(), EPOCH, START + k))
        assert not torch.equal(got, images)  # p = 1 erases a box of every image


@pytest.mark.parametrize("backend, decode_device, workers", CPU_CASES)
def test_each_pipeline_erases_its_batches_in_the_feed(tiny, backend, decode_device, workers):
    settings = loader_settings(backend, data=None if backend == "synthetic" else tiny.root,
                               workers=workers, seed=SEED, decode_device=decode_device,
                               train_batches=4)
    check_erased_in_feed(settings, torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("decode_device", ["cpu", "cuda"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_the_side_streams_erasing_is_the_cpus(tiny, decode_device, channels_last):
    """Workers' CudaFeeder and the GPU batch decoder erase on their side streams: the batch that
    reaches the step equals the CPU's erasing of the same unerased batch, bit for bit."""
    settings = loader_settings("folder", data=tiny.root, workers=2, seed=SEED,
                               decode_device=decode_device, channels_last=channels_last,
                               train_batches=4)
    check_erased_in_feed(settings, torch.device("cuda", 0))
