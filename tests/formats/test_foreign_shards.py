"""WebDataset shards written by another tool (the ``webdataset`` library's own ``ShardWriter``,
records ``KEY.cls`` + ``KEY.jpg`` + ``KEY.json`` as in ``timm/imagenet-1k-wds``, no
``index.json``) train with ``--loader shards`` after ``folder2shards.py --index``: read in
place and streamed, beside the shards or from an index folder of their own, never rewritten;
classes from the records' ``.json`` or ``--classes``, else one line saying what is needed."""
from __future__ import annotations

import hashlib
import json
import math
import os

import pytest

import folder2shards
import main
from formats.shards import INDEX_NAME, ShardIndex
from formats.shards.locations import resolve_split
from loaders.readers.shards import ShardReader
from tools import replicas
from tests.helpers.runs import read_metrics, small_run


def write_foreign(folder: str, sample: str, split: str) -> list[tuple[bytes, int]]:
    """timm-like shards of the sample (64 records each, the sample's order shuffled);
    returns ``(jpeg bytes, label)`` in writing order."""
    import webdataset as wds

    images = replicas.train_images(sample) if split == "train" else replicas.val_images(sample)
    names = replicas.class_names(sample)
    label_of = {w: n for n, w in enumerate(sorted(names))}
    images = sorted(images, key=lambda i: hashlib.sha256(i[1].encode()).digest())
    os.makedirs(folder)
    written = []
    with wds.ShardWriter(os.path.join(folder, f"imagenet1k-{split}-%04d.tar"), maxcount=64,
                         verbose=0) as sink:
        for wnid, name, path in images:
            data = open(path, "rb").read()
            meta = {"filename": name, "label": label_of[wnid], "class_name": names[wnid]}
            sink.write({"__key__": os.path.splitext(name)[0], "jpg": data,
                        "cls": label_of[wnid], "json": json.dumps(meta).encode()})
            written.append((data, label_of[wnid]))
    return written


def digests(folder: str) -> dict[str, str]:
    return {n: hashlib.sha256(open(os.path.join(folder, n), "rb").read()).hexdigest()
            for n in sorted(os.listdir(folder)) if n.endswith(".tar")}


def read_all(spec: str) -> list[tuple[bytes, int]]:
    index, urls = resolve_split(spec)
    records = ShardReader(index, urls)
    return [records.read(i) for i in range(len(records))]


@pytest.fixture(scope="session")
def foreign(sample_images, tmp_path_factory):
    """``split -> (folder, written)`` of the sample's images (one per class)."""
    root = tmp_path_factory.mktemp("foreign")
    return {split: (str(root / split), write_foreign(str(root / split), sample_images, split))
            for split in ("train", "val")}


def test_indexed_beside_the_shards_reads_every_record(foreign, sample_images, capsys):
    folder, written = foreign["train"]
    before = digests(folder)
    assert folder2shards.main(["--index", folder]) == 0
    n = len(written)
    assert capsys.readouterr().out.startswith(
        f"indexed {n} records of {-(-n // 64)} shards ({n} classes)")
    assert digests(folder) == before  # no shard rewritten
    index = ShardIndex.from_json(open(os.path.join(folder, INDEX_NAME)).read())
    assert index.classes == sorted(replicas.class_names(sample_images))  # the sorted WNIDs
    assert index.names[0] == "tench" and all("url" not in s for s in index.shards)
    assert read_all(folder) == written


def test_index_folder_of_its_own_in_place_and_streamed(foreign, tmp_path):
    """An index folder apart from the shards (read-only or remote shards): local shards by
    offset, and ``pipe:`` streams cut at the offsets of the index folder's ``.idx``."""
    folder, written = foreign["train"]
    local, streamed = str(tmp_path / "local"), str(tmp_path / "streamed")
    pattern = os.path.join(folder, "imagenet1k-train-{0000..%04d}.tar" % (len(digests(folder)) - 1))
    assert folder2shards.main(["--index", pattern, "-o", local]) == 0
    assert read_all(local) == written
    assert folder2shards.main(["--index", f"pipe:cat {pattern}", "-o", streamed]) == 0
    index, urls = resolve_split(streamed)
    assert urls[0] == f"pipe:cat {folder}/imagenet1k-train-0000.tar"
    records = ShardReader(index, urls)
    assert records.streaming and [records.read(i) for i in range(len(records))] == written


def test_val_needs_classes_and_takes_the_train_index(foreign, tmp_path, capsys):
    (train, _), (val, written) = foreign["train"], foreign["val"]
    out = str(tmp_path / "val-index")
    assert folder2shards.main(["--index", val, "-o", out]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "name no WNID for label" in err[0] and "--classes" in err[0]
    assert not os.path.exists(os.path.join(out, INDEX_NAME))
    train_index = str(tmp_path / "train-index")
    assert folder2shards.main(["--index", train, "-o", train_index]) == 0
    assert folder2shards.main(["--index", val, "-o", out, "--classes",
                               os.path.join(train_index, INDEX_NAME)]) == 0
    assert read_all(out) == written


def test_trains_with_the_shard_loader(foreign, tmp_path):
    """``main.py --loader shards`` on the index folders (the shards read in place): two
    training batches, then the whole validation split, labels from the records."""
    (train, _), (val, written) = foreign["train"], foreign["val"]
    data = tmp_path / "data"
    train_index, val_index = str(data / "train"), str(data / "val")
    assert folder2shards.main(["--index", train, "-o", train_index]) == 0
    assert folder2shards.main(["--index", val, "-o", val_index, "--classes",
                               os.path.join(train_index, INDEX_NAME)]) == 0
    out = str(tmp_path / "out")
    last = main.main(["--loader", "shards", str(data), *small_run(batch=4), "--epochs", "1",
                      "--train-batches", "2", "--output-dir", out])
    assert last["train_images"] == 8 and last["val_images"] == len(written)
    assert math.isfinite(last["train_loss"]) and read_metrics(out)[0]["epoch"] == 0


def test_records_without_jpg_or_with_unsorted_labels_are_one_line(tmp_path, capsys):
    import webdataset as wds

    folder = str(tmp_path / "odd")
    os.makedirs(folder)
    with wds.ShardWriter(os.path.join(folder, "odd-%04d.tar"), verbose=0) as sink:
        sink.write({"__key__": "n02000000_1", "png": b"x", "cls": 0})
    assert folder2shards.main(["--index", folder]) == 1
    assert "record n02000000_1 has no .jpg or no .cls" in capsys.readouterr().err
    with wds.ShardWriter(os.path.join(folder, "odd-%04d.tar"), verbose=0) as sink:
        sink.write({"__key__": "n02000000_1", "jpg": b"x", "cls": 0})
        sink.write({"__key__": "n01000000_1", "jpg": b"x", "cls": 1})
    assert folder2shards.main(["--index", folder]) == 1
    assert "labels are not indices into the sorted WNIDs" in capsys.readouterr().err


def test_shards_named_by_a_brace_pattern_keep_the_index_fields(tmp_path):
    """A split given as a brace pattern of some of its shards reads the index as the folder
    does: those shards, in the pattern's order, with the class names and the raw share's
    fields (a raw-share store read without its ``raw`` record would misread raw records)."""
    from formats.shards._codec import ShardIndex

    shards = [{"name": f"shard-{i:06d}.tar", "records": 3, "bytes": 100 + i} for i in range(3)]
    written = ShardIndex(["n01440764", "n01443537"], shards, seed=7, rules=3,
                         names=["tench", "goldfish"], raw={"threshold": 2.5, "bytes": 99})
    written.write(str(tmp_path))
    whole, _ = resolve_split(str(tmp_path))
    index, urls = resolve_split(str(tmp_path / "shard-{000002,000000}.tar"))
    assert [s["name"] for s in index.shards] == ["shard-000002.tar", "shard-000000.tar"]
    assert urls == [str(tmp_path / "shard-000002.tar"), str(tmp_path / "shard-000000.tar")]
    assert (index.classes, index.names, index.raw, index.cap, index.seed, index.rules) == (
        whole.classes, whole.names, whole.raw, whole.cap, whole.seed, whole.rules)
    assert index.names == ["tench", "goldfish"] and index.raw == {"threshold": 2.5, "bytes": 99}
