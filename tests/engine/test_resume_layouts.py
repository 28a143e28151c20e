"""A run SIGKILLed mid-epoch and resumed at another world size or batch size (gloo on CPU, ranks
started as torchrun starts them: tests.helpers.ranks; the ``tiny`` set's 32 training images):
the epoch's global order goes on, each sample trained at most once, the trained samples the
global order's first (less a tail under one new global batch), ``train_images`` the count, the
LR at the first resumed step the uninterrupted run's at that step of the new batching; what
cannot continue exactly is refused in one line."""
import glob
import os

import pytest

from tests.helpers.ranks import run_ranks
from tests.helpers.runs import cli_in_process, only_record
from tests.helpers.traces import (epoch_order, kill_at_step, layout_flags, saved_position,
                                  step_lrs, traced_batches, traced_env)


def data_flags(kind: str, tiny, tiny_shards) -> tuple[list[str], str, str]:
    """``(main.py data flags, reader source, train split)`` of one reader/pipeline."""
    return {"lmdb": (["--lmdb", tiny.lmdb], "lmdb", os.path.join(tiny.lmdb, "train")),
            "folder": ([tiny.root], "folder", os.path.join(tiny.root, "train")),
            "shards": (["--loader", "shards", tiny_shards], "shards",
                       os.path.join(tiny_shards, "train")),
            "dali": (["--dali", tiny.root], "folder", os.path.join(tiny.root, "train")),
            "decode": ([tiny.root, "--decode-device", "cpu-nvimgcodec"], "folder",
                       os.path.join(tiny.root, "train"))}[kind]


CASES = [  # reader, (processes, batch) saved, (processes, batch) resumed, check the LR
    ("lmdb", (2, 2), (3, 2), True),
    ("lmdb", (1, 4), (1, 8), True), ("lmdb", (1, 4), (1, 2), False),
    ("folder", (2, 2), (1, 4), False), ("shards", (2, 2), (3, 2), False),
    ("dali", (1, 4), (2, 2), False), ("decode", (2, 2), (1, 2), False)]


@pytest.mark.slow
@pytest.mark.parametrize("kind,saved,resumed,check_lr", CASES,
                         ids=[f"{c[0]}-{c[1][0]}x{c[1][1]}-to-{c[2][0]}x{c[2][1]}" for c in CASES])
def test_resume_at_another_layout_continues_the_global_order(tiny, tiny_shards, tmp_path, kind,
                                                             saved, resumed, check_lr):
    if kind == "dali":
        pytest.importorskip("nvidia.dali")
    if kind == "decode":
        pytest.importorskip("nvidia.nvimgcodec")
    data, source, train = data_flags(kind, tiny, tiny_shards)
    schedule = ["--lr-scheduler", "cosine", "--lr", "0.05"]
    killed, out = str(tmp_path / "killed"), str(tmp_path / "resumed")
    kill_at_step([*data, *layout_flags(saved[1]), *schedule, "--output-dir", killed],
                 str(tmp_path / "trace-killed"), 3, world=saved[0])
    position = saved_position(killed)
    trace = str(tmp_path / "trace-resumed")
    result = run_ranks([*data, *layout_flags(resumed[1]), *schedule, "--output-dir", out,
                        "--resume", os.path.join(killed, "checkpoint.pth.tar")], resumed[0],
                       env=traced_env(trace))
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
        run_ranks([*data, *layout_flags(resumed[1]), *schedule, "--output-dir", reference],
                  resumed[0])
        lrs, expected = step_lrs(out), step_lrs(reference)
        first = min(lrs)
        assert lrs[first] == pytest.approx(expected[first], rel=1e-6)
        steps = len(expected)  # steps per epoch at the new layout (one epoch)
        assert abs(first / steps - position["consumed"] / len(order)) <= 1 / steps


@pytest.fixture(scope="module")
def killed(tiny, tiny_shards, tmp_path_factory):
    """Checkpoints of runs SIGKILLed at step 3 of 8 at one process of -b 4: ``lmdb`` and
    ``shards`` (local files) output folders."""
    root = tmp_path_factory.mktemp("killed")
    outs = {}
    for kind in ("lmdb", "shards"):
        data, _, _ = data_flags(kind, tiny, tiny_shards)
        outs[kind] = str(root / kind)
        kill_at_step([*data, *layout_flags(4), "--output-dir", outs[kind]],
                     str(root / f"trace-{kind}"), 3)
    return outs


def resume_fails(capfd, data: list[str], checkpoint: str, *flags) -> str:
    """Resume ``checkpoint`` (in this process): it must fail with one ``main.py: error:`` line,
    returned."""
    result = cli_in_process([*data, *flags, "--resume", checkpoint], capfd)
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("main.py: error: --resume ")
    return lines[0]


def edited(out: str, tmp_path, edit) -> str:
    """A copy of ``out``'s checkpoint changed by ``edit(checkpoint)``."""
    import torch

    checkpoint = torch.load(os.path.join(out, "checkpoint.pth.tar"), weights_only=True)
    edit(checkpoint)
    path = str(tmp_path / "edited.pth.tar")
    torch.save(checkpoint, path)
    return path


def test_a_checkpoint_without_a_position_resumes_only_at_its_layout(tiny, killed, tmp_path,
                                                                      capfd):
    """A mid-epoch checkpoint of before this change (no ``position``): refused in one line at
    another -b, resumed at its own."""
    old = edited(killed["lmdb"], tmp_path, lambda c: c.pop("position"))
    data = ["--lmdb", tiny.lmdb, "--output-dir", str(tmp_path / "out")]
    line = resume_fails(capfd, data, old, *layout_flags(8))
    assert "before positions were recorded" in line and "-b 4" in line
    result = cli_in_process([*data, *layout_flags(4), "--resume", old], capfd)
    assert result.returncode == 0 and ", batch " in result.stdout, result.stderr[-2000:]
    assert only_record(str(tmp_path / "out"))["train_images"] == 32


@pytest.mark.parametrize("edit,flags,words", [
    (lambda c: c["position"].update(num_samples=40), [], "this training set has 32"),
    (lambda c: None, ["--seed", "4"], "resume with --seed 3"),
    (lambda c: c["position"].update(consumed=60), ["-b", "8"], "does not fit"),
])
def test_a_position_of_another_epoch_order_is_refused_in_one_line(tiny, killed, tmp_path, edit,
                                                                  flags, words, capfd):
    path = edited(killed["lmdb"], tmp_path, edit)
    line = resume_fails(capfd, ["--lmdb", tiny.lmdb, *layout_flags(4), *flags, "--output-dir",
                         str(tmp_path / "out")], path)
    assert words in line


def test_streamed_shards_resume_at_their_layout_only(tiny_shards, killed, tmp_path, capfd):
    """A stream cannot be dealt anew: at -b 8 refused in one line saying what to do; at the
    saved layout it resumes."""
    shards = sorted(glob.glob(os.path.join(tiny_shards, "train", "train-*.tar")))
    stream = f"pipe:cat {os.path.join(tiny_shards, 'train', 'train-')}" + (
        "{000000..%06d}.tar" % (len(shards) - 1))
    data = ["--loader", "shards", tiny_shards, "--train", stream, "--output-dir",
            str(tmp_path / "out")]
    checkpoint = os.path.join(killed["shards"], "checkpoint.pth.tar")
    line = resume_fails(capfd, data, checkpoint, *layout_flags(8))
    assert "streamed shards" in line and "resume with that layout" in line
    result = cli_in_process([*data, *layout_flags(4), "--resume", checkpoint], capfd)
    assert result.returncode == 0, result.stderr[-2000:]
    assert only_record(str(tmp_path / "out"))["train_images"] == 32
