"""Progressive resizing and test-time flip averaging: the crop size per epoch against
FFCV's ``get_resolution``, the flag checks, every loader serving the epoch's resolution from
the same batch slots, and runs that record the resolution and resume it."""
import math
import os

import numpy as np
import pytest
import torch

import folder2shards
import loaders
import main
from engine import ConfigError
from engine.recipe.resolution import ResolutionSchedule, resolution_schedule
from loaders import DistInfo
from loaders.pipelines.workers.slots import SharedBatches
from tests.helpers.loading import loader_settings, to_uint8
from tests.helpers.paths import REPO
from tests.helpers.runs import read_metrics, SMALL


def ffcv_resolution(epoch, min_res, max_res, end_ramp, start_ramp):
    """libffcv/ffcv-imagenet train_imagenet.py ``get_resolution``, as published."""
    if epoch <= start_ramp:
        return min_res
    if epoch >= end_ramp:
        return max_res
    interp = np.interp([epoch], [start_ramp, end_ramp], [min_res, max_res])
    return int(np.round(interp[0] / 32)) * 32


@pytest.mark.parametrize("name, epochs", [("ffcv-rn18-16ep.yaml", 16), ("ffcv-rn18-88ep.yaml", 88),
                                          ("ffcv-rn50-16ep.yaml", 16), ("ffcv-rn50-88ep.yaml", 88)])
def test_presets_resize_as_ffcv(name, epochs):
    args = main.parse_args(["-c", os.path.join(REPO, "configs", name)])
    schedule = resolution_schedule(args)
    ramp = (args.min_res, args.max_res, args.end_ramp, args.start_ramp)
    assert ramp[:2] == (160, 192) and args.val_flip_tta
    assert [schedule.at(e) for e in range(epochs)] == [ffcv_resolution(e, *ramp)
                                                       for e in range(epochs)]
    assert schedule.at(0) == 160 and schedule.at(epochs - 1) == 192


@pytest.mark.parametrize("low, high, start, end", [(128, 256, 2, 10), (160, 224, 0, 5),
                                                   (96, 192, 3.5, 7)])
def test_schedule_is_ffcvs_closed_form(low, high, start, end):
    schedule = ResolutionSchedule(low, high, start, end)
    assert [schedule.at(e) for e in range(15)] == [ffcv_resolution(e, low, high, end, start)
                                                   for e in range(15)]


def test_schedule_stays_within_its_bounds_and_steps():
    # 178 px between 160 and 180 would round to 192 (FFCV's formula): clamped to the slots' 180
    schedule = ResolutionSchedule(160, 180, 0, 10)
    sizes = [schedule.at(e) for e in range(12)]
    assert max(sizes) == 180 and min(sizes) == 160 and sizes == sorted(sizes)
    fine = ResolutionSchedule(32, 64, 0, 2, step=16)
    assert [fine.at(e) for e in range(4)] == [32, 48, 64, 64]
    fixed = ResolutionSchedule(224, 224)
    assert not fixed.progressive and {fixed.at(e) for e in range(100)} == {224}


def test_default_is_the_fixed_train_crop_size():
    assert resolution_schedule(main.parse_args(["--train-crop-size", "176"])) == \
        ResolutionSchedule(176, 176, 0, 0)


@pytest.mark.parametrize("flags, message", [
    (["--min-res", "160", "--max-res", "192"], "needs --end-ramp"),
    (["--min-res", "192", "--max-res", "160", "--end-ramp", "3"], "is below --min-res"),
    (["--min-res", "128", "--max-res", "160", "--start-ramp", "4", "--end-ramp", "3"],
     "expected 0 <= start < end"),
    (["--min-res", "0"], ">= 1 px"),
    (["--val-resize-size", "200", "--val-crop-size", "224"], "exceeds --val-resize-size"),
    (["--res-step", "0"], "--res-step"),
])
def test_bad_resolution_flags_end_in_one_line(flags, message, tiny, capsys):
    assert main.cli([tiny.root, "-j", "0", *flags]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("main.py: error:") and message in err[0], err
    with pytest.raises(ConfigError):
        resolution_schedule(main.parse_args(flags))


def test_slots_serve_smaller_shapes_from_the_same_memory():
    pool = SharedBatches(3, 4, (3, 16, 16), channels_last=True, shared=False,
                         max_image_shape=(3, 32, 32))
    pointer = pool.memory.data_ptr()
    for side in (16, 24, 32, 8):
        pool.set_shape((3, side, side))
        assert pool.images.shape == (3, 4, 3, side, side)
        assert pool.batch(1, 4)[0].is_contiguous(memory_format=torch.channels_last)
        assert pool.images.untyped_storage().data_ptr() == pointer
        pool.images[2, 3].fill_(side)  # the last image of the last slot is inside the memory
        assert pool.batch(2, 4)[0][3].eq(side).all()
    with pytest.raises(ValueError, match="need"):
        pool.set_shape((3, 33, 33))


def _shards(tiny, root):
    for split in ("train", "val"):
        folder2shards.convert(os.path.join(tiny.root, split), os.path.join(root, split),
                              max_per_shard=10, workers=1, progress=False)
    return root


BACKENDS = ["folder", "lmdb", "shards", "synthetic", "dali"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("workers", [0, 2])
def test_every_loader_yields_the_epochs_resolution(backend, workers, tiny, tmp_path):
    """Set between epochs, each loader yields the new side at once; the folder, LMDB and shard
    loaders from the batch slots sized once for --max-res; validation keeps its size."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    data = {"lmdb": tiny.lmdb, "shards": None, "synthetic": None}.get(backend, tiny.root)
    if backend == "shards":
        data = _shards(tiny, str(tmp_path))
    settings = loader_settings(backend, data, workers=workers, train_crop_size=16,
                               train_max_crop_size=40, train_batches=2,
                               lmdb=backend == "lmdb", shards=backend == "shards")
    train, val = loaders.build_loaders(settings, DistInfo())
    pointers = set()
    for epoch, side in enumerate([16, 40, 24, 40]):
        train.set_resolution(side)
        train.set_epoch(epoch)
        batches = list(train)
        assert len(batches) == len(train) == 2 and train.resolution == side
        for images, labels in batches:
            assert images.shape == (4, 3, side, side) and images.dtype == torch.float32
        if hasattr(train, "_idle"):
            pointers.add(train._idle[1].memory.data_ptr())
    assert len(pointers) <= 1  # one set of slots for every resolution
    assert next(iter(val))[0].shape[-2:] == (32, 32)
    with pytest.raises(ValueError):
        val.set_resolution(16)
    if hasattr(train, "max_crop_size"):
        with pytest.raises(ValueError, match="at most 40"):
            train.set_resolution(48)


def test_labels_follow_pixels_at_every_resolution(tiny):
    """tiny's flat-colour images keep encoding their label after any crop and resize."""
    from tools.datagen import label_from_pixels

    train, _ = loaders.build_loaders(loader_settings("lmdb", tiny.lmdb, train_crop_size=8,
                                                     train_max_crop_size=48), DistInfo())
    for side in (8, 48):
        train.set_resolution(side)
        for images, labels in train:
            pixels = to_uint8(images)
            assert [label_from_pixels(p, tiny.num_classes) for p in pixels] == labels.tolist()


@pytest.mark.slow
def test_progressive_run_records_resolution_and_resumes_it(tiny, tmp_path, capsys):
    """--min-res 16 --max-res 48 over epochs 0..3 (ramp 0 -> 2, step 16): the training crop of
    each epoch in metrics.jsonl, the epoch line and TensorBoard; flip TTA at validation; a run
    resumed at epoch 2 trains at that epoch's size."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = str(tmp_path / "out")
    flags = [tiny.root, *SMALL, "--min-res", "16", "--max-res", "48", "--end-ramp", "2",
             "--res-step", "16", "--val-flip-tta", "--lr", "0.02", "--output-dir", out]
    main.main([*flags, "--epochs", "4"])
    records = read_metrics(out)
    assert [r["train_res"] for r in records] == [16, 32, 48, 48]
    assert "epoch 1: train at 32 px loss" in capsys.readouterr().out
    events = EventAccumulator(os.path.join(out, "tensorboard"))
    events.Reload()
    assert [e.value for e in events.Scalars("epoch/train_res")] == [16, 32, 48, 48]
    resumed = str(tmp_path / "resumed")
    main.main([*flags[:-1], resumed, "--epochs", "2"])
    main.main([*flags[:-1], resumed, "--epochs", "4", "--resume",
               os.path.join(resumed, "checkpoint.pth.tar")])
    assert [r["train_res"] for r in read_metrics(resumed)] == [16, 32, 48, 48]


def test_flip_tta_averages_the_mirrored_logits():
    from engine.loop import evaluate
    from engine.report.progress import Progress

    class Left(torch.nn.Module):  # logits: the mean of each image's left and right halves
        def forward(self, x):
            return torch.stack([x[..., :2].mean((1, 2, 3)), x[..., 2:].mean((1, 2, 3))], 1)

    class Loader(list):
        classes = ["left", "right"]

    images = torch.zeros(4, 3, 4, 4)
    images[:2, ..., :2] = 1.0  # brighter left: class 0 without TTA
    labels = torch.tensor([0, 0, 1, 1])
    loss = torch.nn.CrossEntropyLoss()
    plain = evaluate(Left(), Loader([(images, labels)]), loss, torch.no_grad,
                     Progress(1, "", "val", 10, False), DistInfo())
    tta = evaluate(Left(), Loader([(images, labels)]), loss, torch.no_grad,
                   Progress(1, "", "val", 10, False), DistInfo(), flip_tta=True)
    assert plain["acc1"] == 50.0  # images 2, 3 (zeros) tie and argmax picks class 0
    # mirrored logits average to a tie for every image: loss log(2) exactly
    assert tta["loss"] == pytest.approx(float(np.log(2)))


@pytest.mark.heavy
def test_ffcv_preset_scaled_down_trains_on_the_real_sample(sample, tmp_path):
    """FFCV's ResNet-18 16-epoch preset with every feature on (triangular LR, label smoothing,
    no BatchNorm weight decay, BlurPool, AMP, channels-last, test-time resolution and flip
    averaging), plus EMA and MixUp/CutMix, scaled down to 5 epochs at 24 -> 32 px on the 250 real
    ImageNet JPEGs: it trains end to end, at each epoch's size, and its loss falls. (At 32 -> 64
    px it took 8 minutes of CPU, CPU autocast's bfloat16 emulated.) Not 16 px: there ResNet's
    layer4 sees a 1x1 input, and PyTorch's CPU bfloat16 convolution (2.14) leaves the weight
    gradient of a stride-2 3x3 conv on a 1x1 input uninitialised outside the centre tap (NaN or
    1e28 in the weights, a different value each run)."""
    out = str(tmp_path / "out")
    main.main(["-c", os.path.join(REPO, "configs", "ffcv-rn18-16ep.yaml"),
               "--train", os.path.join(sample, "train"), "--val", os.path.join(sample, "val"),
               "--epochs", "5", "-b", "25", "-j", "2", "--min-res", "24", "--max-res", "32",
               "--start-ramp", "1", "--end-ramp", "3", "--res-step", "4",
               "--val-resize-size", "36", "--val-crop-size", "32", "--lr", "1.0",
               "--lr-peak-epoch", "1", "--model-ema", "--model-ema-steps", "1",
               "--mixup-alpha", "0.2", "--cutmix-alpha", "1.0", "-p", "0", "--seed", "0",
               "--output-dir", out])
    records = read_metrics(out)
    assert [r["train_res"] for r in records] == [24, 24, 28, 32, 32]
    assert all("val_ema_acc1" in r for r in records)
    config = torch.load(os.path.join(out, "checkpoint.pth.tar"), weights_only=False)["config"]
    assert config["blurpool"] and config["val_flip_tta"] and config["amp"]
    assert all(math.isfinite(r[key]) for r in records for key in ("train_loss", "val_loss"))
    assert records[-1]["train_loss"] < records[0]["train_loss"]
    assert records[-1]["val_loss"] < records[0]["val_loss"]
