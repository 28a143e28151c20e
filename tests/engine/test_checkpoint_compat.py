"""--resume and -e --resume of checkpoints other tools wrote: pytorch/examples'
``checkpoint.pth.tar`` (saved from DDP: ``module.`` keys, a tensor ``best_acc1``, none of our
newer keys, older ones without ``scheduler``), torchvision references' (``model``, last finished
``epoch``) and bare state_dicts; anything else is one line."""
import os
from collections import OrderedDict

import pytest
import torch

import main
from engine.checkpoint import load_optimizer, load_weights
from tests.helpers.runs import read_metrics, SMALL

SHORT = ["--train-batches", "1", "--val-batches", "1"]
EXAMPLES_KEYS = ("epoch", "arch", "state_dict", "best_acc1", "optimizer", "scheduler")


@pytest.fixture(scope="module")
def ours(tiny, tmp_path_factory):
    """One epoch of our own training on ``tiny``: the checkpoint's path and contents."""
    out = str(tmp_path_factory.mktemp("ours"))
    main.main([tiny.root, *SMALL, "--lr", "0.01", "--epochs", "1", "--output-dir", out])
    path = os.path.join(out, "checkpoint.pth.tar")
    return path, torch.load(path, weights_only=True)


def prefixed(state_dict, prefix):
    return {prefix + k: v for k, v in state_dict.items()}


def examples_style(checkpoint, **changes):
    """``checkpoint`` as pytorch/examples saves it from DDP."""
    converted = {k: checkpoint[k] for k in EXAMPLES_KEYS}
    converted.update(state_dict=prefixed(checkpoint["state_dict"], "module."),
                     best_acc1=torch.tensor([checkpoint["best_acc1"]]))
    converted.update(changes)
    return {k: v for k, v in converted.items() if v is not None}


def save(obj, tmp_path, name="other.pth.tar"):
    path = str(tmp_path / name)
    torch.save(obj, path)
    return path


def evaluate(tiny, path):
    return main.main([tiny.root, *SMALL, "-e", "--resume", path])


def test_examples_checkpoint_evaluates_like_ours(tiny, ours, tmp_path):
    mine = evaluate(tiny, ours[0])
    theirs = evaluate(tiny, save(examples_style(ours[1]), tmp_path))
    assert theirs["acc1"] == mine["acc1"] and theirs["acc5"] == mine["acc5"]
    assert theirs["loss"] == pytest.approx(mine["loss"], rel=1e-6)


def test_examples_checkpoint_resumes_at_its_epoch_with_our_lr(tiny, ours, tmp_path, capsys):
    path = save(examples_style(ours[1]), tmp_path)
    capsys.readouterr()
    for name, resume in (("mine", ours[0]), ("theirs", path)):
        main.main([tiny.root, *SMALL, *SHORT, "--lr", "0.01", "--epochs", "2",
                   "--output-dir", str(tmp_path / name), "--resume", resume])
        assert f"resumed from {resume} at epoch 1" in capsys.readouterr().out
    mine, theirs = read_metrics(str(tmp_path / "mine")), read_metrics(str(tmp_path / "theirs"))
    assert [r["epoch"] for r in theirs] == [r["epoch"] for r in mine] == [1]
    assert theirs[0]["lr"] == mine[0]["lr"] == pytest.approx(0.01)
    resaved = torch.load(str(tmp_path / "theirs" / "checkpoint.pth.tar"), weights_only=True)
    assert resaved["epoch"] == 2 and not any(k.startswith("module.") for k in resaved["state_dict"])


def test_torchvision_references_checkpoint_evaluates_and_resumes_after_its_epoch(
        tiny, ours, tmp_path, capsys):
    """torchvision's references/classification save ``model`` and the last finished ``epoch``
    (with ``lr_scheduler`` of any kind, ``args``): -e matches ours, training runs the next one."""
    saved = {"model": prefixed(ours[1]["state_dict"], "module."), "epoch": 0,
             "optimizer": ours[1]["optimizer"], "lr_scheduler": {"kind": "cosine"}, "args": {}}
    path = save(saved, tmp_path)
    mine, theirs = evaluate(tiny, ours[0]), evaluate(tiny, path)
    assert theirs["acc1"] == mine["acc1"] and theirs["acc5"] == mine["acc5"]
    out = str(tmp_path / "out")
    capsys.readouterr()
    main.main([tiny.root, *SMALL, *SHORT, "--lr", "0.01", "--epochs", "2", "--output-dir", out,
               "--resume", path])
    assert f"resumed from {path} at epoch 1" in capsys.readouterr().out
    assert [r["epoch"] for r in read_metrics(out)] == [1]


def test_examples_checkpoint_without_scheduler_takes_the_step_lr_of_its_epoch(tiny, ours,
                                                                             tmp_path):
    """Older pytorch/examples set lr = --lr * 0.1 ** (epoch // 30) each epoch: no scheduler."""
    path = save(examples_style(ours[1], scheduler=None, epoch=31), tmp_path)
    out = str(tmp_path / "out")
    main.main([tiny.root, *SMALL, *SHORT, "--lr", "0.1", "--epochs", "32", "--output-dir", out,
               "--resume", path])
    (record,) = read_metrics(out)
    assert record["epoch"] == 31 and record["lr"] == pytest.approx(0.01)
    assert torch.load(os.path.join(out, "checkpoint.pth.tar"),
                      weights_only=True)["scheduler"]["last_epoch"] == 32


@pytest.mark.parametrize("prefix", ["", "module.", "_orig_mod.", "module._orig_mod.",
                                    "_orig_mod.module."])
def test_bare_state_dict_evaluates_like_the_checkpoint(tiny, ours, tmp_path, prefix):
    mine = evaluate(tiny, ours[0])
    theirs = evaluate(tiny, save(prefixed(ours[1]["state_dict"], prefix), tmp_path))
    assert (theirs["acc1"], theirs["acc5"]) == (mine["acc1"], mine["acc5"])
    assert theirs["loss"] == pytest.approx(mine["loss"], rel=1e-6)


@pytest.mark.parametrize("prefix, start", [("", 0), ("module.", 3)])
def test_bare_state_dict_trains_with_a_fresh_optimizer(tiny, ours, tmp_path, capsys, prefix,
                                                       start):
    path = save(prefixed(ours[1]["state_dict"], prefix), tmp_path)
    out = str(tmp_path / "out")
    capsys.readouterr()
    main.main([tiny.root, *SMALL, *SHORT, "--epochs", str(start + 1), "--start-epoch", str(start),
               "--output-dir", out, "--resume", path])
    line = (f"--resume {path}: weights only (no optimizer/epoch): training from them with a "
            f"fresh optimizer at epoch {start}")
    assert capsys.readouterr().out.splitlines().count(line) == 1
    assert [r["epoch"] for r in read_metrics(out)] == [start]


def test_evaluation_never_loads_the_optimizer(tiny, ours, tmp_path):
    adam = torch.optim.Adam(torch.nn.Linear(2, 2).parameters()).state_dict()
    mine = evaluate(tiny, ours[0])
    assert evaluate(tiny, save(examples_style(ours[1], optimizer=adam), tmp_path))["acc1"] \
        == mine["acc1"]


def _wrong_arch(c):
    return examples_style(c, arch="resnet34")


def _renamed_keys(c):
    sd = dict(c["state_dict"])
    sd["head.weight"], sd["head.bias"] = sd.pop("fc.weight"), sd.pop("fc.bias")
    return {**c, "state_dict": sd}


def _other_class_count(c):
    return {**c["state_dict"], "fc.weight": torch.zeros(1000, 512), "fc.bias": torch.zeros(1000)}


def _adam_state(c):
    return examples_style(c, optimizer=torch.optim.Adam(
        torch.nn.Linear(2, 2).parameters()).state_dict())


def _fewer_params(c):
    optimizer = {**c["optimizer"], "param_groups": [
        {**g, "params": g["params"][:-2]} for g in c["optimizer"]["param_groups"]]}
    return examples_style(c, optimizer=optimizer)


@pytest.mark.parametrize("make, message", [
    (_wrong_arch, "checkpoint is a resnet34, not -a resnet18"),
    (lambda c: {"model": {"x": 1}, "epoch": 3}, "no 'state_dict' key"),
    (lambda c: {"weights": 1, "note": "garbage"}, "neither a checkpoint nor a state_dict"),
    (lambda c: [1, 2, 3], "neither a checkpoint nor a state_dict (a list)"),
    (lambda c: {**c, "state_dict": "nope"}, "state_dict is not a mapping"),
    (_renamed_keys,
     "2 missing keys (fc.bias, fc.weight); 2 unexpected keys (head.bias, head.weight)"),
    (_other_class_count, "fc.weight [1000, 512] vs [4, 512]"),
    (_adam_state, "optimizer state is not SGD's (no dampening, momentum, nesterov)"),
    (_fewer_params, "optimizer state does not fit"),
])
def test_unusable_checkpoint_is_one_line(tiny, ours, tmp_path, capsys, make, message):
    path = save(make(ours[1]), tmp_path)
    capsys.readouterr()
    rc = main.cli([tiny.root, *SMALL, *SHORT, "--epochs", "2", "--output-dir",
                   str(tmp_path / "out"), "--resume", path])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert err[0].startswith(f"main.py: error: --resume {path}") and message in err[0], err[0]


def test_loaded_optimizer_keeps_this_runs_implementation():
    """A state saved with fused SGD (a GPU run) resumes on the CPU, and the reverse: the
    implementation keys stay this run's (a non-fused group under GradScaler would fail)."""
    params = torch.nn.Linear(2, 2).parameters
    saved = torch.optim.SGD(params(), 0.1, momentum=0.9, foreach=True).state_dict()
    optimizer = torch.optim.SGD(params(), 0.5, momentum=0.9, foreach=False)
    load_optimizer(optimizer, saved)
    assert optimizer.param_groups[0]["foreach"] is False
    assert optimizer.param_groups[0]["lr"] == 0.1


def test_wrapper_parts_anywhere_in_keys_are_dropped():
    """pytorch/examples wraps AlexNet's and VGG's ``features`` alone in DataParallel."""
    def net():
        return torch.nn.Sequential(OrderedDict(features=torch.nn.Sequential(torch.nn.Linear(2, 3)),
                                               classifier=torch.nn.Linear(3, 2)))
    saved = net()
    saved.features = torch.nn.DataParallel(saved.features)
    assert "features.module.0.weight" in saved.state_dict()
    model = net()
    load_weights(model, prefixed(saved.state_dict(), "_orig_mod."), "alexnet")
    assert torch.equal(model.classifier.weight, saved.classifier.weight)
    assert torch.equal(model.features[0].bias, saved.features.module[0].bias)
