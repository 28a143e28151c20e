"""A training row's images/s is its loader's in steady state, not what its queue held before
the clock started. On the CPU: a loader slowed on purpose (every sample read sleeps: at most 2
images/s) and a first training step slowed as cuDNN's tuning slows a GPU's, during which the
worker fills every batch slot it has. Timed from its first steps, the same run reads the queue."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.helpers.gpu_fakes import make_bundle
from tests.helpers.paths import REPO
from tools.gpu_check.check import get_args_parser, settings
from tools.gpu_check.rows.measure import prepare_data
from tools.gpu_check.plan import Row
from tools.gpu_check.rows.measure import main_row, ready_batches
from tools.gpu_check.runner import Runner

# sitecustomize of the rows' processes: each sample read sleeps SLOW_READ_S, the first
# backward pass SLOW_FIRST_STEP_S
SLOW = """\
import importlib, os, time
import torch
from loaders.readers import READERS
delay, first = float(os.environ["SLOW_READ_S"]), [float(os.environ["SLOW_FIRST_STEP_S"])]
for name in READERS.values():
    module = importlib.import_module(name)
    for cls in list(vars(module).values()):
        if isinstance(cls, type) and cls.__module__ == name and "read" in vars(cls):
            def read(self, index, _read=cls.read):
                time.sleep(delay)
                return _read(self, index)
            cls.read = read
backward = torch.Tensor.backward
def slow_backward(self, *args, **kwargs):
    if first[0]:
        time.sleep(first[0])
        first[0] = 0.0
    return backward(self, *args, **kwargs)
torch.Tensor.backward = slow_backward
"""
READ_S, BATCH = 0.5, 2
CEILING = BATCH / (BATCH * READ_S)  # one worker: 2 images/s at most


@pytest.mark.heavy
@pytest.mark.slow
def test_a_training_row_times_the_loader_not_its_queue(sample_images, tmp_path):
    bundle = make_bundle(sample_images, tmp_path / "bundle", classes=4)
    s = settings(get_args_parser().parse_args([
        "--dry-run", "--bundle", str(bundle), "--out", str(tmp_path / "o")]))
    s = SimpleNamespace(**{**vars(s), "workers": "1", "batch": BATCH, "steps": 8, "warmup": 6})
    runner = Runner(s.out, 900, dry_run=True)
    machine = {"cpu_cores": 2, "lmdb": "installed", "gpu_count": 0}
    data = SimpleNamespace(**prepare_data(runner, s, machine, 300)[1]["paths"])
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW)
    runner.add_path(REPO)
    runner.add_path(str(hook))
    runner.env.update(SLOW_READ_S=str(READ_S), SLOW_FIRST_STEP_S="6")
    ctx = SimpleNamespace(runner=runner, s=s, machine=machine, data=data, done={})
    steady = main_row(ctx, Row("train-resnet18-lmdb", 4, "train", "lmdb", "all"), 900)
    assert steady["status"] == "passed", steady
    # warmed up past the 6 batches one worker holds ready, and 6 more for them to drain
    assert steady["warmup_steps"] == ready_batches("lmdb", 1) + 6 == 12
    assert 0.5 * CEILING < steady["images_per_sec"] <= 1.1 * CEILING, steady["images_per_sec"]
    ctx.s = SimpleNamespace(**{**vars(s), "warmup": -5})
    naive = main_row(ctx, Row("timed-from-the-first-step", 4, "train", "lmdb", "all"), 900)
    assert naive["warmup_steps"] == 1
    assert naive["images_per_sec"] > 1.3 * CEILING, naive["images_per_sec"]  # the queue filled
