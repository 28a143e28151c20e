"""CPU normalisation: one fused pass per image equals (x - mean) / std over the batch."""
import pytest
import torch

from loaders.transforms.normalize import float_batch, imagenet_mean_std, normalize, normalize_each


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
