"""Keys, values and the metadata of the LMDB layout (described in :mod:`formats.lmdb`), shared
by the writer (:mod:`formats.lmdb._convert`), the verifier and the reader
(``loaders.readers.lmdb_records``). Keys are derived from the index, so neither side stores or holds a
list of all keys.
"""
from __future__ import annotations

import os
import sys
import threading
import zlib
from dataclasses import dataclass, field

import msgpack

from formats.cap import Cap

FORMAT_NAME = "imagenet-lmdb"
FORMAT_VERSION = 2  # the newest this code reads; it writes 1 unless the store has a raw share
BASE_VERSION = 1  # a store of JPEG records only: unchanged since before raw records
RAW_VERSION = 2  # records may be raw pixels (decode.raw); the metadata's "raw" says how chosen
META_KEY = b"__meta__"
CHECKSUMS_KEY = b"__checksums__"
PROGRESS_PREFIX = b"__progress__"
PROGRESS_KEY = PROGRESS_PREFIX  # the resume state itself; per-batch entries extend the prefix
_KEY_DIGITS = 10  # up to 10^10 records; fixed width keeps LMDB's byte order equal to index order


class LMDBFormatError(ValueError):
    """A path is not a complete database in this format (missing, incomplete or foreign)."""


@dataclass(frozen=True)
class Metadata:
    """What the metadata record holds: ``count`` records labelled ``0..len(classes)-1``;
    ``shuffle_seed``: the seed of the records' order (``folder2lmdb.py --shuffle-seed``), or
    None for ImageFolder's class-sorted order (also what databases from before it read as);
    ``names``: the classes' human-readable names (an optional key, absent where the source has
    none and in databases written before it); ``cap``: the ``--max-side``/``--quality`` fields
    (:meth:`formats.cap.Cap.record`), empty without a cap (and for databases from before it);
    ``raw``: how the raw-pixel share was chosen and what it bought
    (:meth:`formats.raw_share.RawChoice.state`), empty without one (version 1)."""

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
    """Index of the highest record key in the transaction's database, -1 if there is none.

    Record keys are digits and sort before every ``__name__`` key (``"9" < "_"``), so the last
    record is the key just before the first key ``>= b"_"``.
    """
    cursor = txn.cursor()
    found = cursor.prev() if cursor.set_range(b"_") else cursor.last()
    if not found or not cursor.key().isdigit():
        return -1
    return int(cursor.key())


def encode_checksums(crcs) -> bytes:
    """Pack CRC-32 values (ints, one per record in index order) as little-endian uint32s."""
    import array

    packed = array.array("I", crcs)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def decode_checksums(value: bytes) -> list[int]:
    """Inverse of :func:`encode_checksums`."""
    import array

    packed = array.array("I")
    packed.frombytes(value)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tolist()


def record_checksum(value: bytes) -> int:
    """CRC-32 (zlib) of a record's stored value, as kept in the checksum record."""
    return zlib.crc32(value)


def encode_record(jpeg_bytes: bytes, label: int) -> bytes:
    """Pack one sample as msgpack ``[jpeg_bytes, label]`` (bytes stay binary, label an int);
    in a version-2 database the bytes may be a raw record (:mod:`decode.raw`) instead."""
    return msgpack.packb([jpeg_bytes, int(label)], use_bin_type=True)


def decode_record(value: bytes) -> tuple[bytes, int]:
    """Inverse of :func:`encode_record`. Raises :class:`LMDBFormatError` on a malformed value."""
    try:
        jpeg_bytes, label = msgpack.unpackb(value, raw=False)
    except (ValueError, TypeError, msgpack.exceptions.ExtraData) as exc:
        raise LMDBFormatError(f"malformed record ({exc})") from None
    return jpeg_bytes, label


def encode_meta(meta: Metadata) -> bytes:
    """Pack the metadata record."""
    extra = {"names": list(meta.names)} if meta.names is not None else {}
    if meta.raw:
        extra["raw"] = meta.raw
    return msgpack.packb(
        {"format": FORMAT_NAME, "version": meta.version, "count": meta.count,
         "classes": list(meta.classes), "shuffle_seed": meta.shuffle_seed, **extra, **meta.cap},
        use_bin_type=True,
    )


def decode_meta(value: bytes | None, path: str) -> Metadata:
    """Parse the metadata record of the database at ``path``.

    Raises :class:`LMDBFormatError` if it is missing (conversion unfinished or not our format)
    or from a newer format version.
    """
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
    return Metadata(count=meta["count"], classes=tuple(meta["classes"]), version=meta["version"],
                    shuffle_seed=meta.get("shuffle_seed"),
                    names=tuple(names) if names is not None else None,
                    cap=cap,
                    raw=dict(meta.get("raw") or {}))


def is_lmdb(path: str) -> bool:
    """True if ``path`` is an LMDB environment (a directory with ``data.mdb`` or a data file)."""
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, "data.mdb"))
    return os.path.isfile(path) and not path.endswith("-lock")


# py-lmdb refuses to open one environment twice in a process, and an environment must not be
# used across fork(): keep one read-only handle per (process, path), with its readahead setting;
# threads that read at once (DALI's feeds) take it under one lock, or both would open it.
_READONLY: dict[tuple[int, str], tuple[object, bool]] = {}
_READONLY_LOCK = threading.RLock()
# id() of every handle in _READONLY: a holder that keeps its handle alive can test it cheaply
# (the id cannot be reused while the holder's reference exists).
_OPEN_IDS: set[int] = set()


def open_readonly(path: str, readahead: bool | None = None):
    """The read-only LMDB environment at ``path`` for this process (opened once, then shared).

    ``readahead``: ``False`` opens with OS readahead off (LMDB's ``MDB_NORDAHEAD``, i.e.
    ``madvise(MADV_RANDOM)``), right for random order, where readahead would fill the page
    cache with neighbours that are evicted before use; ``True`` leaves it on, right for
    sequential or block order; ``None`` takes the handle already open, whatever its setting,
    else opens with readahead off. A process has one handle per database (py-lmdb cannot open
    it twice), so asking for the other setting closes the existing handle and reopens it:
    holders that keep a handle should check :func:`is_open` before using it.
    ``lock=False`` because the database is immutable while training; ``max_readers`` covers
    many DataLoader workers. A forked child gets its own handle.
    Raises :class:`LMDBFormatError` if ``path`` is not an LMDB.
    """
    with _READONLY_LOCK:
        return _open_readonly(path, readahead)


def _open_readonly(path: str, readahead: bool | None):
    import lmdb

    key = (os.getpid(), os.path.realpath(path))
    if key in _READONLY:
        env, current = _READONLY[key]
        if readahead is None or readahead == current:
            return env
        close_readonly(path)
    _close_inherited()
    if not is_lmdb(path):
        hint = " (it is a folder of images: drop --lmdb)" if os.path.isdir(path) else ""
        raise LMDBFormatError(f"{path}: not an LMDB database{hint}")
    try:
        env = lmdb.open(path, subdir=os.path.isdir(path), readonly=True, lock=False,
                        readahead=bool(readahead), meminit=False, max_readers=512)
    except lmdb.Error as exc:
        raise LMDBFormatError(f"{path}: cannot open as LMDB ({exc})") from None
    _READONLY[key] = (env, bool(readahead))
    _OPEN_IDS.add(id(env))
    return env


def is_open(env) -> bool:
    """True while ``env`` (a handle from :func:`open_readonly`) has not been closed here."""
    return id(env) in _OPEN_IDS


def _close(env) -> None:
    _OPEN_IDS.discard(id(env))
    env.close()


def _close_inherited() -> None:
    # A handle inherited through fork() must not be used in the child, and py-lmdb refuses to
    # open its files again while it exists; closing the child's copy leaves the parent's intact.
    for key in [k for k in _READONLY if k[0] != os.getpid()]:
        _close(_READONLY.pop(key)[0])


def close_readonly(path: str) -> None:
    """Close this process's read-only handle on ``path``, if any (before rewriting it)."""
    with _READONLY_LOCK:
        entry = _READONLY.pop((os.getpid(), os.path.realpath(path)), None)
        if entry is not None:
            _close(entry[0])


def close_all_readonly() -> None:
    """Close every read-only handle this process opened (:func:`open_readonly`): at the end of
    a run, so that a process that runs again (``main(argv)`` in-process) holds no environment
    on files that may since be deleted. py-lmdb (3.0) knows an open environment by the inode
    of its ``data.mdb`` and ``lock.mdb``; a handle kept on a deleted database would make a new
    database that reuses the freed inode of its lock file "already open in this process"."""
    with _READONLY_LOCK:
        for key in [k for k in _READONLY if k[0] == os.getpid()]:
            _close(_READONLY.pop(key)[0])


def read_meta(path: str) -> Metadata:
    """The metadata record of the database at ``path``. Raises :class:`LMDBFormatError`.

    Leaves no handle open that was not open before, so a process that only reads the metadata
    (the main process of a DataLoader with workers) forks workers without an open environment.
    """
    was_open = (os.getpid(), os.path.realpath(path)) in _READONLY
    try:
        with open_readonly(path).begin() as txn:
            return decode_meta(txn.get(META_KEY), path)
    finally:
        if not was_open:
            close_readonly(path)
