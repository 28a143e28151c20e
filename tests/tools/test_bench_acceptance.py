"""The acceptance rule's benchmarks (``benchmarks.decoders.acceptance``: the measured margins and
costs; ``benchmarks.loading.refused``: the targets through main.py) on small data, and the
benchmarks' use of ``train/`` where a folder has no ``val/``."""
import json
import os

import pytest

from benchmarks import runner
from benchmarks.decoders import acceptance
from benchmarks.loading import refused
from tests.helpers import warm


@pytest.fixture(autouse=True)
def warm_processes(monkeypatch):
    """``main.py`` processes start warm: tests.helpers.warm stands in for ``subprocess``."""
    monkeypatch.setattr(runner, "subprocess", warm)


def test_decoders_acceptance_prints_every_corpus_and_the_costs(tiny, tmp_path, capsys):
    out = tmp_path / "acceptance.json"
    assert acceptance.main(["--data", tiny.root, "--images", "8", "--rounds", "1",
                                    "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| real, as stored | 8 |" in printed and "per image, one thread: check" in printed
    report = json.loads(out.read_text())
    corpora = report["corpora"]
    assert corpora["real, as stored"]["refused"] == 0
    assert corpora["real, 65,000 x 65,000"]["refused"] == 8  # every bomb, every flip
    assert corpora["real, one-bit height flip"]["refused"] == 8
    assert min(c["bound_ratio"][0] for name, c in corpora.items()
               if c["bound_ratio"] and c["refused"] == 0) >= 1.0
    assert all(report["microseconds"][k] > 0 for k in ("check", "capture", "transform"))


def test_loading_refused_names_each_refusal_once(tmp_path, capsys):
    out = tmp_path / "refused.json"
    assert refused.main(["--images", "40", "-b", "7", "--rounds", "1", "--only", "folder",
                               "lmdb", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["loader"] for r in rows] == ["folder", "lmdb"]
    for row in rows:
        assert {name: len(lines) for name, lines in row["lines"].items()} == {
            "bomb": 1, "flipped_height": 1} and row["raw_libjpeg_lines"] == 0
        assert row["seconds_damaged"] > 0 and row["worker_mib_damaged"] > 0
    assert "| folder | 1, 1 | 0 |" in capsys.readouterr().out


def test_a_folder_without_val_lends_its_train_split(tiny, tmp_path):
    data = tmp_path / "only-train"
    data.mkdir()
    os.symlink(os.path.join(tiny.root, "train"), data / "train")
    assert runner.split_folder(str(data), "val") == str(data / "train")
    copies = runner.replicate(str(data), str(tmp_path / "copies"), 1)
    assert sorted(os.listdir(os.path.join(copies, "val"))) == sorted(
        os.listdir(os.path.join(copies, "train")))
    with pytest.raises(FileNotFoundError, match="no train/ folder"):
        runner.split_folder(str(tmp_path / "nothing"), "train")
