"""CPU normalisation: one fused pass per image equals (x - mean) / std over the batch."""
import pytest
import torch

from loaders.transforms.normalize import (BatchMemory, float_batch, imagenet_mean_std, normalize,
                                          normalize_each)


def reference(images):
    mean, std = imagenet_mean_std()
    return (images.float() - mean) / std


@pytest.mark.parametrize("channels_last", [False, True])
def test_normalize_matches_the_quotient_in_both_memory_formats(channels_last):
    images = torch.randint(0, 256, (5, 3, 7, 9), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(0))
    out = normalize(images, *imagenet_mean_std(), channels_last)
    assert out.dtype == torch.float32 and out.shape == images.shape
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert out.is_contiguous(memory_format=fmt)
    torch.testing.assert_close(out, reference(images), rtol=0, atol=1e-5)


def test_normalize_each_takes_a_generator_of_strided_views():
    # resize() hands over channels-last views, flipped crops are new tensors: both must work.
    hwc = torch.randint(0, 256, (4, 6, 8, 3), dtype=torch.uint8,
                        generator=torch.Generator().manual_seed(1))
    images = hwc.permute(0, 3, 1, 2)
    out = float_batch(images.shape, torch.device("cpu"))
    result = normalize_each((image.flip(-1) if i % 2 else image for i, image in enumerate(images)),
                            out, *imagenet_mean_std())
    assert result is out
    expected = reference(torch.stack([im.flip(-1) if i % 2 else im for i, im in enumerate(images)]))
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)


def test_normalize_each_refuses_a_count_mismatch():
    out = float_batch((3, 3, 2, 2), torch.device("cpu"))
    with pytest.raises(ValueError, match="2 images for a batch of 3"):
        normalize_each(iter(torch.zeros(2, 3, 2, 2, dtype=torch.uint8)), out, *imagenet_mean_std())
    with pytest.raises(ValueError, match="more images than the batch of 3"):
        normalize_each(torch.zeros(4, 3, 2, 2, dtype=torch.uint8), out, *imagenet_mean_std())


def test_batch_memory_reuses_a_buffer_only_once_no_tensor_holds_it():
    memory = BatchMemory(keep=2)
    first = memory.empty((4, 3, 5, 6))
    address = first.data_ptr()
    view = first[1:3]  # a view alone keeps the memory in use
    del first
    second = memory.empty((4, 3, 5, 6))
    assert second.data_ptr() != address
    del view
    third = memory.empty((2, 3, 5, 6))  # a smaller batch fits in the freed buffer
    assert third.data_ptr() == address and third.shape == (2, 3, 5, 6)
    # both kept buffers in use: new memory, not kept
    extra = memory.empty((4, 3, 5, 6))
    assert extra.data_ptr() not in (address, second.data_ptr())
    assert len(memory._buffers) == 2
    memory.clear()
    assert memory.empty((4, 3, 5, 6)).data_ptr() != address


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_memory_gives_the_layout_and_dtype_asked(channels_last, dtype):
    out = BatchMemory().empty((3, 3, 4, 5), channels_last, dtype)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert out.shape == (3, 3, 4, 5) and out.dtype == dtype
    assert out.is_contiguous(memory_format=fmt)


def test_normalize_into_batch_memory_keeps_every_held_batch():
    # A consumer keeping every batch: none is overwritten by a later one, pixels as new memory's.
    memory, mean_std = BatchMemory(keep=2), imagenet_mean_std()
    generator = torch.Generator().manual_seed(2)
    inputs = [torch.randint(0, 256, (3, 3, 4, 4), dtype=torch.uint8, generator=generator)
              for _ in range(5)]
    held = [normalize(images, *mean_std, True, memory) for images in inputs]
    for images, out in zip(inputs, held):
        assert torch.equal(out, normalize(images, *mean_std, True))
