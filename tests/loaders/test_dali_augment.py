"""``--auto-augment`` with ``--dali`` (loaders.pipelines.dali.augment): the GPU graph's DALI
operators run here on DALI's CPU backend with host-drawn ops (which ops, identity and invert
exact), the draws a function of (seed, epoch, rank, batch), the one-line refusals, and the
CPU-only loader's torch policy seeded per batch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("nvidia.dali")

import loaders  # noqa: E402
from loaders import DataError, DistInfo  # noqa: E402
from loaders.pipelines.dali.augment import DaliAugment  # noqa: E402
from tests.helpers.loading import check_set_epoch_reproducible, loader_settings  # noqa: E402

POLICIES = ("ta_wide", "ra", "imagenet", "cifar10", "svhn")


def _run(spec: DaliAugment, images: list, draws: list) -> list:
    """``spec.graph`` over ``images`` (uint8 HWC) on DALI's CPU backend."""
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=len(images), num_threads=1, device_id=None,
                  enable_conditionals=True)
    def graph():
        data = fn.external_source(source=lambda: images, batch=True, layout="HWC")
        return spec.graph(data, fn.external_source(source=lambda: draws, batch=True))

    pipe = graph()
    pipe.build()
    (out,) = pipe.run()
    return [np.array(out[i]) for i in range(len(images))]


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policys_dali_ops_run_on_the_cpu_backend(policy):
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (48, 48, 3), dtype=np.uint8) for _ in range(12)]
    spec = DaliAugment(policy)
    for batch in range(3):
        out = _run(spec, images, spec.host_draws(5, 1, 0, batch, len(images)))
        assert all(o.shape == (48, 48, 3) and o.dtype == np.uint8 for o in out)


def test_selected_ops_are_applied():
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(4)]
    spec = DaliAugment("imagenet")
    invert = spec.names.index("Invert")
    identity = [np.zeros((2, 3), np.int32)] * 4
    inverted = [np.array([[invert, 0, 0], [0, 0, 0]], np.int32)] * 4
    assert all(np.array_equal(o, i) for o, i in zip(_run(spec, images, identity), images))
    assert all(np.array_equal(o, 255 - i) for o, i in zip(_run(spec, images, inverted), images))


def test_host_draws_follow_torchvisions_policy_shape():
    ta, ra = DaliAugment("ta_wide"), DaliAugment("ra", ra_magnitude=7)
    a, b = ta.host_draws(1, 2, 3, 4, 64), ta.host_draws(1, 2, 3, 4, 64)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, ta.host_draws(1, 2, 3, 5, 64)))
    assert {d.shape for d in a} == {(1, 3)} and len(ta.names) == 14
    assert len({int(d[0, 0]) for d in a}) > 8 and max(int(d[0, 1]) for d in a) <= 30
    drawn = ra.host_draws(0, 0, 0, 0, 32)
    assert {d.shape for d in drawn} == {(2, 3)} and {int(d[k, 1]) for d in drawn
                                                       for k in (0, 1)} == {7}
    unsigned = {"Posterize", "Solarize", "AutoContrast", "Equalize", "Identity", "Invert"}
    auto = DaliAugment("imagenet")
    for d in auto.host_draws(0, 0, 0, 0, 200):
        for op, _, negate in d:
            assert not (negate and auto.names[op] in unsigned)


def test_what_dali_cannot_do_is_refused_in_one_line():
    with pytest.raises(DataError, match="DALI has no AugMix"):
        DaliAugment("augmix").check(cuda=True)
    with pytest.raises(DataError, match="--interpolation bicubic"):
        DaliAugment("ta_wide", "bicubic").check(cuda=True)
    DaliAugment("augmix", "bicubic").check(cuda=False)  # CPU-only: torch finishes the crops


def _dali_batches(tiny, policy, epoch=1):
    settings = loader_settings("dali", tiny.root, auto_augment=policy, train_batches=2)
    train, _ = loaders.build_loaders(settings, DistInfo())
    try:
        train.set_epoch(epoch)
        return [images for images, _ in train]
    finally:
        train.close()


def test_cpu_only_dali_augments_as_a_function_of_the_batch(tiny):
    settings = loader_settings("dali", tiny.root, auto_augment="augmix", train_batches=2)
    first = check_set_epoch_reproducible(lambda: loaders.build_loaders(settings,
                                                                        DistInfo())[0])
    plain = _dali_batches(tiny, None, epoch=3)
    assert len(first) == len(plain) == 2
    assert not all(torch.equal(a, b) for (a, _), b in zip(first, plain))
