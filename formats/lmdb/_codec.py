"""Keys, values and metadata of the LMDB layout (:mod:`formats.lmdb`), shared by the writer, the
verifier and the readers. Keys derive from the index: no side holds a list of keys."""
from __future__ import annotations

import os
import threading
import zlib
from dataclasses import dataclass, field

import lmdb
import msgpack
import numpy as np

from formats.cap import Cap

FORMAT_NAME = "imagenet-lmdb"
FORMAT_VERSION = 2  # the newest this code reads; it writes 1 unless the store has a raw share
BASE_VERSION = 1  # a store of JPEG records only
RAW_VERSION = 2  # records may be raw pixels (decode.raw); the metadata's "raw" says how chosen
META_KEY = b"__meta__"
CHECKSUMS_KEY = b"__checksums__"
PROGRESS_KEY = b"__progress__"  # the resume state; per-batch entries extend it as a prefix
_KEY_DIGITS = 10  # up to 10^10 records; fixed width keeps LMDB's byte order equal to index order


class LMDBFormatError(ValueError):
    """A path is not a complete database in this format (missing, incomplete or foreign)."""


@dataclass(frozen=True)
class Metadata:
    """The metadata record: ``count`` records labelled ``0..len(classes)-1``; ``shuffle_seed``
    (None: class order); ``names`` (or None); ``cap`` (:meth:`formats.cap.Cap.record`), ``raw``
    (:meth:`formats.raw_share.RawChoice.state`)."""

    count: int
    classes: tuple[str, ...]
    version: int = BASE_VERSION
    shuffle_seed: int | None = None
    names: tuple[str, ...] | None = None  # human-readable class names, where the source has them
    cap: dict = field(default_factory=dict)
    raw: dict = field(default_factory=dict)


def record_key(index: int) -> bytes:
    """Key of record ``index`` (0-based): 10 ASCII digits, e.g. ``b"0000000042"``."""
    return b"%0*d" % (_KEY_DIGITS, index)


def last_record_index(txn) -> int:
    """Highest record index in ``txn`` (digits sort before ``_``), or -1."""
    cursor = txn.cursor()
    found = cursor.prev() if cursor.set_range(b"_") else cursor.last()
    if not found or not cursor.key().isdigit():
        return -1
    return int(cursor.key())


def encode_checksums(crcs) -> bytes:
    """CRC-32s (:func:`record_checksum`), one per record in order, as little-endian uint32s."""
    return np.asarray(crcs, dtype="<u4").tobytes()


def decode_checksums(value: bytes) -> list[int]:
    """Inverse of :func:`encode_checksums`; ``ValueError`` if not a whole number of them."""
    return np.frombuffer(value, dtype="<u4").tolist()


def record_checksum(value: bytes) -> int:
    return zlib.crc32(value)


def encode_record(jpeg_bytes: bytes, label: int) -> bytes:
    """msgpack ``[image_bytes, label]``: a JPEG, or in version 2 maybe a raw record."""
    return msgpack.packb([jpeg_bytes, int(label)], use_bin_type=True)


def decode_record(value: bytes) -> tuple[bytes, int]:
    """``(image_bytes, label)``; raises :class:`LMDBFormatError` if malformed."""
    try:
        jpeg_bytes, label = msgpack.unpackb(value, raw=False)
    except (ValueError, TypeError, msgpack.exceptions.ExtraData) as exc:
        raise LMDBFormatError(f"malformed record ({exc})") from None
    return jpeg_bytes, label


def encode_meta(meta: Metadata) -> bytes:
    extra = {"names": list(meta.names)} if meta.names is not None else {}
    if meta.raw:
        extra["raw"] = meta.raw
    return msgpack.packb(
        {"format": FORMAT_NAME, "version": meta.version, "count": meta.count,
         "classes": list(meta.classes), "shuffle_seed": meta.shuffle_seed, **extra, **meta.cap},
        use_bin_type=True,
    )


def decode_meta(value: bytes | None, path: str) -> Metadata:
    """The metadata record of the database at ``path``. Raises :class:`LMDBFormatError` if it is
    missing (an unfinished conversion or another format), from a newer version, or malformed."""
    if value is None:
        raise LMDBFormatError(
            f"{path}: no metadata record; the conversion did not finish or this LMDB was not "
            "written by folder2lmdb.py (run folder2lmdb.py again)")
    meta = msgpack.unpackb(value, raw=False)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise LMDBFormatError(f"{path}: not an LMDB written by folder2lmdb.py")
    if meta["version"] > FORMAT_VERSION:
        raise LMDBFormatError(
            f"{path}: format version {meta['version']} is newer than this reader's "
            f"{FORMAT_VERSION}; update the code")
    names = meta.get("names")
    try:
        cap = Cap.fields_in(meta)
    except ValueError as exc:
        raise LMDBFormatError(f"{path}: metadata: {exc}") from None
    return Metadata(meta["count"], tuple(meta["classes"]), meta["version"],
                    meta.get("shuffle_seed"), tuple(names) if names is not None else None, cap,
                    dict(meta.get("raw") or {}))


def is_lmdb(path: str) -> bool:
    """True if ``path`` is an LMDB environment (a directory with ``data.mdb``, or a data file)."""
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, "data.mdb"))
    return os.path.isfile(path) and not path.endswith("-lock")


# One read-only handle per (process, path) with its readahead: py-lmdb opens an environment once
# per process, never to be used across fork(); the lock keeps threads from opening it twice.
_READONLY: dict[tuple[int, str], tuple[object, bool]] = {}
_READONLY_LOCK = threading.RLock()


def open_readonly(path: str, readahead: bool | None = None):
    """This process's read-only environment at ``path``, opened once (py-lmdb cannot open it twice;
    a forked child gets its own), ``lock=False``, 512 readers. ``readahead``: False for random
    order, True for sequential or block order, None: the open handle's; the other reopens it
    (holders check :func:`is_open`). Raises :class:`LMDBFormatError`."""
    with _READONLY_LOCK:
        key = (os.getpid(), os.path.realpath(path))
        if key in _READONLY:
            env, current = _READONLY[key]
            if readahead is None or readahead == current:
                return env
            close_readonly(path)
        # unusable in the child, and blocking a reopen; closing its copy spares the parent's
        close_readonly(inherited=True)
        if not is_lmdb(path):
            hint = " (it is a folder of images: drop --lmdb)" if os.path.isdir(path) else ""
            raise LMDBFormatError(f"{path}: not an LMDB database{hint}")
        try:
            env = lmdb.open(path, subdir=os.path.isdir(path), readonly=True, lock=False,
                            readahead=bool(readahead), meminit=False, max_readers=512)
        except lmdb.Error as exc:
            raise LMDBFormatError(f"{path}: cannot open as LMDB ({exc})") from None
        _READONLY[key] = (env, bool(readahead))
        return env


def is_open(env) -> bool:
    """True while ``env`` (a handle from :func:`open_readonly`) has not been closed here."""
    with _READONLY_LOCK:  # another thread's open or close would change the dict mid-scan
        return any(held is env for held, _ in _READONLY.values())


def close_readonly(path: str | None = None, inherited: bool = False) -> None:
    """Close this process's read-only handle on ``path``, if any (None: all of them); with
    ``inherited``, the handles it inherited instead."""
    with _READONLY_LOCK:
        for key in [k for k in _READONLY if (k[0] != os.getpid()) == inherited
                    and (path is None or k[1] == os.path.realpath(path))]:
            _READONLY.pop(key)[0].close()


def close_all_readonly() -> None:
    """Close this process's read-only handles at a run's end: py-lmdb 3.0 knows an environment by
    inode, and a new database reusing a freed inode would be "already open"."""
    close_readonly()


def read_meta(path: str) -> Metadata:
    """The :class:`Metadata` at ``path``, leaving no new handle open. Raises
    :class:`LMDBFormatError`."""
    was_open = (os.getpid(), os.path.realpath(path)) in _READONLY
    try:
        with open_readonly(path).begin() as txn:
            return decode_meta(txn.get(META_KEY), path)
    finally:
        if not was_open:
            close_readonly(path)
