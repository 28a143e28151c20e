"""benchmarks/ffcv (python -m benchmarks.ffcv) and make bench-ffcv: FFCV stays in its own environment; without it,
one line; with it (where .ffcv/ has been made), the table on a tiny sample."""
import json
import os
from types import SimpleNamespace

import pytest

from benchmarks.ffcv import compare
from tests.helpers.paths import REPO
from tests.helpers.runs import make

FFCV_PYTHON = os.path.join(REPO, ".ffcv", "bin", "python")


def test_bench_ffcv_without_its_environment_is_one_line(tmp_path, capsys):
    assert compare.main(["--data", str(tmp_path), "--ffcv-python",
                            str(tmp_path / "none" / "python")]) == 1
    assert capsys.readouterr().err.strip().endswith("no FFCV environment (make bench-ffcv "
                                                    "creates it)")


def test_make_bench_ffcv_uses_the_side_environment_never_the_venv():
    result = make("-n", "bench-ffcv", "FFCV_VENV=/tmp/side", "DATA=/data")
    assert result.returncode == 0, result.stderr
    lines = [" ".join(line.split()) for line in result.stdout.replace("\\\n", " ").splitlines()]
    assert any(line.startswith("sh benchmarks/ffcv/setup.sh /tmp/side ") for line in lines)
    assert any("-m benchmarks.ffcv --data /data --ffcv-python /tmp/side/bin/python" in line
               for line in lines)
    setup = open(os.path.join(REPO, "benchmarks", "ffcv", "setup.sh")).read()
    assert "ffcv==1.0.2" in setup and "FOLDER=${1:-.ffcv}" in setup


@pytest.mark.skipif(not os.access(FFCV_PYTHON, os.X_OK), reason="no .ffcv/ (make bench-ffcv)")
def test_bench_ffcv_end_to_end_on_the_tiny_sample(tiny, tmp_path, capsys):
    out = tmp_path / "ffcv"
    assert compare.main(["--data", tiny.root, "--out", str(out), "--repeat", "2",
                            "--sizes", "64", "--rounds", "1", "-b", "4", "-j", "1",
                            "--batches", "2", "--warmup", "1"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert set(report["median"]["64"]) == set(compare.STORES) | {
        "lmdb-512-raw-1.5x", "lmdb-512-raw-2.7x", "lmdb-512-reencoded",
        "lmdb-512-reencoded-raw-2.7x"}
    assert all(v > 0 for v in report["median"]["64"].values())
    # the same-bytes .beton holds the capped LMDB's JPEG bytes, plus FFCV's own layout
    assert report["disk_bytes"]["beton-512"] >= report["image_bytes"]["lmdb-512"]
    # --reencode-all: every record re-encoded at quality 90, a raw share of that smaller store
    reencoded = os.path.join(report["commands_224"]["lmdb-512-reencoded"].split()[-1], "train")
    assert "lmdb-512-reencoded-raw-2.7x" in report["raw"]
    printed = capsys.readouterr().out
    assert "| 64 px |" in printed and "ours, lmdb-512-reencoded " in printed
    assert reencoded.startswith("TMP")


def test_larger_than_keeps_only_images_a_cap_changes(tmp_path, capsys):
    """--larger-than PX: the replicated folder holds the images whose longer side exceeds PX,
    every class folder kept in both splits; a file that is not an image is skipped with one
    line; nothing that large is one line from main()."""
    from PIL import Image

    from benchmarks.runner import replicate
    from tools import datagen

    root = tmp_path / "data"
    datagen.make_dataset(str(root), 2, train_per_class=6, val_per_class=3, seed=1,
                         min_size=40, max_size=90)
    (root / "train" / "n00000000" / "notes.JPEG").write_text("not an image")
    out = replicate(str(root), str(tmp_path / "selected"), 2, compare.longer_side_over(64))
    for split in ("train", "val"):
        assert sorted(os.listdir(os.path.join(out, split))) == ["n00000000", "n00000001"]
        for wnid in ("n00000000", "n00000001"):
            large = set()
            for name in os.listdir(root / split / wnid):
                if name == "notes.JPEG":
                    continue
                with Image.open(root / split / wnid / name) as image:
                    if max(image.size) > 64:
                        stem, ext = os.path.splitext(name)
                        large |= {f"{stem}_0{ext}", f"{stem}_1{ext}"}
            assert set(os.listdir(os.path.join(out, split, wnid))) == large
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "skipping" in err[0] and "notes.JPEG" in err[0]
    python = tmp_path / "python"  # main() checks only that it can run; prepare fails first
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    assert compare.main(["--data", str(root), "--larger-than", "10000", "--ffcv-python",
                            str(python), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"benchmarks.ffcv: error: no training image of {root} to time "
                       "(--larger-than 10000)")


def test_table_shows_each_rounds_same_bytes_ratio(capsys, monkeypatch):
    """The report keeps ours / FFCV per round (the two runs of a round see the same load) beside
    the ratio of the medians, in the JSON and the printed table, each figure with its spread
    (lowest and highest round), under a line naming the image set."""
    runs = {160: {"lmdb": [1500.0, 1550.0, 1540.0], "lmdb-512": [1400.0, 1600.0, 1700.0],
                  "beton-512": [1000.0, 1250.0, 1200.0], "beton-example": [1800.0] * 3}}
    args = SimpleNamespace(repeat=8, rounds=3, batch_size=64, workers=2, batches=100, warmup=20,
                           ffcv_python="ffcv-python", sizes=[160], base=None)
    paths = {"lmdb": "/t/lmdb", "lmdb-512": "/t/lmdb-512", "beton-512": "/t/a.beton",
             "beton-example": "/t/b.beton"}
    # the disk figures are not what this test is about: no stores on disk
    monkeypatch.setattr(compare, "_lmdb_images", lambda db: (2000, 200 << 20))
    monkeypatch.setattr(compare, "_disk", lambda path: 210 << 20)
    rep = compare.report(args, paths, runs, "/t")
    assert rep["same_bytes_ratio_per_round"][160] == [1.4, 1.28, 1700 / 1200]
    compare.print_table(rep)
    out = capsys.readouterr().out
    assert "2000 train images (8 x the all images of" in out and "median [lowest-highest] of 3" in out
    row = next(line for line in out.splitlines() if line.startswith("| 160"))
    assert row == ("| 160 px | 1200 [1000-1250] | 1600 [1400-1700] | 1.33x | 1.40x [1.28x-1.42x] "
                   "| 1540 [1500-1550] | 1.04x | 1800 [1800-1800] |")


def test_a_missing_val_folder_is_one_line(tmp_path, capsys):
    (tmp_path / "data" / "train" / "n0").mkdir(parents=True)
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    assert compare.main(["--data", str(tmp_path / "data"), "--ffcv-python",
                            str(python)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"benchmarks.ffcv: error: {tmp_path / 'data' / 'val'}: no such folder "
                   "(--data holds train/ and val/ class folders)"]


def test_buckets_select_by_longer_side(tmp_path, capsys):
    """--bucket keeps the images of one bucket of longer side; --buckets reports a bucket with
    too few images in one line and goes on."""
    from benchmarks.runner import replicate
    from tools import datagen

    root = tmp_path / "data"
    datagen.make_dataset(str(root), 2, train_per_class=8, val_per_class=2, seed=2,
                         min_size=200, max_size=300)
    for name, (low, high) in compare.BUCKETS.items():
        out = replicate(str(root), str(tmp_path / name), 1, compare.longer_side_over(low, high))
        from PIL import Image
        for d, _, files in os.walk(out):
            for f in files:
                with Image.open(os.path.join(d, f)) as image:
                    assert low < max(image.size) <= high
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    assert compare.main(["--data", str(root), "--buckets", "--min-images", "100",
                            "--ffcv-python", str(python), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert out.count("not timed") == 4 and "fewer than --min-images 100" in out
