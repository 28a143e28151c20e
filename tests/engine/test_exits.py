"""How a run ends when its data fails after a validation pass, with real processes:
every pipeline that keeps workers or threads between passes (DataLoader workers,
``--decode-device cpu-nvimgcodec``, DALI's CPU backend, shards streamed over HTTP) ends within
seconds with status 1 and one ``main.py: error:`` line, leaving no process of its group and no
shared-memory segment, for a failure in epoch 1's training, in epoch 1's validation (the
validation workers kept from epoch 0), and with SIGTERM sent to the whole group as it exits.
A shard server down for less than the retry window: the run trains on with nothing lost."""
import os
import shutil
import signal
import time

import pytest

from tests.helpers.exits import FileServer, WatchedRun
from tests.helpers.runs import assert_same_training, small_run

# 2 epochs of 3 training batches of 4 and 2 validation batches, one worker (DALI: one thread).
FLAGS = small_run(batch=4, workers=1, print_freq=1) + [
    "--epochs", "2", "--train-batches", "3", "--val-batches", "2"]
pytestmark = pytest.mark.slow  # each a run of tens of seconds on a busy 2-core machine

EXIT_S = 10.0  # from the error line to the process's end
FAIL_S = 120.0  # from breaking the data to the error line (steps on a busy 2-core machine)

PIPELINES = {
    "workers": [],
    "cpu-nvimgcodec": ["--decode-device", "cpu-nvimgcodec"],
    "dali-cpu": ["--dali"],
    "shards-http": ["--loader", "shards", "--shard-retry-delay", "0.1"],  # 3 tries over 0.3 s
}


def _needs(pipeline: str) -> None:
    if pipeline == "dali-cpu":
        pytest.importorskip("nvidia.dali")
    if pipeline == "cpu-nvimgcodec":
        pytest.importorskip("nvidia.nvimgcodec")


class _Data:
    """The run's two splits and how to break one of them while it runs: JPEG folders (the
    files removed) or shard folders served over HTTP by a server per split (stopped)."""

    def __init__(self, pipeline: str, tiny, tiny_shards, tmp_path):
        self.servers = {}
        if pipeline == "shards-http":
            self.servers = {split: FileServer(tiny_shards) for split in ("train", "val")}
            self.args = ["--train", f"{self.servers['train'].url}/train",
                         "--val", f"{self.servers['val'].url}/val"]
        else:
            self.root = str(tmp_path / "data")
            shutil.copytree(tiny.root, self.root, ignore=shutil.ignore_patterns("lmdb"))
            self.args = [self.root]

    def break_split(self, split: str) -> None:
        if self.servers:
            self.servers[split].stop()
            return
        for folder, _, files in os.walk(os.path.join(self.root, split)):
            for name in files:
                os.remove(os.path.join(folder, name))

    def close(self) -> None:
        for server in self.servers.values():
            server.stop()


@pytest.fixture
def data(request, tiny, tiny_shards, tmp_path):
    made = _Data(request.param, tiny, tiny_shards, tmp_path)
    yield made
    made.close()


def _progress(text: str) -> bool:
    return text.startswith(("Epoch: [", "Test: [", "epoch "))


# (the split broken, the line that triggers it): training data during epoch 0's validation
# (epoch 1's training fails); validation data at epoch 1's first step (its validation fails).
PHASES = {
    "epoch-1-training": ("train", lambda t: t.startswith("Test: [")),
    "epoch-1-validation": ("val", lambda t: t.startswith("Epoch: [1][1/")),
    "sigterm-while-exiting": ("train", lambda t: t.startswith("Test: [")),
}


@pytest.mark.parametrize("phase", sorted(PHASES))
@pytest.mark.parametrize("data", sorted(PIPELINES), indirect=True)
def test_a_data_error_after_validation_ends_the_run_cleanly(data, phase, request, tmp_path):
    pipeline = request.node.callspec.params["data"]
    _needs(pipeline)
    split, trigger = PHASES[phase]
    run = WatchedRun(*data.args, *PIPELINES[pipeline], *FLAGS,
                     "--output-dir", str(tmp_path / "out"))
    try:
        assert run.wait_for(trigger, FAIL_S), run.text()[-3000:]
        data.break_split(split)
        failed = run.wait_for(lambda t: t.startswith("main.py: error:"), FAIL_S)
        assert failed, run.text()[-3000:]
        if phase == "sigterm-while-exiting":
            run.signal_group(signal.SIGTERM)  # as SLURM signals every process of a step
        status = run.finish(EXIT_S)
    finally:
        if run.proc.poll() is None:
            run.kill()
    assert status == 1, f"status {status} after {EXIT_S} s\n{run.text()[-3000:]}"
    assert len(run.errors()) == 1 and "Traceback" not in run.text(), run.text()[-3000:]
    if pipeline == "shards-http":
        assert "cannot open" in run.errors()[0] and "3 tries over 0.3 s" in run.errors()[0]
    assert run.left_behind() == []
    assert run.shm_left() == []


def test_a_shard_server_back_within_the_retry_window_loses_nothing(tiny_shards, tmp_path):
    server = FileServer(tiny_shards)
    args = ["--loader", "shards", "--train", f"{server.url}/train", "--val", f"{server.url}/val",
            *FLAGS, "--shard-retries", "4", "--shard-retry-delay", "1"]  # 1+2+4+8 s of retries
    try:
        straight = WatchedRun(*args, "--output-dir", str(tmp_path / "straight"))
        assert straight.finish(FAIL_S) == 0, straight.text()[-3000:]
        run = WatchedRun(*args, "--output-dir", str(tmp_path / "out"))
        # down from epoch 0's first step (its validation's shards are opened after it) until
        # a stream has failed once: back well within the 15 s of retries
        assert run.wait_for(lambda t: t.startswith("Epoch: [0][1/"), FAIL_S), run.text()
        server.stop()
        failed = run.wait_for(lambda t: "cannot open" in t and "try 2 of 5 in 1 s" in t, FAIL_S)
        assert failed, run.text()[-3000:]
        time.sleep(0.5)
        server.start()
        status = run.finish(FAIL_S)
    finally:
        server.stop()
    assert status == 0, run.text()[-3000:]
    assert_same_training(str(tmp_path / "out"), str(tmp_path / "straight"), resumed=False)


def _kept_workers_run(tiny, tmp_path) -> WatchedRun:
    """A DataLoader-workers run at epoch 1's first step: training's and validation's workers
    both alive (kept since epoch 0)."""
    run = WatchedRun(tiny.root, *FLAGS, "--output-dir", str(tmp_path / "out"))
    assert run.wait_for(lambda t: t.startswith("Epoch: [1][1/"), FAIL_S), run.text()[-3000:]
    return run


def test_ctrl_c_exits_130_leaving_nothing(tiny, tmp_path):
    run = _kept_workers_run(tiny, tmp_path)
    run.signal_group(signal.SIGINT)  # a terminal's Ctrl-C reaches the whole foreground group
    status = run.finish(EXIT_S)
    assert status == 130 and "main.py: interrupted" in run.text(), run.text()[-3000:]
    assert run.left_behind() == [] and run.shm_left() == []


def test_workers_do_not_outlive_a_killed_training_process(tiny, tmp_path):
    run = _kept_workers_run(tiny, tmp_path)
    os.kill(run.proc.pid, signal.SIGKILL)  # no exit path runs: the workers notice alone
    run.proc.wait(EXIT_S)
    assert run.left_behind(wait=EXIT_S) == []


def test_a_data_error_in_evaluation_only_ends_the_run_cleanly(tiny, tmp_path):
    data = _Data("workers", tiny, None, tmp_path)
    run = WatchedRun(*data.args, *small_run(batch=1, workers=1, print_freq=1), "-e",
                     "--output-dir", str(tmp_path / "out"))  # 16 batches: most read after
    try:
        assert run.wait_for(lambda t: t.startswith("Test: [ 1/"), FAIL_S), run.text()[-3000:]
        data.break_split("val")
        assert run.wait_for(lambda t: t.startswith("main.py: error:"), FAIL_S), run.text()
        status = run.finish(EXIT_S)
    finally:
        if run.proc.poll() is None:
            run.kill()
    assert status == 1 and len(run.errors()) == 1, run.text()[-3000:]
    assert run.left_behind() == [] and run.shm_left() == []
