"""Small ``main.py`` runs in a subprocess and what they write, and ``make`` in the repository."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.helpers import warm
from tests.helpers.paths import REPO


def small_run(batch: int | None = 8, workers: int = 0, seed: int = 0,
              print_freq: int | None = 2) -> list[str]:
    """``main.py`` flags of a small CPU run: ResNet-18 at 32 px (train crop, val resize and
    crop), ``-b batch`` (None: left to the caller), ``-j workers``, ``-p print_freq`` (None:
    the default), ``--seed seed``."""
    flags = ["-a", "resnet18"] + (["-b", str(batch)] if batch else []) + ["-j", str(workers)]
    flags += ["--train-crop-size", "32", "--val-resize-size", "32", "--val-crop-size", "32"]
    return flags + (["-p", str(print_freq)] if print_freq else []) + ["--seed", str(seed)]


SMALL = small_run()
# One epoch, -b given per command (multi-process runs split it), one DataLoader worker.
SMALL_DISTRIBUTED = small_run(batch=None, workers=1, seed=5, print_freq=1) + ["--epochs", "1"]


def run_cli(*args, env=None, timeout=300):
    """``python main.py ARGS`` from the repository root, started warm when it may
    (:mod:`tests.helpers.warm`): the CompletedProcess (text)."""
    return warm.run([sys.executable, "main.py", *args], cwd=REPO, capture_output=True,
                    text=True, timeout=timeout, env=env)


def cli_in_process(args, capfd) -> subprocess.CompletedProcess:
    """``main.cli(args)`` in this process, as ``run_cli`` would run it in a new one (its exit
    status, and what it wrote to file descriptors 1 and 2, as text), without a new process's
    3-7 s of importing torch and torchvision: for tests of what ``main.py`` says, not of how
    its process starts or ends (those keep ``run_cli``). ``capfd``: pytest's fixture."""
    import main

    capfd.readouterr()
    status = main.cli(list(args))
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["main.py", *args], status, out, err)


def main_cmd(*args) -> list[str]:
    return [sys.executable, "main.py", *args]


def run(cmd, timeout=240):
    """Run ``cmd`` from the repository root (warm when it may); it must succeed."""
    result = warm.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def read_metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def only_record(out):
    (record,) = read_metrics(out)
    return record


def make(*args):
    """Run make in the repository, free of an outer make's flags and of stray CMD/ARGS/IMAGE."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "CMD", "ARGS", "IMAGE", "OUTPUT")}
    return subprocess.run(["make", "--no-print-directory", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env=env)


# metrics.jsonl keys that depend on the training alone (not on timing)
TRAINING_KEYS = ("epoch", "train_res", "train_loss", "train_acc1", "val_loss", "val_acc1",
                 "val_acc5", "lr", "train_images", "val_images")


def assert_same_training(out: str, expected: str, resumed: bool = True) -> None:
    """The run in ``out`` ended with the weights (bit for bit) and the per-epoch figures of the
    run in ``expected``. After a mid-epoch resume the epoch's training loss is summed in
    another order (carried sums), so it is compared to 1e-6; everything else exactly."""
    import json

    def records(where):
        with open(os.path.join(where, "metrics.jsonl")) as f:
            return {r["epoch"]: r for r in map(json.loads, f)}  # a repeated epoch: the last

    got, want = records(out), records(expected)
    assert sorted(got) == sorted(want)
    for epoch, record in want.items():
        for key in TRAINING_KEYS:
            if key == "train_loss" and resumed:
                assert got[epoch][key] == pytest.approx(record[key], rel=1e-6), (epoch, key)
            else:
                assert got[epoch][key] == record[key], (epoch, key)
    a, b = (torch.load(os.path.join(where, "checkpoint.pth.tar"), weights_only=True)
            for where in (out, expected))
    assert (a["epoch"], a["batch"]) == (b["epoch"], b["batch"])
    for name, tensor in b["state_dict"].items():
        assert torch.equal(a["state_dict"][name], tensor), name
