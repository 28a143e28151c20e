"""folder2shards.py --task I --tasks N without SLURM (the job array's tasks run one after another
here; tests/formats/test_shards_slurm.py runs them as an array): the same files for any N, the
one-process run's where nothing is skipped, per-sample accounting, resume after a kill and with
another N, the settings shared, and the refusals."""
import json
import os
import subprocess
import sys

import pytest

import folder2shards
from formats.shards._array import task_blocks
from tests.helpers.badcorpus import make_bad_corpus
from tests.helpers.paths import REPO
from tools import datagen


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    datagen.make_dataset(str(root), num_classes=5, train_per_class=20, val_per_class=1, min_size=8,
                         max_size=12)
    return os.path.join(str(root), "train")


def run(*args) -> int:
    return folder2shards.main([*map(str, args), "-j", "1"])


def array(src, out, tasks, *flags, order=None):
    """Every task of an array of ``tasks``, in ``order`` (default: last first)."""
    for task in order or reversed(range(tasks)):
        assert run("-d", src, "-o", out, "--max-per-shard", 7, "--task", task, "--tasks", tasks,
                   *flags) == 0


def contents(out) -> dict:
    """Every file but progress.json and the blocks' .done: name -> bytes."""
    names = [n for n in os.listdir(out) if not n.endswith((".done", ".lock"))
             and n != "progress.json"]
    return {n: open(os.path.join(out, n), "rb").read() for n in sorted(names)}


def test_any_task_count_writes_the_one_process_files(source, tmp_path, capsys):
    one = str(tmp_path / "one")
    assert run("-d", source, "-o", one, "--max-per-shard", 7) == 0
    for tasks in (1, 2, 5, 20):  # 100 files: 15 blocks, so some of the 20 tasks have none
        out = str(tmp_path / f"array{tasks}")
        array(source, out, tasks)
        assert contents(out) == contents(one)
        assert run("--verify", out) == 0
    assert "every block done: wrote index.json" in capsys.readouterr().out


def test_skips_are_accounted_for_and_the_same_for_any_task_count(tmp_path):
    corpus = make_bad_corpus(str(tmp_path / "src"))
    outs = []
    for tasks in (1, 3):
        outs.append(str(tmp_path / f"array{tasks}"))
        array(corpus.root, outs[-1], tasks)
    assert contents(outs[0]) == contents(outs[1])
    with open(os.path.join(outs[1], "progress.json")) as f:
        shards = json.load(f)["shards"]
    assert sum(s["records"] for s in shards) == len(corpus.kept)
    with open(os.path.join(outs[1], "skipped.tsv")) as f:
        assert len(f.read().splitlines()) - 1 == len(corpus.skipped)


def test_a_killed_task_and_another_task_count_redo_only_unfinished_blocks(source, tmp_path):
    one, out = str(tmp_path / "one"), str(tmp_path / "out")
    assert run("-d", source, "-o", one, "--max-per-shard", 7) == 0
    array(source, out, 3, order=[0])  # blocks 0-4 done, as if tasks 1 and 2 were killed
    os.remove(os.path.join(out, "train-000001.done"))  # killed inside block 1: its shard
    os.rename(os.path.join(out, "train-000001.tar"),   # half-written, under its .tmp name
              os.path.join(out, "train-000001.tar.tmp"))
    kept = os.stat(os.path.join(out, "train-000002.tar")).st_mtime_ns
    assert not os.path.exists(os.path.join(out, "index.json"))
    array(source, out, 2)
    assert os.stat(os.path.join(out, "train-000002.tar")).st_mtime_ns == kept
    assert contents(out) == contents(one)


def test_every_block_is_taken_once_whatever_the_task_count():
    for blocks in (1, 7, 40):
        for tasks in (1, 3, 4, 50):
            taken = [b for t in range(tasks) for b in task_blocks(blocks, t, tasks)]
            assert taken == list(range(blocks))


def test_refusals_are_one_line(source, tmp_path, capsys):
    out = str(tmp_path / "out")
    assert run("-d", source, "-o", out, "--task", 0, "--tasks", 2) == 1  # no --max-per-shard
    assert run("-d", source, "-o", out, "--max-per-shard", 7, "--task", 2, "--tasks", 2) == 1
    assert run("-d", source, "-o", out, "--max-per-shard", 7, "--tasks", 2) == 1
    array(source, out, 2, order=[0])
    assert run("-d", source, "-o", out, "--max-per-shard", 8, "--task", 1, "--tasks", 2) == 1
    assert run("-d", source, "-o", out, "--max-per-shard", 7) == 1  # one process: not its own
    assert run("-d", source, "-o", out, "--max-per-shard", 7, "--finish") == 1  # block missing
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 6 and "--max-per-shard" in errors[0], errors
    assert "0 <= task < tasks" in errors[1] and "go together" in errors[2]
    assert "with other settings (--max-per-shard 7 then, --max-per-shard 8 now)" in errors[3]
    assert "(--tasks then, no --tasks now)" in errors[4] and "is not done yet" in errors[5]
    array(source, out, 2, order=[1])
    assert run("-d", source, "-o", out, "--max-per-shard", 7, "--finish") == 0  # idempotent


def test_a_raw_share_is_chosen_once_for_the_whole_array(source, tmp_path):
    out = str(tmp_path / "out")
    array(source, out, 3, "--raw-budget", "8x", order=[1])
    with open(os.path.join(out, "progress.json")) as f:
        choice = json.load(f)["raw"]
    array(source, out, 3, "--raw-budget", "8x", order=[0, 2])
    assert run("-d", source, "-o", out, "--max-per-shard", 7, "--raw-budget", "8x",
               "--finish") == 0
    with open(os.path.join(out, "progress.json")) as f:
        assert json.load(f)["raw"] == choice
    with open(os.path.join(out, "index.json")) as f:
        raw = json.load(f)["raw"]
    assert raw["threshold"] == choice["threshold"] and raw["records"] > 0
    assert run("--verify", out) == 0


@pytest.mark.parametrize("layout", ["official", "kaggle", "hf-parquet", "hf-targz"])
def test_each_download_layout_splits_over_tasks(layout, sample_images, tmp_path):
    """Each task reads its own images: of archives with member offsets in place, of Hugging
    Face's front-to-back archives through a staging of its own, deleted after."""
    from tools import replicas

    writer = {"official": replicas.write_official, "kaggle": replicas.write_kaggle,
              "hf-parquet": replicas.write_hf_parquet, "hf-targz": replicas.write_hf_targz}
    download = writer[layout](str(tmp_path / "download"), sample_images)
    one, out = str(tmp_path / "one"), str(tmp_path / "out")
    assert run("-d", download, "--split", "train", "--allow-partial", "-o", one,
               "--max-per-shard", 7) == 0
    array(download, out, 3, "--split", "train", "--allow-partial")
    assert contents(out) == contents(one)
    assert not [n for n in os.listdir(tmp_path) if "staging" in n]


def test_a_block_over_the_byte_limit_goes_on_in_shards_of_its_own_whatever_the_task_count(
        source, tmp_path):
    outs = []
    for tasks in (1, 3):
        outs.append(str(tmp_path / f"array{tasks}"))
        array(source, outs[-1], tasks, "--shard-size", "6K")
    assert contents(outs[0]) == contents(outs[1])
    names = [n for n in contents(outs[1]) if n.endswith(".tar")]
    assert "train-000000-000001.tar" in names and len(names) > 15
    assert run("--verify", outs[1]) == 0


def test_tasks_started_together_share_one_folder(source, tmp_path):
    """As an array's tasks start: at once, each creating the settings and writing its blocks
    beside the others' temporary files; one of them writes the index."""
    one, out = str(tmp_path / "one"), str(tmp_path / "out")
    assert run("-d", source, "-o", one, "--max-per-shard", 3) == 0
    tasks = [subprocess.Popen([sys.executable, "folder2shards.py", "-d", source, "-o", out,
                               "--max-per-shard", "3", "-j", "1", "--task", str(i), "--tasks",
                               "4"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(4)]
    results = [task.communicate(timeout=300) for task in tasks]
    assert [task.returncode for task in tasks] == [0] * 4, [err for _, err in results]
    assert sum("wrote index.json" in stdout for stdout, _ in results) == 1
    assert contents(out) == contents(one)
