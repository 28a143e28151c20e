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


def store_digest(path: str) -> str:
    """SHA-256 over what a written store holds: an LMDB's every key and value in key order; a
    shard folder's every file but ``progress.json`` (its fingerprint has the sources' mtimes),
    by name. Equal digests: the same store, byte for byte where it matters."""
    import hashlib
    import os

    import lmdb

    digest = hashlib.sha256()
    if os.path.isfile(os.path.join(path, "data.mdb")):
        env = lmdb.open(path, readonly=True, lock=False)
        try:
            with env.begin() as txn:
                for key, value in txn.cursor():
                    digest.update(len(key).to_bytes(8, "little") + key
                                  + len(value).to_bytes(8, "little") + value)
        finally:
            env.close()
        return digest.hexdigest()
    for name in sorted(os.listdir(path)):
        if name != "progress.json":
            with open(os.path.join(path, name), "rb") as f:
                data = f.read()
            digest.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def raw_records(db: str) -> list[bool]:
    """Whether each record of the LMDB ``db`` is a raw-pixel record (decode.raw)."""
    from decode.raw import is_raw

    meta = codec.read_meta(db)
    with codec.open_readonly(db).begin() as txn:
        return [is_raw(codec.decode_record(txn.get(codec.record_key(i)))[0])
                for i in range(meta.count)]
