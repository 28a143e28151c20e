"""torchvision's recipe flags in the engine: random erasing on the device batch
(torchvision's pixels for the same box, a function of seed, epoch, rank and batch), ``--opt``,
``--transformer-embedding-decay``, ``--clip-grad-norm``, ``--sync-bn``, resuming another
optimizer's state, and the flags' one-line errors."""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from torch import nn
from torchvision.transforms.v2 import functional as F

import loaders
import main
from engine import ConfigError
from engine.checkpoint import load_optimizer
from engine.loop import train_step
from engine.recipe.optim import make_optimizer, param_groups
from engine.state import sync_batch_norm
from loaders import DistInfo
from loaders.transforms.erasing import RandomErasing
from tests.helpers.processes import value_in_another_process
from tests.helpers.loading import loader_settings
from tests.helpers.runs import SMALL
from tests.helpers.states import settings_of, state_of


def test_erasing_is_torchvisions_erase_of_the_drawn_box():
    torch.manual_seed(0)
    images = torch.randn(64, 3, 40, 48)
    erasing = RandomErasing(0.5, seed=3, rank=1)
    boxes = erasing.boxes(2, 5, 64, 40, 48)
    got = erasing(images.clone(), 2, 5)
    for image, box, out in zip(images, boxes, got):
        want = image if box is None else F.erase(image, *box, v=torch.zeros(3, 1, 1))
        assert torch.equal(out, want)
    erased = [box for box in boxes if box is not None]
    assert 15 < len(erased) < 50  # p = 0.5 of 64
    for top, left, h, w in erased:
        assert 0.02 * 40 * 48 * 0.5 < h * w < 0.33 * 40 * 48 * 1.5 and h < 40 and w < 48
        assert 0 <= top <= 40 - h and 0 <= left <= 48 - w


def test_erasing_draws_are_a_function_of_seed_epoch_rank_batch():
    boxes = RandomErasing(1.0, seed=7, rank=0).boxes
    # the same in another process: a resumed run, or another rank's view, draws these boxes
    assert value_in_another_process(
        "from loaders.transforms.erasing import RandomErasing",
        "[list(map(int, b)) for b in RandomErasing(1.0, seed=7, rank=0).boxes(1, 2, 8, 32, 32)]"
    ) == [list(map(int, b)) for b in boxes(1, 2, 8, 32, 32)]
    assert boxes(1, 2, 8, 32, 32) != boxes(1, 3, 8, 32, 32) != boxes(2, 2, 8, 32, 32)
    assert RandomErasing(1.0, seed=7, rank=1).boxes(1, 2, 8, 32, 32) != boxes(1, 2, 8, 32, 32)
    assert RandomErasing(0.0, seed=7, rank=0).boxes(1, 2, 8, 32, 32) == [None] * 8


class _Batches:
    """A loader of four batches of ones; ``set_epoch(epoch, start)`` skips ``start``."""

    classes = ["a"]

    def __init__(self):
        self.start = 0

    def set_epoch(self, epoch, start_batch=0):
        self.start = start_batch

    def __len__(self):
        return 4 - self.start

    def __iter__(self):
        for _ in range(len(self)):
            yield torch.ones(4, 3, 16, 16).to(memory_format=torch.channels_last), torch.zeros(4)


def test_erasing_numbers_a_resumed_epochs_batches_alike():
    settings = dataclasses.replace(loader_settings("synthetic", train_crop_size=16),
                                   random_erase=1.0)
    loader, _ = loaders.build_loaders(settings, DistInfo())
    loader.set_epoch(3)
    whole = [images.clone() for images, _ in itertools.islice(loader, 4)]
    loader, _ = loaders.build_loaders(settings, DistInfo())
    loader.set_epoch(3, start_batch=2)
    resumed = [images.clone() for images, _ in itertools.islice(loader, 2)]
    assert all(torch.equal(a, b) for a, b in zip(whole[2:], resumed))
    assert (whole[0] == 0).any() and not torch.equal(whole[0], whole[1])


class _Embedded(nn.Module):
    """Parameter names of torchvision's transformers and a norm layer."""

    def __init__(self):
        super().__init__()
        self.class_token = nn.Parameter(torch.zeros(1, 1, 4))
        self.relative_position_bias_table = nn.Parameter(torch.zeros(9, 2))
        self.pos_embedding = nn.Parameter(torch.zeros(1, 5, 4))  # ViT's: not a torchvision key
        self.proj = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)


def test_embedding_decay_groups_as_torchvisions_set_weight_decay():
    model = _Embedded()
    groups = param_groups(model, 0.05, norm_weight_decay=0.0, bias_weight_decay=0.0,
                          embedding_decay=0.0)
    named = {id(p): n for n, p in model.named_parameters()}
    got = [(sorted(named[id(p)] for p in g["params"]), g["weight_decay"]) for g in groups]
    assert got == [(["pos_embedding", "proj.weight"], 0.05), (["norm.weight"], 0.0),
                   (["norm.bias", "proj.bias"], 0.0), (["class_token"], 0.0),
                   (["relative_position_bias_table"], 0.0)]
    plain = param_groups(model, 0.05)  # one group of all (pytorch/examples)
    assert len(plain) == 7 and all(isinstance(p, nn.Parameter) for p in plain)


@pytest.mark.parametrize("opt, kind, check", [
    ("sgd", torch.optim.SGD, lambda g: not g["nesterov"] and g["momentum"] == 0.9),
    ("sgd_nesterov", torch.optim.SGD, lambda g: g["nesterov"]),
    ("rmsprop", torch.optim.RMSprop, lambda g: g["eps"] == 0.0316 and g["alpha"] == 0.9
     and g["momentum"] == 0.9),
    ("adamw", torch.optim.AdamW, lambda g: g["weight_decay"] == 0.05 and g["betas"] == (0.9, 0.999)),
])
def test_opt_builds_torchvisions_optimizers(opt, kind, check):
    optimizer = make_optimizer(_Embedded(), 0.1, 0.9, 0.05, torch.device("cpu"), opt=opt)
    assert type(optimizer) is kind and check(optimizer.param_groups[0])


def test_another_optimizers_state_is_a_one_line_error():
    model = _Embedded()
    adamw = make_optimizer(model, 0.1, 0.9, 0.05, torch.device("cpu"), opt="adamw")
    sgd = make_optimizer(model, 0.1, 0.9, 0.05, torch.device("cpu"))
    with pytest.raises(ConfigError, match="not SGD's"):
        load_optimizer(sgd, adamw.state_dict())
    with pytest.raises(ConfigError, match=r"not AdamW's \(no amsgrad, betas, eps\)"):
        load_optimizer(adamw, sgd.state_dict())
    load_optimizer(adamw, adamw.state_dict())


def _state(*flags):
    return state_of(settings_of(["--dummy", "-b", "4", "--seed", "0", "-a", "resnet18", *flags]),
                    _Batches())


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def test_clip_grad_norm_clips_before_the_step(monkeypatch):
    state = _state("--clip-grad-norm", "0.01", "--opt", "adamw")
    assert state.clip_grad_norm == 0.01 and isinstance(state.optimizer, torch.optim.AdamW)
    norms = []
    step = state.optimizer.step

    def spy(*args, **kwargs):
        grads = [p.grad for p in state.model.parameters() if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(g) for g in grads]))))
        return step(*args, **kwargs)

    monkeypatch.setattr(state.optimizer, "step", spy)
    train_step(state, torch.randn(4, 3, 32, 32), torch.tensor([0, 0, 0, 0]), 0, 0)
    assert norms and norms[0] <= 0.01 * (1 + 1e-4)
    assert _state().clip_grad_norm is None


def test_sync_bn_is_torchvisions_rule():
    model, said = nn.Sequential(nn.BatchNorm2d(3)), []
    assert sync_batch_norm(model, True, DistInfo(), said.append) is model and said
    with pytest.raises(ConfigError, match="SyncBatchNorm runs on GPUs only"):
        sync_batch_norm(model, True, DistInfo(world_size=2, distributed=True), print)
    assert sync_batch_norm(model, False, DistInfo(distributed=True), print) is model


@pytest.mark.parametrize("flags, message", [
    (["--auto-augment", "ra", "--ra-magnitude", "31"], "--ra-magnitude 31: expected 0-30"),
    (["--auto-augment", "augmix", "--augmix-severity", "0"], "--augmix-severity 0"),
    (["--random-erase", "1.5"], "--random-erase 1.5: expected 0 <= P <= 1"),
    (["--ra-sampler", "--ra-reps", "0"], "--ra-reps 0"),
    (["--clip-grad-norm", "0"], "--clip-grad-norm 0.0: expected F > 0"),
    (["--weights", "NOPE"], "--weights NOPE: not one of resnet18's weights"),
    (["--data-path", "/elsewhere"], "give one"),
])
def test_bad_torchvision_flags_are_one_line(tiny, tmp_path, capsys, flags, message):
    rc = main.cli([tiny.root, *SMALL, "--epochs", "1", "--output-dir", str(tmp_path), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and err[0].startswith("main.py: error:"), err
    assert message in err[0]


def test_torchvision_aliases_parse_to_our_flags():
    args = main.parse_args(["--model", "resnet50", "--test-only", "--data-path", "/d",
                            "--opt", "AdamW", "--auto-augment", "ta_wide"])
    assert (args.arch, args.evaluate, args.data_path, args.opt) == ("resnet50", True, "/d",
                                                                   "adamw")
    assert main.parse_args(["--model-ema"]).arch == "resnet18"  # no longer ambiguous
