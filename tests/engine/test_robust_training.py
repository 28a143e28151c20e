"""Training through damaged samples, and resuming mid-epoch after SIGKILL (--save-every).
The resumable sampler itself is tested with the loaders (tests/loaders/test_orders.py)."""
import os
import random
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from tests.helpers import warm
from tests.helpers.paths import REPO
from tests.helpers.runs import assert_same_training, read_metrics as records, run_cli, small_run

SMALL = small_run(batch=4, print_freq=None) + ["--lr", "0.01"]


def cli(*args, timeout=240):
    return run_cli(*args, timeout=timeout)


@pytest.fixture
def damaged(tiny, tmp_path):
    """The tiny folder dataset with a truncated JPEG and a text file among the training images."""
    root = tmp_path / "data"
    shutil.copytree(tiny.root, root, ignore=shutil.ignore_patterns("lmdb"))
    good = root / "train" / "n00000001" / "n00000001_0.JPEG"
    (root / "train" / "n00000001" / "truncated.JPEG").write_bytes(good.read_bytes()[:200])
    (root / "train" / "n00000002" / "notes.JPEG").write_text("not an image")
    return root


def test_undecodable_samples_are_replaced_and_named(damaged, tmp_path):
    result = cli(str(damaged), *SMALL, "--epochs", "1", "--max-bad-share", "0.1",
                 "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "skipping unreadable sample" in result.stderr
    assert "truncated.JPEG" in result.stderr and "notes.JPEG" in result.stderr
    (record,) = records(tmp_path / "out")
    assert record["train_images"] == 32  # 34 files, 2 replaced: every batch still full


def test_too_many_bad_samples_stop_the_run_with_one_line(damaged, tmp_path):
    result = cli(str(damaged), *SMALL, "--epochs", "1", "--max-bad-share", "0",
                 "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    error = [l for l in result.stderr.splitlines() if l.startswith("main.py: error:")]
    assert len(error) == 1 and "failed to decode" in error[0]


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_matches_an_uninterrupted_run(tiny, tmp_path):
    args = ["--lmdb", tiny.lmdb, *SMALL, "--epochs", "2", "-p", "1", "--save-every", "1"]
    straight = str(tmp_path / "straight")
    assert cli(*args, "--output-dir", straight).returncode == 0
    rng = random.Random(7)
    for trial in range(2):
        out = str(tmp_path / f"killed{trial}")
        proc = warm.Popen([sys.executable, "main.py", *args, "--output-dir", out],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True)
        steps, stop_after = 0, rng.randint(2, 12)  # 8 steps per epoch, 16 in all
        for line in proc.stdout:
            steps += line.startswith("Epoch:")
            if steps == stop_after:
                proc.send_signal(signal.SIGKILL)
                break
        proc.wait(timeout=60)
        checkpoint = os.path.join(out, "checkpoint.pth.tar")
        torch.load(checkpoint, weights_only=True)  # the last checkpoint is whole
        result = cli(*args, "--output-dir", out, "--resume", checkpoint)
        assert result.returncode == 0, result.stderr[-2000:]
        assert "resumed from" in result.stdout
        # bit-identical weights; per epoch the samples trained (count) and the carried sums
        assert_same_training(out, straight)
