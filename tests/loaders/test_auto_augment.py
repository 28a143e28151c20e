"""``--auto-augment`` on uint8 crops (loaders.transforms.auto_augment, loaders.transforms._uint8_ops): the same draws
and the same pixels as torchvision's own ``transforms.v2`` policies on the same crops, every op
alone too; the policy in the workers pipeline, a function of (seed, epoch, rank, batch) whatever
``-j``; ``--interpolation`` in the resizes."""
from __future__ import annotations

import glob
import os

import pytest
import torch
from torchvision.transforms import v2

from loaders import DistInfo, build_loaders
from loaders.transforms._uint8_ops import OPS
from loaders.transforms.auto_augment import POLICIES, make_auto_augment
from loaders.transforms import TrainTransform, ValTransform
from tests.helpers.loading import loader_settings
from tests.helpers.standin import write_twins

BILINEAR = v2.InterpolationMode.BILINEAR


@pytest.fixture(scope="module")
def crops(sample_images):
    """RandomResizedCrop + flip outputs (uint8, 176 px, one channels-last) of the sample's
    JPEGs."""
    files = sorted(glob.glob(os.path.join(sample_images, "train", "*", "*")))[:24]
    torch.manual_seed(0)
    transform = TrainTransform(176)
    out = [transform(open(f, "rb").read()) for f in files]
    out[0] = out[0].unsqueeze(0).contiguous(memory_format=torch.channels_last)[0]
    return out


def _torchvision(policy: str, interpolation=BILINEAR):
    if policy == "ta_wide":
        return v2.TrivialAugmentWide(interpolation=interpolation)
    if policy == "ra":
        return v2.RandAugment(interpolation=interpolation, magnitude=9)
    if policy == "augmix":
        return v2.AugMix(interpolation=interpolation, severity=3)
    return v2.AutoAugment(v2.AutoAugmentPolicy(policy), interpolation=interpolation)


@pytest.mark.parametrize("policy", POLICIES)
def test_policy_draws_and_pixels_are_torchvisions(crops, policy):
    ours, theirs = make_auto_augment(policy), _torchvision(policy)
    for seed in range(120):
        crop = crops[seed % len(crops)]
        torch.manual_seed(seed)
        got, after = ours(crop), torch.rand(())
        torch.manual_seed(seed)
        want, after_theirs = theirs(crop), torch.rand(())
        assert torch.equal(got, want), (policy, seed)
        assert after == after_theirs  # the same number of draws
        assert got.dtype == torch.uint8 and got.shape == crop.shape


MAGNITUDES = {"ShearX": (-0.99, 0.033, 0.3), "ShearY": (-0.5, 0.99), "TranslateX": (-32, 7.9),
              "TranslateY": (-20.0, 31), "Rotate": (-135, -90, 4.5, 90, 180, 30),
              "Posterize": (0, 2, 5, 8), "Solarize": (0.0, 0.1333333, 0.5, 1.0),
              "Brightness": (-0.99, 0.5), "Color": (-0.9, 0.6), "Contrast": (-0.5, 0.99),
              "Sharpness": (-0.99, 0.9)}


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("interpolation", ["bilinear", "nearest"])
def test_each_op_is_torchvisions_kernel(crops, op, interpolation):
    reference = v2.TrivialAugmentWide()
    mode = v2.InterpolationMode(interpolation)
    for magnitude in MAGNITUDES.get(op, (0.0,)):
        for crop in crops[:8]:
            want = reference._apply_image_or_video_transform(crop, op, magnitude, mode,
                                                             reference._fill)
            assert torch.equal(OPS[op](crop, magnitude, interpolation), want), (op, magnitude)


def test_bmm_grid_fallback_gives_the_same_pixels(crops, monkeypatch):
    import loaders.transforms._uint8_ops as ops

    fast = [ops.shear_x(c, 0.4, "bilinear") for c in crops[:4]]
    ops._separable_is_exact.cache_clear()
    monkeypatch.setenv("IMAGENET_AUGMENT_BMM_GRID", "1")
    try:
        assert not ops._separable_is_exact()
        assert all(torch.equal(ops.shear_x(c, 0.4, "bilinear"), f)
                   for c, f in zip(crops[:4], fast))
    finally:
        ops._separable_is_exact.cache_clear()


def test_bicubic_geometry_stays_in_range(crops):
    """Bicubic resampling overshoots at hard edges (its kernel has negative lobes): on a
    checkerboard of 0 and 255 the values beyond 0..255 must be clamped, not wrapped to the other
    end of uint8, so every pixel stays near the bilinear one (bilinear never overshoots)."""
    board = torch.zeros(3, 64, 64, dtype=torch.uint8)
    for i in range(8):
        for j in range(i % 2, 8, 2):
            board[:, i * 8:(i + 1) * 8, j * 8:(j + 1) * 8] = 255
    for op, magnitude in (("Rotate", 30.0), ("ShearX", 0.3), ("ShearY", -0.3)):
        bicubic, bilinear = (OPS[op](board, magnitude, mode) for mode in ("bicubic", "bilinear"))
        assert bicubic.dtype == torch.uint8 and bicubic.shape == board.shape
        assert (bicubic.int() - bilinear.int()).abs().max() < 64, op  # a wrap is ~255 off
        assert int(bicubic.max()) == 255 and int(bicubic.min()) == 0, op
    policy = make_auto_augment("ta_wide", "bicubic")
    torch.manual_seed(3)
    for crop in crops:
        assert policy(crop).shape == crop.shape


def test_bad_policy_values_raise():
    with pytest.raises(ValueError, match="--auto-augment"):
        make_auto_augment("fancy")
    with pytest.raises(ValueError, match="magnitude"):
        make_auto_augment("ra", ra_magnitude=31)
    assert make_auto_augment(None) is None


def test_interpolation_reaches_every_resize(sample_images):
    """bicubic and nearest crops differ from bilinear ones, drawn alike; validation too."""
    data = open(sorted(glob.glob(os.path.join(sample_images, "train", "*", "*")))[0], "rb").read()
    crops = {}
    for mode in ("bilinear", "bicubic", "nearest"):
        torch.manual_seed(7)
        crops[mode] = (TrainTransform(64, interpolation=mode)(data),
                       ValTransform(72, 64, mode)(data))
    for mode in ("bicubic", "nearest"):
        for got, base in zip(crops[mode], crops["bilinear"]):
            assert got.shape == base.shape == (3, 64, 64) and not torch.equal(got, base)
            assert (got.float() - base.float()).abs().mean() < 12  # the same window


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """16 copies of one picture: batches differ only in their draws."""
    return write_twins(str(tmp_path_factory.mktemp("twins")))


def _batches(data, workers, policy="ta_wide", seed=0, epoch=2, rank=0, world=1):
    settings = loader_settings("folder", data, batch_size=4, workers=workers, train_batches=2,
                               auto_augment=policy, seed=seed)
    train, _ = build_loaders(settings, DistInfo(rank, world))
    try:
        train.set_epoch(epoch)
        return [images for images, _ in train]
    finally:
        train.close()


def test_workers_augment_as_a_function_of_seed_epoch_rank_batch(twins):
    """-j 0 and -j 2 give the same augmented batches; another seed, epoch, rank or batch
    number draws others (every batch holds the same picture: only the draws differ); without
    the policy they differ too."""
    none, two = _batches(twins, 0), _batches(twins, 2)
    assert len(none) == len(two) == 2
    assert all(torch.equal(a, b) for a, b in zip(none, two))
    assert not torch.equal(none[0], none[1])  # the batch number
    for other in (_batches(twins, 0, seed=1), _batches(twins, 0, epoch=3),
                  _batches(twins, 0, rank=1, world=2)):
        assert len(other) == 2 and not any(torch.equal(a, b) for a, b in zip(none, other))
    plain = _batches(twins, 0, policy=None)
    assert not any(torch.equal(a, b) for a, b in zip(none, plain))


@pytest.mark.parametrize("name,theirs", [("RA_SPACE", v2.RandAugment), ("AA_SPACE", v2.AutoAugment),
                                         ("TA_WIDE_SPACE", v2.TrivialAugmentWide),
                                         ("AUGMIX_SPACE", v2.AugMix)])
def test_magnitude_tables_are_torchvisions_bit_for_bit(name, theirs):
    """Our tables (torchvision keeps its own private): the same ops in the same order (the
    uniform op pick draws an index into it), signs, dtypes and values at any size and bin count."""
    import loaders.transforms.auto_augment as auto_augment

    ours, reference = getattr(auto_augment, name), theirs._AUGMENTATION_SPACE
    assert list(ours) == list(reference)
    for op, (magnitudes, signed) in reference.items():
        assert ours[op][1] == signed, op
        for bins in (10, 11, 31):
            for height, width in ((176, 160), (224, 224), (331, 500)):
                got, want = ours[op][0](bins, height, width), magnitudes(bins, height, width)
                assert (got is None) == (want is None), op
                if want is not None:
                    assert got.dtype == want.dtype and torch.equal(got, want), (op, bins)
