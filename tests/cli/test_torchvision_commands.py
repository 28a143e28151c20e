"""torchvision's and pytorch/examples' own command lines through ``main.py``:
pytorch/examples' CI line on one image, torchvision's ResNet-50 v2 command verbatim on two CPU
ranks with gloo (test-sized by flags appended after it), the presets equal to the commands,
and an augmented run resumed mid-epoch ending as the uninterrupted one."""
from __future__ import annotations

import glob
import math
import os
import shutil
import sys

import pytest
import torch

import main
from benchmarks.training.recipes import TORCHVISION_R50_V2
from tests.helpers import warm
from tests.helpers.paths import REPO
from tests.helpers.ranks import run_ranks
from tests.helpers.runs import SMALL, TRAINING_KEYS, read_metrics
from tools import datagen

# torchvision's ConvNeXt command for convnext_tiny
TORCHVISION_CONVNEXT = (
    "--model convnext_tiny --batch-size 128 --opt adamw --lr 1e-3 --lr-scheduler "
    "cosineannealinglr --lr-warmup-epochs 5 --lr-warmup-method linear --auto-augment ta_wide "
    "--epochs 600 --random-erase 0.1 --label-smoothing 0.1 --mixup-alpha 0.2 --cutmix-alpha 1.0 "
    "--weight-decay 0.05 --norm-weight-decay 0.0 --train-crop-size 176 --model-ema "
    "--val-resize-size 232 --ra-sampler --ra-reps 4").split()


def test_pytorch_examples_ci_line_on_one_image(sample_images, tmp_path):
    """run_python_examples.sh: one image in class n (train and val), `main.py --epochs 1
    sample/` with every default (-b 256): one batch of one image, said once."""
    image = sorted(glob.glob(os.path.join(sample_images, "train", "*", "*")))[0]
    for split in ("train", "val"):
        os.makedirs(tmp_path / "sample" / split / "n")
        shutil.copy(image, tmp_path / "sample" / split / "n" / "Socks-clinton.jpg")
    result = warm.run([sys.executable, os.path.join(REPO, "main.py"), "--epochs", "1",
                             "sample/"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    said = [line for line in result.stdout.splitlines() if "fewer than one batch" in line]
    assert said == ["training set has 1 images per process, fewer than one batch of 256: "
                    "each epoch trains on them as one batch of 1"]
    (record,) = read_metrics(str(tmp_path))
    assert record["train_images"] == 1 and record["val_images"] == 1
    assert os.path.isfile(tmp_path / "checkpoint.pth.tar")


@pytest.fixture(scope="module")
def data_300(tmp_path_factory):
    """300 training images (RASampler reads 256 of them per epoch), 40 validation ones."""
    root = str(tmp_path_factory.mktemp("data300"))
    return datagen.make_dataset(root, 10, train_per_class=30, val_per_class=4, seed=3,
                                min_size=40, max_size=64)


def test_torchvision_resnet50_v2_command_on_two_cpu_ranks(data_300, tmp_path):
    """The command verbatim on 2 gloo ranks with torchrun's variables (tests.helpers.ranks;
    torchrun itself: test_distributed.py), made test-sized by flags after it: every recipe
    feature on, RASampler's 256 // 2 images per rank, the EMA validated."""
    out = str(tmp_path / "out")
    test_size = ["--data-path", data_300, "--epochs", "1", "-b", "32", "-j", "1",
                 "--train-crop-size", "32", "--val-resize-size", "36", "--val-crop-size", "32",
                 "--model", "resnet18", "--output-dir", out, "--seed", "0"]
    result = run_ranks([*TORCHVISION_R50_V2, *test_size], 2, timeout=900)
    assert "world size 2 (gloo process group)" in result.stdout
    (record,) = read_metrics(out)
    assert record["train_images"] == 256  # RASampler: floor(300 // 256 * 256 / 2) per rank
    assert record["val_images"] == 40 and "val_ema_acc1" in record
    assert math.isfinite(record["train_loss"]) and math.isfinite(record["val_ema_loss"])


@pytest.mark.parametrize("preset, command", [
    ("torchvision-resnet50-v2.yaml", TORCHVISION_R50_V2),
    ("torchvision-convnext-tiny.yaml", TORCHVISION_CONVNEXT),
])
def test_presets_are_torchvisions_commands(preset, command):
    from_preset = vars(main.parse_args(["-c", os.path.join(REPO, "configs", preset)]))
    from_command = vars(main.parse_args(command))
    from_preset.pop("config"), from_command.pop("config")
    assert from_preset == from_command
    text = open(os.path.join(REPO, "configs", preset)).read()
    assert "top-1" in text and "Not reproduced here" in text


def test_augmented_run_resumed_mid_epoch_ends_as_the_uninterrupted_one(tiny, tmp_path,
                                                                       monkeypatch):
    """--auto-augment ta_wide and --random-erase: a --save-every checkpoint of epoch 1 resumed
    with another -j trains the same steps on the same pixels: the same weights, bit for bit."""
    real_save = main.save_checkpoint

    def spy_save(state, is_best, output_dir):
        real_save(state, is_best, output_dir)
        if (state["epoch"], state["batch"]) == (1, 2):
            real_save(state, False, str(tmp_path / "killed"))

    monkeypatch.setattr(main, "save_checkpoint", spy_save)
    flags = [tiny.root, *SMALL, "--auto-augment", "ta_wide", "--random-erase", "0.5",
             "--epochs", "2", "--save-every", "1"]
    main.main([*flags, "--output-dir", str(tmp_path / "straight")])
    main.main([*flags, "-j", "2", "--output-dir", str(tmp_path / "resumed"),
               "--resume", str(tmp_path / "killed" / "checkpoint.pth.tar")])
    (resumed,), straight = (read_metrics(str(tmp_path / d)) for d in ("resumed", "straight"))
    for key in TRAINING_KEYS:  # the resumed epoch's loss is summed in another order
        assert resumed[key] == pytest.approx(straight[-1][key], rel=1e-6), key
    a, b = (torch.load(tmp_path / d / "checkpoint.pth.tar", weights_only=True)
            for d in ("resumed", "straight"))
    assert (a["epoch"], a["batch"]) == (b["epoch"], b["batch"]) == (2, 0)
    for name, tensor in b["state_dict"].items():
        assert torch.equal(a["state_dict"][name], tensor), name


def test_test_only_with_weights_validates_with_their_preprocessing(tiny, tmp_path, monkeypatch):
    """--weights NAME --test-only: the weights from the cache, validation at their resize."""
    import torchvision

    from engine.distributed.processes import Job
    from engine.settings import resolve_settings
    from loaders import DistInfo
    from models import cached_weights_path, resolve_weights

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    weights = resolve_weights("resnet50", "IMAGENET1K_V2")
    os.makedirs(tmp_path / "hub" / "checkpoints")
    torch.save(torchvision.models.resnet50().state_dict(), cached_weights_path("resnet50",
                                                                               weights))
    args = main.parse_args([tiny.root, "--model", "resnet50", "--weights", "IMAGENET1K_V2",
                            "--test-only"])
    s = resolve_settings(args, Job(DistInfo()), None)
    assert (s.loader.val_resize_size, s.loader.val_crop_size) == (232, 224)
    assert s.mode == "evaluate" and s.model.weights == "IMAGENET1K_V2"
