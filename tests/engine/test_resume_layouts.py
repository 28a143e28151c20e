"""A run SIGKILLed mid-epoch and resumed at another world size or batch size (gloo on CPU, the
``tiny`` set's 32 training images): the epoch's global order goes on, each sample trained at
most once, the trained samples the global order's first (less a tail under one new global
batch), ``train_images`` the count, the LR at the first resumed step the uninterrupted run's
at that step of the new batching; what cannot continue exactly is refused in one line."""
import os

import pytest

from loaders import DistInfo
from loaders.positions import Layout, global_order
from loaders.readers import open_reader
from tests.helpers.loading import loader_settings
from tests.helpers.runs import main_cmd, only_record, run, run_cli
from tests.helpers.traces import (kill_at_step, layout_flags, saved_position, step_lrs,
                                  traced_batches, traced_env)

SEED = 3  # layout_flags' seed


def data_flags(kind: str, tiny, tiny_shards) -> tuple[list[str], str, str]:
    """``(main.py data flags, reader source, train split)`` of one reader/pipeline."""
    return {"lmdb": (["--lmdb", tiny.lmdb], "lmdb", os.path.join(tiny.lmdb, "train")),
            "folder": ([tiny.root], "folder", os.path.join(tiny.root, "train")),
            "shards": (["--loader", "shards", tiny_shards], "shards",
                       os.path.join(tiny_shards, "train")),
            "dali": (["--dali", tiny.root], "folder", os.path.join(tiny.root, "train"))}[kind]


def epoch_order(source: str, train: str, nproc: int, batch: int) -> list[int]:
    """Epoch 0's global order at ``nproc`` processes of ``batch``, as the library defines it."""
    settings = loader_settings(source, None, train_path=train, batch_size=batch, seed=SEED)
    order = open_reader(source, train, settings).train_order(settings, DistInfo(0, nproc))
    layout = Layout(nproc, batch, getattr(order, "workers", 0))
    return global_order(order, 0, layout).tolist()


CASES = [  # reader, (processes, batch) saved, (processes, batch) resumed, check the LR
    ("lmdb", (2, 2), (3, 2), True), ("lmdb", (2, 2), (1, 2), False),
    ("lmdb", (1, 4), (1, 8), True), ("lmdb", (1, 4), (1, 2), False),
    ("folder", (2, 2), (1, 4), False), ("shards", (2, 2), (3, 2), False),
    ("dali", (1, 4), (2, 2), False)]


@pytest.mark.parametrize("kind,saved,resumed,check_lr", CASES,
                         ids=[f"{c[0]}-{c[1][0]}x{c[1][1]}-to-{c[2][0]}x{c[2][1]}" for c in CASES])
def test_resume_at_another_layout_continues_the_global_order(tiny, tiny_shards, tmp_path, kind,
                                                             saved, resumed, check_lr):
    if kind == "dali":
        pytest.importorskip("nvidia.dali")
    data, source, train = data_flags(kind, tiny, tiny_shards)
    schedule = ["--lr-scheduler", "cosine", "--lr", "0.05"]
    killed, out = str(tmp_path / "killed"), str(tmp_path / "resumed")
    kill_at_step([*data, *layout_flags(*saved), *schedule, "--output-dir", killed],
                 str(tmp_path / "trace-killed"), 3)
    position = saved_position(killed)
    trace = str(tmp_path / "trace-resumed")
    result = run_cli(*data, *layout_flags(*resumed), *schedule, "--output-dir", out, "--resume",
                     os.path.join(killed, "checkpoint.pth.tar"), env=traced_env(trace))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resume: epoch 0 goes on after" in result.stdout
    before = traced_batches(str(tmp_path / "trace-killed"), before=position["batch"])
    after = traced_batches(trace)
    trained = [i for batch in before + after for i in batch]
    assert len(trained) == len(set(trained))  # no sample twice
    order = epoch_order(source, train, *saved)
    assert position["consumed"] == sum(map(len, before))
    assert sorted(trained) == sorted(order[:len(trained)])  # the global order's first ones
    new_step = resumed[0] * resumed[1]
    assert len(order) - len(trained) < new_step  # all but a tail under one global batch
    assert only_record(out)["train_images"] == len(trained)
    if check_lr:
        reference = str(tmp_path / "uninterrupted")
        run(main_cmd(*data, *layout_flags(*resumed), *schedule, "--output-dir", reference))
        lrs, expected = step_lrs(out), step_lrs(reference)
        first = min(lrs)
        assert lrs[first] == pytest.approx(expected[first], rel=1e-6)
        steps = len(expected)  # steps per epoch at the new layout (one epoch)
        assert abs(first / steps - position["consumed"] / len(order)) <= 1 / steps
