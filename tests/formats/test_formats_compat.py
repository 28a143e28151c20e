"""Databases and shards written before ``formats/`` existed read and verify unchanged.

``tests/fixtures/formats_v1/`` was written by the converters of commit a6452e7 (the last layout
with the codecs under ``loaders/``) from ``src/``: 9 generated JPEGs, a progressive JPEG and a
PNG named ``.JPEG`` (both re-encoded) and a text file (skipped); the LMDB with
``--shuffle-seed 3``, the shards with ``--max-per-shard 5``. ``expected.json`` holds the SHA-256
and label of every record as that code read them back.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil

import pytest
import torch

import folder2lmdb
import folder2shards
import main
import formats.lmdb
import formats.shards
from formats.shards.locations import resolve_split
from loaders.readers.lmdb_records import LMDBReader
from loaders.readers.shards import ShardReader
from tests.helpers.paths import REPO
from tests.helpers.runs import read_metrics, small_run

FIXTURE = os.path.join(REPO, "tests", "fixtures", "formats_v1")


@pytest.fixture
def legacy(tmp_path):
    """A writable copy of the fixture (LMDB opens its lock file beside data.mdb)."""
    root = tmp_path / "formats_v1"
    shutil.copytree(FIXTURE, root)
    with open(root / "expected.json") as f:
        return str(root), json.load(f)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_old_lmdb_reads_record_for_record(legacy):
    root, expected = legacy
    meta = formats.lmdb.read_meta(os.path.join(root, "lmdb"))
    assert meta.version == formats.lmdb.BASE_VERSION == 1 and formats.lmdb.FORMAT_VERSION == 2
    assert list(meta.classes) == expected["classes"] and meta.shuffle_seed == 3
    dataset = LMDBReader(os.path.join(root, "lmdb"))
    records = [[_digest(data), label] for data, label in map(dataset.read, range(len(dataset)))]
    assert records == expected["lmdb_records"]


def test_old_shards_read_record_for_record(legacy):
    root, expected = legacy
    index, urls = resolve_split(os.path.join(root, "shards"))
    assert index.classes == expected["classes"] and len(urls) == 3
    records = ShardReader(index, urls)
    got = [[_digest(data), label] for data, label in map(records.read, range(len(records)))]
    assert got == expected["shard_records"]


def test_old_outputs_verify_against_their_source(legacy):
    root, _ = legacy
    src = os.path.join(root, "src")
    assert folder2lmdb.main(["--verify", os.path.join(root, "lmdb"), "--dataset", src]) == 0
    assert folder2shards.main(["--verify", os.path.join(root, "shards"), "--dataset", src]) == 0


def test_old_lmdb_trains_through_the_loader(legacy, tmp_path):
    """``main.py --lmdb`` trains an epoch on it (as train and val split) and validates every
    record, labels as expected."""
    root, expected = legacy
    data = tmp_path / "data"
    for split in ("train", "val"):
        shutil.copytree(os.path.join(root, "lmdb"), data / split)
    out = str(tmp_path / "out")
    last = main.main(["--lmdb", str(data), *small_run(batch=4), "--epochs", "1",
                      "--output-dir", out])
    count = len(expected["lmdb_records"])
    assert [r["epoch"] for r in read_metrics(out)] == [0]
    assert last["train_images"] == count // 4 * 4
    assert last["val_images"] == count and math.isfinite(last["train_loss"])
    state = torch.load(os.path.join(out, "checkpoint.pth.tar"), weights_only=True)
    assert state["state_dict"]["fc.weight"].shape[0] == len(expected["classes"])
