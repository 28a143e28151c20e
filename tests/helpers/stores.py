"""Checking a written data store against its source."""
from __future__ import annotations

from torchvision.datasets import ImageFolder

import formats.lmdb as codec


def check_db_matches_folder(db: str, folder: str) -> None:
    """Every record equals the source file's bytes and ImageFolder's label, in order."""
    reference = ImageFolder(folder)
    meta = codec.read_meta(db)
    assert meta.count == len(reference.samples)
    assert list(meta.classes) == reference.classes
    env = codec.open_readonly(db)
    with env.begin() as txn:
        for index, (path, label) in enumerate(reference.samples):
            data, stored_label = codec.decode_record(txn.get(codec.record_key(index)))
            with open(path, "rb") as f:
                assert data == f.read(), path
            assert stored_label == label, path
        assert txn.get(codec.record_key(meta.count)) is None
