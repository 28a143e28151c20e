"""WebDataset shards written by another tool (the ``webdataset`` library's own ``ShardWriter``,
records ``KEY.cls`` + ``KEY.jpg`` + ``KEY.json`` as in ``timm/imagenet-1k-wds``, no
``index.json``) train with ``--loader shards`` after ``folder2shards.py --index``: read in
place and streamed, beside the shards or from an index folder of their own, never rewritten;
classes from the records' ``.json`` or ``--classes``, else one line saying what is needed."""
from __future__ import annotations

import hashlib
import json
import os

import pytest

import folder2shards
from formats.shards import INDEX_NAME, ShardIndex
from loaders import DistInfo, build_loaders
from formats.shards.locations import resolve_split
from loaders.readers.shards import ShardReader
from tools import replicas
from tests.helpers.loading import loader_settings


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
def foreign(sample, tmp_path_factory):
    root = tmp_path_factory.mktemp("foreign")
    return {split: (str(root / split), write_foreign(str(root / split), sample, split))
            for split in ("train", "val")}


def test_indexed_beside_the_shards_reads_every_record(foreign, sample, capsys):
    folder, written = foreign["train"]
    before = digests(folder)
    assert folder2shards.main(["--index", folder]) == 0
    assert capsys.readouterr().out.startswith("indexed 250 records of 4 shards (250 classes)")
    assert digests(folder) == before  # no shard rewritten
    index = ShardIndex.from_json(open(os.path.join(folder, INDEX_NAME)).read())
    assert index.classes == sorted(replicas.class_names(sample))  # the sorted WNIDs
    assert index.names[0] == "tench" and all("url" not in s for s in index.shards)
    assert read_all(folder) == written


def test_index_folder_of_its_own_in_place_and_streamed(foreign, tmp_path):
    """An index folder apart from the shards (read-only or remote shards): local shards by
    offset, and ``pipe:`` streams cut at the offsets of the index folder's ``.idx``."""
    folder, written = foreign["train"]
    local, streamed = str(tmp_path / "local"), str(tmp_path / "streamed")
    pattern = os.path.join(folder, "imagenet1k-train-{0000..0003}.tar")
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
    (train, _), (val, _) = foreign["train"], foreign["val"]
    train_index, val_index = str(tmp_path / "train"), str(tmp_path / "val")
    folder2shards.main(["--index", train, "-o", train_index])
    folder2shards.main(["--index", val, "-o", val_index, "--classes",
                        os.path.join(train_index, INDEX_NAME)])
    settings = loader_settings("shards", train_path=train_index, val_path=val_index,
                               train_batches=2, val_batches=2)
    train_loader, val_loader = build_loaders(settings, DistInfo())
    train_loader.set_epoch(0)
    images, labels = next(iter(train_loader))
    assert images.shape == (4, 3, 32, 32) and int(labels.max()) < 250
    assert len(val_loader.reader) == 250


def test_records_without_jpg_or_with_unsorted_labels_are_one_line(sample, tmp_path, capsys):
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
