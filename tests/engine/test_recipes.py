"""Training recipes: the per-step LR schedules against their closed forms and
torchvision's/FFCV's own schedulers, resuming them mid-epoch, weight decay groups, label
smoothing, MixUp/CutMix labels, the model EMA's math and checkpoint, the FFCV presets, and a
small run with every recipe flag."""
import math
import os

import numpy as np
import pytest
import torch
from torch import nn

import main
from engine.checkpoint import restore, restore_ema, with_ema_weights
from engine.recipe.optim import (DecayGroups, LRSchedule, make_optimizer, make_scheduler,
                                 param_groups, position_scheduler)
from engine.recipe.reference import ModelEMA, RecipeSettings, ema_decay, make_mix, resolve_recipe
from models import build_model
from tests.helpers.paths import REPO
from tests.helpers.runs import read_metrics, SMALL
from tests.helpers.states import settings_of as settings_of_flags, state_of

RECIPE = ["--label-smoothing", "0.1", "--lr-scheduler", "cosine", "--lr-warmup-epochs", "1",
          "--model-ema", "--model-ema-steps", "1", "--mixup-alpha", "0.2", "--cutmix-alpha", "1.0",
          "--norm-weight-decay", "0"]


def recipe_of(args, global_batch, steps_per_epoch):
    """The resolved recipe of a parsed command line."""
    return resolve_recipe(RecipeSettings.from_args(args), global_batch, steps_per_epoch)


def lrs(scheduler, optimizer, steps):
    """The LR of each of ``steps`` optimizer steps, stepping ``scheduler`` after each."""
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def sgd(lr=0.1, params=None):
    return torch.optim.SGD(params or [nn.Parameter(torch.zeros(1))], lr)


def test_default_flags_give_pytorch_examples_step_lr_at_every_step():
    """x0.1 every 30 epochs, constant within an epoch: exactly StepLR(30, 0.1) stepped per epoch."""
    args = main.parse_args([])
    schedule = recipe_of(args, global_batch=256, steps_per_epoch=5).schedule
    optimizer = sgd(args.lr)
    ours = lrs(make_scheduler(optimizer, schedule), optimizer, 95 * 5)
    reference = sgd(args.lr)
    step_lr = torch.optim.lr_scheduler.StepLR(reference, step_size=30, gamma=0.1)
    expected = [lr for lr in lrs(step_lr, reference, 95) for _ in range(5)]
    assert ours == expected  # bit for bit
    assert [schedule.lr_at(s) for s in range(95 * 5)] == expected


@pytest.mark.parametrize("method", ["linear", "constant"])
def test_cosine_with_warmup_is_torchvisions_sequential_lr_at_epoch_ends(method):
    """With one step per epoch the per-step schedule is torchvision train.py's per-epoch one:
    LinearLR/ConstantLR warm-up, SequentialLR, CosineAnnealingLR(T_max=epochs - warmup)."""
    epochs, warmup, decay, lr_min = 20, 3, 0.01, 1e-3
    schedule = LRSchedule(0.5, 1, epochs, "cosine", warmup_epochs=warmup, warmup_method=method,
                          warmup_decay=decay, lr_min=lr_min)
    optimizer = sgd(0.5)
    warm = (torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=decay, total_iters=warmup)
            if method == "linear" else
            torch.optim.lr_scheduler.ConstantLR(optimizer, factor=decay, total_iters=warmup))
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs - warmup,
                                                        eta_min=lr_min)
    chain = torch.optim.lr_scheduler.SequentialLR(optimizer, [warm, cosine], milestones=[warmup])
    expected = lrs(chain, optimizer, epochs)
    assert [schedule.lr_at(e) for e in range(epochs)] == pytest.approx(expected, rel=1e-9)


def test_cosine_per_step_closed_form():
    spe, epochs, warmup = 10, 5, 1
    s = LRSchedule(1.0, spe, epochs, "cosine", warmup_epochs=warmup, warmup_method="linear",
                   warmup_decay=0.1, lr_min=0.2)
    assert s.lr_at(0) == pytest.approx(0.1)  # warm-up start: decay x lr
    assert s.lr_at(5) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway up
    assert s.lr_at(spe * warmup) == pytest.approx(1.0)  # peak
    middle = spe * warmup + (spe * (epochs - warmup)) // 2
    assert s.lr_at(middle) == pytest.approx(0.6)  # (lr + lr_min) / 2
    assert s.lr_at(spe * epochs) == pytest.approx(0.2)  # the end: lr_min
    assert s.lr_at(spe * epochs - 1) > 0.2
    steps = [s.lr_at(t) for t in range(spe * warmup, spe * epochs)]
    assert all(a >= b for a, b in zip(steps, steps[1:]))  # falls monotonically after the peak


def ffcv_step_lrs(lr, epochs, peak, iters):
    """ffcv-imagenet train_imagenet.py: get_cyclic_lr per epoch, np.interp within it."""
    def get_cyclic_lr(epoch):
        return np.interp([epoch], [0, peak, epochs], [1e-4 * lr, lr, 0])[0]
    out = []
    for epoch in range(epochs):
        out += list(np.interp(np.arange(iters), [0, iters], [get_cyclic_lr(epoch),
                                                             get_cyclic_lr(epoch + 1)]))
    return out


def test_linear_with_peak_epoch_is_ffcvs_triangle():
    args = main.parse_args(["--lr-scheduler", "linear", "--lr-peak-epoch", "2", "--epochs", "16",
                            "--lr", "1.7"])
    schedule = recipe_of(args, global_batch=4096, steps_per_epoch=7).schedule
    ours = [schedule.lr_at(s) for s in range(16 * 7)]
    assert ours == pytest.approx(ffcv_step_lrs(1.7, 16, 2, 7), rel=1e-9, abs=1e-12)
    assert ours[0] == pytest.approx(1.7e-4) and schedule.lr_at(2 * 7) == pytest.approx(1.7)
    assert schedule.lr_at(16 * 7) == 0.0


def test_step_schedule_after_warmup_and_constant_warmup():
    s = LRSchedule(0.1, 4, 40, "step", step_size=10, gamma=0.5, warmup_epochs=2,
                   warmup_method="constant", warmup_decay=0.01)
    assert [s.lr_at(t) for t in (0, 7)] == pytest.approx([0.001, 0.001])
    assert s.lr_at(8) == pytest.approx(0.1)  # warm-up over: the schedule starts there
    assert s.lr_at(8 + 40 - 1) == pytest.approx(0.1) and s.lr_at(8 + 40) == pytest.approx(0.05)


def test_fractional_warmup_and_lr_scale_batch():
    args = main.parse_args(["--lr", "0.125", "--lr-scale-batch", "256", "--lr-warmup-epochs",
                            "0.5", "--lr-warmup-method", "linear"])
    recipe = recipe_of(args, global_batch=1024, steps_per_epoch=10)
    assert recipe.lr == pytest.approx(0.5) and recipe.schedule.warmup_steps == 5
    assert recipe_of(main.parse_args(["--lr", "0.3"]), 1024, 10).lr == 0.3


@pytest.mark.parametrize("kind", ["step", "cosine", "linear"])
def test_scheduler_positioned_mid_epoch_goes_on_like_the_uninterrupted_one(kind):
    """What --resume does with a --save-every checkpoint: LR of the step after resume = the
    uninterrupted run's, whatever the saved scheduler's kind (ours, StepLR, none)."""
    schedule = LRSchedule(0.4, 6, 12, kind, step_size=4, warmup_epochs=1.5,
                          warmup_method="linear")
    optimizer = sgd(0.4)
    straight = lrs(make_scheduler(optimizer, schedule), optimizer, 12 * 6)
    for epoch, batch in ((0, 3), (1, 2), (5, 0), (7, 5)):
        resumed = sgd(0.4)
        scheduler = make_scheduler(resumed, schedule)
        position_scheduler(scheduler, resumed, epoch * 6 + batch)
        assert lrs(scheduler, resumed, 12 * 6 - epoch * 6 - batch) == straight[epoch * 6 + batch:]


def test_norm_weight_decay_groups_as_torchvision():
    model = build_model("resnet18", 10)
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(param_groups(model, 1e-4)) == sum(1 for _ in model.parameters())  # one group
    groups = param_groups(model, 1e-4, norm_weight_decay=0.0)
    assert [g["weight_decay"] for g in groups] == [1e-4, 0.0]
    norm_params = {id(p) for m in norms for p in (m.weight, m.bias)}
    assert {id(p) for p in groups[1]["params"]} == norm_params  # BN weights and biases
    assert id(model.fc.bias) in {id(p) for p in groups[0]["params"]}
    with_bias = param_groups(model, 1e-4, norm_weight_decay=0.0, bias_weight_decay=0.5)
    assert [g["weight_decay"] for g in with_bias] == [1e-4, 0.0, 0.5]
    assert {id(p) for p in with_bias[2]["params"]} == {id(model.fc.bias)} | {
        id(m.bias) for m in norms}
    optimizer = make_optimizer(model, 0.1, 0.9, 1e-4, torch.device("cpu"),
                               decays=DecayGroups(norm=0.0))
    assert [g["weight_decay"] for g in optimizer.param_groups] == [1e-4, 0.0]
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))


class FakeLoader:
    classes = ["a", "b", "c"]

    def __len__(self):
        return 5


def settings_of(argv):
    """The settings of a one-process run of ``argv`` (synthetic data, -b 8, seeded)."""
    return settings_of_flags(["--dummy", "-b", "8", "--seed", "0", *argv])


def test_flags_reach_the_training_state():
    """Label smoothing reaches the criterion, MixUp/CutMix the step, groups the optimizer."""
    s = settings_of([*RECIPE, "-a", "resnet18", "--model-ema-decay", "0.9"])
    state = state_of(s, FakeLoader())
    assert state.criterion.label_smoothing == 0.1 and restore(None, state, s, 5) == (0, 0.0)
    assert len(state.optimizer.param_groups) == 2 and state.mix is not None
    assert isinstance(state.scheduler, torch.optim.lr_scheduler.LambdaLR)
    assert state.ema.every == 1 and state.ema.copy_epochs == 1
    assert state.ema.decay == pytest.approx(ema_decay(0.9, 1, 8, 90))
    assert state.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.01)  # constant warm-up
    plain = state_of(settings_of([]), FakeLoader())
    assert plain.criterion.label_smoothing == 0.0 and plain.mix is None and plain.ema is None
    assert len(plain.optimizer.param_groups) == 1


@pytest.mark.parametrize("mixup, cutmix", [(0.2, 0.0), (0.0, 1.0), (0.2, 1.0)])
def test_mixed_labels_are_distributions_matching_the_images(mixup, cutmix):
    torch.manual_seed(0)
    mix = make_mix(mixup, cutmix, num_classes=10)
    images = torch.randn(6, 3, 16, 16).to(memory_format=torch.channels_last)
    labels = torch.tensor([0, 1, 2, 3, 4, 5])
    for _ in range(5):
        mixed, soft = mix(images, labels)
        assert soft.shape == (6, 10) and soft.dtype == torch.float32
        assert torch.allclose(soft.sum(1), torch.ones(6))  # each sample's label mass is 1
        assert mixed.shape == images.shape and mixed.is_contiguous(
            memory_format=torch.channels_last)
        own, partner = soft[0, 0].item(), soft[0, 5].item()  # sample 0 is mixed with sample 5
        assert own + partner == pytest.approx(1.0)
        share = torch.isclose(mixed, images).float().mean().item()  # CutMix: pixels kept
        if mixup and not cutmix:
            expected = own * images + partner * images.roll(1, 0)
            assert torch.allclose(mixed, expected, atol=1e-5)
        elif cutmix and not mixup:
            assert own == pytest.approx(share, abs=0.02)
    assert make_mix(0.0, 0.0, 10) is None


def test_ema_update_math_warmup_copy_and_torchvision_decay_adjustment():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    ema = ModelEMA(model, decay=0.9, every=2, copy_epochs=1)
    reference = {k: v.clone() for k, v in ema.module.state_dict().items()}
    for step in range(4):
        model(torch.randn(8, 4)).sum().backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
        ema.after_step(model, epoch=1, step=step)
        if step % 2 == 0:  # torchvision: i % model_ema_steps == 0
            current = model.state_dict()
            first = not reference.get("_seen")
            for k, v in current.items():
                if v.is_floating_point():
                    reference[k] = v.clone() if first else 0.9 * reference[k] + 0.1 * v
                else:
                    reference[k] = v.clone()
            reference["_seen"] = True
    reference.pop("_seen")
    for k, v in ema.module.state_dict().items():
        assert torch.allclose(v, reference[k].to(v.dtype), atol=1e-6), k
    assert int(ema.n_averaged) == 2
    ema.after_step(model, epoch=0, step=0)  # in the LR warm-up: torchvision resets n_averaged
    assert int(ema.n_averaged) == 0
    ema.after_step(model, epoch=0, step=2)  # ... so the next update copies the model
    assert torch.equal(ema.module[0].weight, model[0].weight) and int(ema.n_averaged) == 0
    # torchvision train.py: adjust = world_size * batch_size * model_ema_steps / epochs
    assert ema_decay(0.99998, 32, 1024, 600) == pytest.approx(1 - 2e-5 * 1024 * 32 / 600)
    assert ema_decay(0.9, 32, 1024, 1) == 0.0  # alpha capped at 1: the EMA is the model


def test_ema_checkpoint_round_trip_in_torchvisions_format():
    torch.manual_seed(0)
    model = build_model("resnet18", 4)
    ema = ModelEMA(model, 0.5)
    ema.update_parameters(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update_parameters(model)
    saved = ema.state_dict()
    assert "n_averaged" in saved and "module.conv1.weight" in saved  # torchvision's keys
    fresh = ModelEMA(build_model("resnet18", 4), 0.5)
    restore_ema({"model_ema": saved}, fresh, "resnet18")
    assert int(fresh.n_averaged) == 2
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, saved[k]), k
    weights = with_ema_weights({"state_dict": model.state_dict(), "model_ema": saved})
    assert torch.equal(weights["state_dict"]["module.conv1.weight"], saved["module.conv1.weight"])
    tv = {"model": model.state_dict(), "epoch": 3, "model_ema": saved}  # torchvision references
    assert "model_ema" in with_ema_weights(tv)
    with pytest.raises(main.ConfigError, match="model_ema"):
        restore_ema({"model_ema": {"module.nope": torch.zeros(1)}}, fresh, "resnet18")


@pytest.mark.parametrize("flags, message", [
    (["--label-smoothing", "1.5"], "--label-smoothing 1.5"),
    (["--lr-peak-epoch", "2", "--lr-warmup-epochs", "1"], "not both"),
    (["--lr-peak-epoch", "200"], "--lr-peak-epoch 200"),
    (["--model-ema-steps", "0"], "--model-ema-steps"),
    (["--mixup-alpha", "-1"], "--mixup-alpha"),
])
def test_bad_recipe_flags_are_one_line(tiny, tmp_path, capsys, flags, message):
    rc = main.cli([tiny.root, *SMALL, "--epochs", "1", "--output-dir", str(tmp_path), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and err[0].startswith("main.py: error:"), err
    assert message in err[0]


def test_torchvision_scheduler_names_are_accepted(capsys):
    assert main.parse_args(["--lr-scheduler", "cosineannealinglr"]).lr_scheduler == "cosine"
    assert main.parse_args(["--lr-scheduler", "StepLR"]).lr_scheduler == "step"
    with pytest.raises(SystemExit):
        main.parse_args(["--lr-scheduler", "exponentiallr"])
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("name, arch, lr, batch, wd", [
    ("ffcv-rn18-16ep.yaml", "resnet18", 0.5, 1024, 5e-5),
    ("ffcv-rn18-88ep.yaml", "resnet18", 0.5, 1024, 5e-5),
    ("ffcv-rn50-16ep.yaml", "resnet50", 1.7, 4096, 1e-4),
    ("ffcv-rn50-88ep.yaml", "resnet50", 1.7, 4096, 1e-4),
])
def test_ffcv_presets_give_ffcvs_recipe(name, arch, lr, batch, wd):
    path = os.path.join(REPO, "configs", name)
    epochs = int(name.split("-")[-1].removesuffix("ep.yaml"))
    args = main.parse_args(["-c", path])
    assert (args.arch, args.epochs, args.weight_decay, args.momentum) == (arch, epochs, wd, 0.9)
    assert (args.label_smoothing, args.norm_weight_decay, args.lr_scheduler,
            args.lr_peak_epoch) == (0.1, 0.0, "linear", 2)
    recipe = recipe_of(args, global_batch=batch, steps_per_epoch=10)
    assert recipe.lr == pytest.approx(lr)  # FFCV's lr at FFCV's global batch
    assert [recipe.schedule.lr_at(s) for s in range(epochs * 10)] == pytest.approx(
        ffcv_step_lrs(lr, epochs, 2, 10), rel=1e-9, abs=1e-12)
    with open(path) as f:
        header = f.read().split("\narch:")[0]
    net = "rn18" if arch == "resnet18" else "rn50"
    assert f"{net}_configs/{net}_{epochs}_epochs.yaml" in header and "top-1" in header
    assert "per 256" in header and "train_crop_size" not in header
    assert args.blurpool  # FFCV use_blurpool: 1


@pytest.mark.slow
def test_a_run_with_every_recipe_flag_learns_and_records_them(tiny, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = str(tmp_path / "out")
    main.main([tiny.root, *SMALL, *RECIPE, "--lr-warmup-method", "linear", "--lr", "0.02",
               "--model-ema-decay", "0.9", "--epochs", "8", "--output-dir", out])
    records = read_metrics(out)
    assert [r["epoch"] for r in records] == list(range(8))
    for r in records:
        assert {"val_ema_loss", "val_ema_acc1", "val_ema_acc5", "lr", "val_acc1"} <= set(r)
    # Learns: MixUp/CutMix make the training loss too noisy to compare over 8 epochs of 4
    # steps, but top-1 ends well above chance (25%): 75-100% with seeds 0-6.
    assert records[-1]["val_acc1"] >= 50
    assert records[0]["lr"] == pytest.approx(0.02 * 0.01)  # linear warm-up from decay x lr
    assert records[1]["lr"] == pytest.approx(0.02)  # the peak after one epoch
    events = EventAccumulator(os.path.join(out, "tensorboard"))
    events.Reload()
    steps = events.Scalars("step/lr")
    assert len(steps) == 8 * 4 and steps[4].value == pytest.approx(0.02)
    assert "epoch/val_ema_acc1" in events.Tags()["scalars"]
    ckpt = torch.load(os.path.join(out, "checkpoint.pth.tar"), weights_only=True)
    assert "model_ema" in ckpt and int(ckpt["model_ema"]["n_averaged"]) == 28
    stats = main.main([tiny.root, *SMALL, *RECIPE, "-e", "--resume",  # the EMA's weights
                       os.path.join(out, "checkpoint.pth.tar")])
    assert stats["acc1"] == records[-1]["val_ema_acc1"]
    assert stats["loss"] == pytest.approx(records[-1]["val_ema_loss"], rel=1e-4)


def test_mid_epoch_resume_keeps_lr_and_ema(tiny, tmp_path, monkeypatch):
    """A --save-every checkpoint taken in epoch 1 (the kill point), resumed: every later step
    runs at the uninterrupted run's LR, and the EMA, LR state and metrics end the same."""
    import engine.loop

    real_step, real_save = engine.loop.train_step, main.save_checkpoint
    seen = []

    def spy_step(state, images, labels, epoch, step):
        seen.append((epoch, step, state.optimizer.param_groups[0]["lr"]))
        return real_step(state, images, labels, epoch, step)

    def spy_save(state, is_best, output_dir):
        real_save(state, is_best, output_dir)
        if (state["epoch"], state["batch"]) == (1, 2):
            real_save(state, False, str(tmp_path / "killed"))

    monkeypatch.setattr(engine.loop, "train_step", spy_step)
    monkeypatch.setattr(main, "save_checkpoint", spy_save)
    flags = [tiny.root, *SMALL, *RECIPE, "--lr-warmup-method", "linear", "--lr", "0.02",
             "--model-ema-decay", "0.9", "--epochs", "3", "--save-every", "1"]
    main.main([*flags, "--output-dir", str(tmp_path / "straight")])
    straight, seen[:] = list(seen), []
    main.main([*flags, "--output-dir", str(tmp_path / "resumed"),
               "--resume", str(tmp_path / "killed" / "checkpoint.pth.tar")])
    assert seen[0][:2] == (1, 2) and seen == straight[len(straight) - len(seen):]
    a, b = (torch.load(tmp_path / d / "checkpoint.pth.tar", weights_only=True)
            for d in ("straight", "resumed"))
    assert a["scheduler"]["last_epoch"] == b["scheduler"]["last_epoch"] == 3 * 4
    assert a["scheduler"]["_last_lr"] == b["scheduler"]["_last_lr"]
    assert int(a["model_ema"]["n_averaged"]) == int(b["model_ema"]["n_averaged"])
    for k, v in a["model_ema"].items():
        assert torch.allclose(v.float(), b["model_ema"][k].float(), rtol=1e-4, atol=1e-5), k
    last = read_metrics(str(tmp_path / "straight"))[-1], read_metrics(str(tmp_path / "resumed"))[-1]
    assert last[0]["train_loss"] == pytest.approx(last[1]["train_loss"], rel=1e-4)
    assert math.isclose(last[0]["lr"], last[1]["lr"])


@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_blurpool_wraps_strided_convs_and_keeps_shapes(arch):
    """FFCV's rule: a blur before each strided conv with >= 16 input channels (not the stem)."""
    from models.blurpool import BlurPoolConv2d

    torch.manual_seed(0)
    plain, blurred = build_model(arch, 7), build_model(arch, 7, blurpool=True)
    wrapped = [m for m in blurred.modules() if isinstance(m, BlurPoolConv2d)]
    assert len(wrapped) == 6 and not isinstance(blurred.conv1, BlurPoolConv2d)
    assert all(m.conv.in_channels >= 16 and max(m.conv.stride) == 2 for m in wrapped)
    x = torch.randn(2, 3, 64, 64).to(memory_format=torch.channels_last)
    assert blurred(x).shape == plain(x).shape == (2, 7)
    blur = wrapped[0]
    assert blur.blur_filter.shape == (blur.conv.in_channels, 1, 3, 3)
    assert blur.blur_filter[0].sum().item() == pytest.approx(1.0)  # keeps flat regions flat
    flat = torch.ones(1, blur.conv.in_channels, 8, 8)
    inner = nn.functional.conv2d(flat, blur.blur_filter, padding=1, groups=flat.shape[1])
    assert torch.allclose(inner[..., 1:-1, 1:-1], flat[..., 1:-1, 1:-1])
    assert "layer2.0.downsample.0.blur_filter" in blurred.state_dict()
