"""folder2shards.py: byte-for-byte round trips (generated data and the sample), DALI's own
``wds2idx.py`` index, class mixing, shard limits, resume, damaged files, --verify, one-line
errors, and ``make convert-imagenet FORMAT=shards``."""
import glob
import json
import os
import shutil
import sys
import sysconfig
import tarfile

import pytest
from torchvision.datasets import ImageFolder

import folder2shards
from formats import images as image_check
from formats.shards import INDEX_NAME, ShardIndex, idx_name
from formats.shards.locations import resolve_split
from loaders.readers.shards import ShardReader
from tools import datagen
from tests.helpers import warm
from tests.helpers.badcorpus import make_bad_corpus
from tests.helpers.paths import REPO
from tests.helpers.runs import make

WDS2IDX = os.path.join(sysconfig.get_paths()["purelib"], "wds2idx.py")  # installed with DALI


def convert(src, out, **kwargs):
    kwargs.setdefault("workers", 2)
    return folder2shards.convert(str(src), str(out), progress=False, **kwargs)


def read_shards(out):
    """``[(shard name, [(key, image bytes, label), ...]), ...]`` in index order, by tarfile."""
    index = ShardIndex.from_json(open(os.path.join(out, INDEX_NAME)).read())
    shards = []
    for shard in index.shards:
        with tarfile.open(os.path.join(out, shard["name"])) as tar:
            members = [(m.name, tar.extractfile(m).read()) for m in tar]
        names = [n for n, _ in members]
        assert names[0::2] == [n[:-4] + ".jpg" for n in names[1::2]]  # KEY.jpg, KEY.cls pairs
        shards.append((shard["name"], [(n[:-4], data, int(label)) for (n, data), (_, label)
                                       in zip(members[0::2], members[1::2])]))
    return index, shards


def files_of(folder):
    return {name: open(os.path.join(folder, name), "rb").read()
            for name in sorted(os.listdir(folder))}


def check_round_trip(src, out):
    """Every source file is one record: its bytes, ImageFolder's label; index.json matches."""
    reference = ImageFolder(str(src))
    index, shards = read_shards(out)
    assert index.classes == reference.classes
    records = [r for _, rs in shards for r in rs]
    assert len(records) == index.records == len(reference.samples)
    by_key = {key: (data, label) for key, data, label in records}
    for path, label in reference.samples:
        wnid = reference.classes[label]
        stem = os.path.splitext(os.path.basename(path))[0]
        with open(path, "rb") as f:
            assert by_key[f"{wnid}/{stem}"] == (f.read(), label), path
    for shard, (name, rs) in zip(index.shards, shards):
        assert shard["name"] == name and shard["records"] == len(rs)
        assert shard["bytes"] == os.path.getsize(os.path.join(out, name))
    return index, shards


@pytest.fixture(scope="module")
def tiny_shards(tiny, tmp_path_factory):
    """``tiny``'s train split in shards of at most 10 records (32 records: 4 shards)."""
    out = str(tmp_path_factory.mktemp("tiny-shards") / "train")
    summary = convert(os.path.join(tiny.root, "train"), out, max_per_shard=10)
    return os.path.join(tiny.root, "train"), out, summary


def test_generated_folder_round_trips_byte_for_byte(tiny_shards):
    src, out, summary = tiny_shards
    index, shards = check_round_trip(src, out)
    assert [len(rs) for _, rs in shards] == [10, 10, 10, 2]
    assert [n for n, _ in shards] == [f"train-00000{i}.tar" for i in range(4)]
    assert index.seed == 0 and index.rules == image_check.RULES_VERSION
    assert summary.images == 32 and summary.shards == 4 and summary.skipped == 0
    assert "wrote 32 images" in summary.line() and summary.line().endswith("; 4 shards")
    # The reader reads the same records, by the .idx offsets.
    dataset = ShardReader(*resolve_split(out))
    assert [dataset.read(i) for i in range(len(dataset))] == \
        [(data, label) for _, rs in shards for _, data, label in rs]


def test_sample_round_trips_byte_for_byte(sample_images, tmp_path):
    for split in ("train", "val"):
        src = os.path.join(sample_images, split)
        summary = convert(src, tmp_path / split, shard_size=1 << 20)
        index, _ = check_round_trip(src, str(tmp_path / split))
        assert summary.shards == len(index.shards) > 1 and summary.reencoded == 0
        assert all(s["bytes"] <= 1 << 20 for s in index.shards)
    assert folder2shards.main(["--verify", str(tmp_path / "val"), "--dataset",
                               os.path.join(sample_images, "val")]) == 0


@pytest.mark.skipif(not os.path.isfile(WDS2IDX), reason="DALI's wds2idx.py not installed")
def test_idx_files_equal_dalis_wds2idx(tiny_shards, tmp_path):
    _, out, _ = tiny_shards
    for name in sorted(n for n in os.listdir(out) if n.endswith(".tar")):
        made = tmp_path / name.replace(".tar", ".idx")
        warm.run([sys.executable, WDS2IDX, os.path.join(out, name), str(made)],
                       check=True, capture_output=True, timeout=60)
        assert open(os.path.join(out, idx_name(name))).read() == made.read_text()


def test_every_shard_mixes_the_classes(tmp_path):
    datagen.make_split(str(tmp_path / "src"), 10, 6, seed=3, min_size=16, max_size=24)
    convert(tmp_path / "src", tmp_path / "out", max_per_shard=20)
    _, shards = read_shards(str(tmp_path / "out"))
    for _, records in shards:  # sorted order would give 3-4 classes per shard of 20
        assert len({label for _, _, label in records}) >= 8
    again = tmp_path / "again"
    convert(tmp_path / "src", again, max_per_shard=20, shuffle_seed=1)
    assert files_of(tmp_path / "out") != files_of(again)  # another seed, another order


def test_shard_size_bounds_each_file(tiny_shards, tmp_path):
    src, _, _ = tiny_shards
    limit = 40 << 10
    convert(src, tmp_path / "out", shard_size=limit)
    _, shards = read_shards(str(tmp_path / "out"))
    sizes = [os.path.getsize(tmp_path / "out" / name) for name, _ in shards]
    assert len(shards) > 2 and all(size <= limit for size in sizes)
    for (_, records), (_, following), size in zip(shards, shards[1:], sizes):
        # The next record (header + padded data, and its .cls) would not have fitted.
        grown = size + 512 + -(-len(following[0][1]) // 512) * 512 + 1024
        assert grown > limit, (size, len(following[0][1]))
    one_each = convert(src, tmp_path / "tiny-limit", shard_size=1)  # at least one per shard
    assert one_each.shards == 32


def test_parse_size_suffixes():
    assert folder2shards.parse_size("512M") == 512 << 20
    assert folder2shards.parse_size("1G") == folder2shards.parse_size("1GiB") == 1 << 30
    assert folder2shards.parse_size("4096") == 4096
    for bad in ("0", "-1", "1X", "lots"):
        with pytest.raises(ValueError):
            folder2shards.parse_size(bad)


def test_resume_after_an_interruption_equals_an_uninterrupted_run(tiny_shards, tmp_path,
                                                                  monkeypatch):
    src, reference, _ = tiny_shards
    out = tmp_path / "train"
    save = folder2shards.ResumeState.save

    def interrupted_after_first_shard(self, path):
        save(self, path)
        if len(self.shards) == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(folder2shards.ResumeState, "save", interrupted_after_first_shard)
    with pytest.raises(KeyboardInterrupt):
        convert(src, out, max_per_shard=10)
    monkeypatch.setattr(folder2shards.ResumeState, "save", save)
    assert INDEX_NAME not in os.listdir(out)
    first = os.stat(out / "train-000000.tar").st_mtime_ns
    (out / "train-000001.tar").write_bytes(b"an unfinished shard")  # no .idx: rewritten
    summary = convert(src, out, max_per_shard=10)
    assert summary.resumed_at > 0 and summary.images == 32 and summary.shards == 4
    assert os.stat(out / "train-000000.tar").st_mtime_ns == first  # kept, not rewritten
    assert files_of(out) == files_of(reference)
    # Shards lost with index.json: the same command writes them again.
    for name in (INDEX_NAME, "train-000002.tar", "train-000003.tar", "train-000003.idx"):
        os.remove(out / name)
    assert convert(src, out, max_per_shard=10).resumed_at == 20
    assert files_of(out) == files_of(reference)


def test_existing_output_needs_overwrite(tiny_shards, tmp_path, capsys):
    src = str(tmp_path / "src")
    shutil.copytree(tiny_shards[0], src)
    out = str(tmp_path / "train")
    convert(src, out, max_per_shard=10)
    with pytest.raises(folder2shards.ConversionError, match="complete conversion.*--overwrite"):
        convert(src, out, max_per_shard=10)
    os.remove(os.path.join(out, INDEX_NAME))  # unfinished, and other settings
    with pytest.raises(folder2shards.ConversionError,
                       match=r"with other settings \(--max-per-shard 10 then, --max-per-shard 12 "
                             r"now\); pass --overwrite to start over"):
        convert(src, out, max_per_shard=12)
    assert convert(src, out, max_per_shard=12, overwrite=True).shards == 3
    assert not os.path.exists(os.path.join(out, "train-000003.tar"))
    os.remove(os.path.join(out, INDEX_NAME))
    first = sorted(glob.glob(os.path.join(src, "*", "*")))[0]
    os.remove(first)  # another source: refused, naming it
    with pytest.raises(folder2shards.ConversionError, match=r"of other files \(the listing "
                       r"differs: 32 files then, 31 now\)"):
        convert(src, out, max_per_shard=12)
    with open(os.path.join(out, "progress.json"), "w") as f:  # an older converter's
        json.dump({"settings": {"fingerprint": "00"}, "shards": []}, f)
    with pytest.raises(folder2shards.ConversionError, match="resume state is missing or "
                       "unreadable .*; pass --overwrite to start over"):
        convert(src, out, max_per_shard=12)


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    corpus = make_bad_corpus(str(root / "src"))
    result = run_cli("-d", corpus.root, "-o", str(root / "out"), "-j", "2",
                     "--max-per-shard", "5")
    assert result.returncode == 0, result.stderr
    return corpus, str(root / "out"), result


def run_cli(*args):
    return warm.run([sys.executable, "folder2shards.py", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_damaged_files_are_skipped_and_listed(bad):
    corpus, out, result = bad
    index, shards = read_shards(out)
    assert index.classes == ["n01", "n02 empty", "n03"] and index.records == len(corpus.kept)
    with open(os.path.join(out, "skipped.tsv"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert lines[0] == "path\treason"
    rows = dict(line.split("\t") for line in lines[1:])
    assert set(rows) == set(corpus.skipped)
    for path, reason in rows.items():
        assert corpus.skipped[path] in reason, (path, reason)
    records = {key: (data, label) for _, rs in shards for key, data, label in rs}
    assert len(records) == len(corpus.kept)
    assert "n01/name_with_spaces" in records  # spaces would break the .idx format
    for rel, label in corpus.kept.items():
        checked = image_check.check_file(os.path.join(corpus.root, rel))
        assert (checked.data, label) in records.values(), rel
        assert (checked.reencoded is not None) == (rel in corpus.reencoded), rel
    assert result.stdout.startswith("wrote 20 images") and "re-encoded 10, skipped 8" in \
        result.stdout and result.stdout.strip().endswith("; 4 shards")
    assert "'n02 empty' is empty" in result.stderr


def test_verify_with_dataset_accepts_reencoded_and_skipped_files(bad):
    corpus, out, _ = bad
    result = run_cli("--verify", out, "--dataset", corpus.root, "-j", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"verified {out}: OK (20 records in 4 shards")
    assert result.stderr == ""


def test_strict_fails_on_the_first_non_image(bad, tmp_path):
    corpus, _, _ = bad
    result = run_cli("-d", corpus.root, "-o", str(tmp_path / "out"), "--strict")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("folder2shards.py: error: ")
    assert "--strict" in errors[0] and corpus.root in errors[0]


def verify_lines(capsys, *args):
    status = folder2shards.main(["--verify", *map(str, args)])
    captured = capsys.readouterr()
    return status, captured.out.strip().splitlines(), captured.err.strip().splitlines()


def test_verify_names_a_flipped_byte_and_a_missing_shard(tiny_shards, tmp_path, capsys):
    src, reference, _ = tiny_shards
    out = tmp_path / "train"
    shutil.copytree(reference, out)
    status, stdout, stderr = verify_lines(capsys, out, "--dataset", src)
    assert status == 0 and len(stdout) == 1 and "OK (32 records in 4 shards" in stdout[0]
    assert stderr == []
    shard = out / "train-000001.tar"
    data = bytearray(shard.read_bytes())
    data[512 + 300] ^= 0xFF  # inside the first record's image data: the tar still parses
    shard.write_bytes(bytes(data))
    status, stdout, stderr = verify_lines(capsys, out)
    assert status == 1 and "1 problems" in stdout[0]
    assert stderr == ["folder2shards.py: train-000001.tar: SHA-256 differs from the "
                      "conversion's (changed since)"]
    status, _, stderr = verify_lines(capsys, out, "--dataset", src)
    assert status == 1 and len(stderr) == 2 and "image bytes differ from the source" in stderr[1]
    shutil.copy(os.path.join(reference, "train-000001.tar"), shard)
    os.remove(out / "train-000002.tar")
    status, stdout, stderr = verify_lines(capsys, out)
    assert status == 1 and stderr == ["folder2shards.py: train-000002.tar: missing"]
    os.remove(out / INDEX_NAME)
    status, _, stderr = verify_lines(capsys, out)
    assert status == 1 and len(stderr) == 1 and "no index.json" in stderr[0]


@pytest.mark.parametrize("case, message", [
    ("missing", "no such directory"),
    ("no images", "none of its 2 files is an image"),
    ("output is a file", "exists and is not a directory"),
    ("foreign files", "holds files other than shards (notes.txt)"),
    ("inside the dataset", "inside the dataset folder"),
    ("bad size", "--shard-size: not a size in bytes"),
    ("bad prefix", "--prefix 'a b'"),
])
def test_bad_input_is_one_line_error(tiny, tmp_path, capsys, case, message):
    source, out, extra = os.path.join(tiny.root, "val"), str(tmp_path / "out"), []
    if case == "missing":
        source = str(tmp_path / "missing")
    elif case == "no images":
        source = str(tmp_path / "src")
        for name in ("a", "b"):
            os.makedirs(os.path.join(source, name))
            with open(os.path.join(source, name, "x.JPEG"), "w") as f:
                f.write("<html>not found</html>")
    elif case == "output is a file":
        (tmp_path / "out").write_text("a file")
    elif case == "foreign files":
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "notes.txt").write_text("keep me")
    elif case == "inside the dataset":
        out = os.path.join(source, "n00000000", "shards")
    extra = {"bad size": ["--shard-size", "lots"], "bad prefix": ["--prefix", "a b"]}.get(case, [])
    status = folder2shards.main(["-d", source, "-o", out, "-j", "1", *extra])
    lines = [line for line in capsys.readouterr().err.strip().splitlines()
             if ": source: " not in line]  # the layout line
    assert status == 1 and len(lines) == 1, lines
    assert lines[0].startswith("folder2shards.py: error: ") and message in lines[0]
    if case == "foreign files":
        assert (tmp_path / "out" / "notes.txt").read_text() == "keep me"


def test_cli_error_has_no_traceback(tmp_path):
    result = run_cli("-d", str(tmp_path / "missing"), "-o", str(tmp_path / "out"))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"folder2shards.py: error: {tmp_path / 'missing'}: " \
                                    "no such directory"


@pytest.mark.skipif(shutil.which("make") is None, reason="GNU make not installed")
def test_make_convert_imagenet_format_shards():
    result = make("-n", "convert-imagenet", "IMAGENET=/in", "OUT=/out", "FORMAT=shards")
    assert result.returncode == 0, result.stderr
    assert "folder2shards.py --dataset /in --split train -o /out/train -j 8 --shuffle-seed 0" \
        in result.stdout
    assert "folder2shards.py --dataset /in --split val -o /out/val -j 8\n" in result.stdout
    default = make("-n", "convert-imagenet", "IMAGENET=/in", "OUT=/out").stdout
    assert "folder2lmdb.py --dataset /in --split train -o /out/train -j 8 --shuffle-seed 0" \
        in default
    partial = make("-n", "convert-imagenet", "IMAGENET=/in", "OUT=/out", "ALLOW_PARTIAL=1").stdout
    assert "--split val -o /out/val -j 8 --allow-partial\n" in partial
