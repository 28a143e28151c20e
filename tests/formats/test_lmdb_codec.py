import msgpack
import pytest

import formats.lmdb as codec


def test_record_keys_sort_in_index_order():
    keys = [codec.record_key(i) for i in (0, 1, 9, 10, 99, 1_281_166)]
    assert keys == sorted(keys)
    assert codec.record_key(42) == b"0000000042"


def test_record_round_trip_keeps_bytes_and_label():
    data = bytes(range(256)) * 3
    value = codec.encode_record(data, 7)
    assert msgpack.unpackb(value, raw=False) == [data, 7]  # the documented on-disk layout
    assert codec.decode_record(value) == (data, 7)


def test_malformed_record_raises_format_error():
    with pytest.raises(codec.LMDBFormatError):
        codec.decode_record(b"\xc1not msgpack")


def test_meta_round_trip():
    meta = codec.Metadata(count=3, classes=("n01", "n02"))
    assert codec.decode_meta(codec.encode_meta(meta), "db") == meta
    shuffled = codec.Metadata(count=3, classes=("n01", "n02"), shuffle_seed=7)
    assert codec.decode_meta(codec.encode_meta(shuffled), "db").shuffle_seed == 7


def test_meta_without_shuffle_seed_reads_as_class_sorted():
    """Databases written before --shuffle-seed existed have no such key."""
    old = msgpack.packb({"format": codec.FORMAT_NAME, "version": codec.BASE_VERSION,
                         "count": 2, "classes": ["a"]}, use_bin_type=True)
    assert codec.decode_meta(old, "db") == codec.Metadata(count=2, classes=("a",))


@pytest.mark.parametrize("value, message", [
    (None, "did not finish"),
    (msgpack.packb({"format": "caffe"}), "not an LMDB written by folder2lmdb"),
    (msgpack.packb({"format": codec.FORMAT_NAME, "version": 99, "count": 1, "classes": []}),
     "newer"),
])
def test_bad_meta_is_rejected(value, message):
    with pytest.raises(codec.LMDBFormatError, match=message):
        codec.decode_meta(value, "db")


def test_open_readonly_rejects_image_folder(tmp_path):
    (tmp_path / "n01").mkdir()
    with pytest.raises(codec.LMDBFormatError, match="drop --lmdb"):
        codec.open_readonly(str(tmp_path))


def test_a_run_closes_every_read_only_handle(tiny):
    """``loaders.close_all`` (every way out of ``main.py``) closes this process's read-only
    handles: py-lmdb 3 knows an environment by its files' inodes, so a handle kept on a
    database deleted later refuses a new one that reuses an inode ("already open")."""
    import os

    import loaders

    envs = [codec.open_readonly(os.path.join(tiny.lmdb, split)) for split in ("train", "val")]
    assert all(codec.is_open(env) for env in envs)
    loaders.close_all()
    assert not any(codec.is_open(env) for env in envs)
    again = codec.open_readonly(os.path.join(tiny.lmdb, "train"))  # opens anew
    assert codec.is_open(again) and again is not envs[0]
    codec.close_all_readonly()
    assert not codec.is_open(again)
