"""``folder2lmdb.py --verify``: check a database against its checksums, its decoders and,
optionally, the folder it was converted from."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import closing

import lmdb

from decode import decode
from decode.acceptance import Refused, check
from decode.messages import capture
from decode.raw import is_raw, raw_header
from formats.cap import Cap
from formats.conversion import Verification, differs, source_to_compare
from formats.images import check_files

from ._codec import (CHECKSUMS_KEY, META_KEY, RAW_VERSION, LMDBFormatError, decode_checksums,
                     decode_record, last_record_index, open_readonly, read_meta, record_checksum,
                     record_key)


def verify(db: str, dataset: str | None = None, workers: int = 8, chunk: int = 256,
           split: str | None = None) -> Verification:
    """Check the database ``db``: metadata, records ``0..count-1`` and nothing else, each record's
    CRC-32, label and decode (a raw record's header); with ``dataset`` (any layout, ``split`` for a
    download), also that every record equals what the converter would store now. Raises
    :class:`~formats.sources.DatasetError` only for a bad ``dataset``."""
    result = Verification(db, dataset=dataset)
    try:
        meta = read_meta(db)
    except (LMDBFormatError, lmdb.Error) as exc:
        result.problem(str(exc))
        return result
    result.count, result.classes = meta.count, len(meta.classes)
    with source_to_compare(result, split, meta.shuffle_seed, meta.classes) as listing, \
            open_readonly(db).begin() as txn, ThreadPoolExecutor(max(1, workers)) as pool:
        paths = _compare_sources(txn, listing, meta, workers, result) if listing else []
        sums = txn.get(CHECKSUMS_KEY)
        result.checksums = sums is not None and len(sums) == 4 * meta.count
        if sums is not None and not result.checksums:  # 4 bytes per record, each a CRC-32
            result.problem(f"checksum record holds {len(sums)} bytes for {meta.count} records "
                           f"({4 * meta.count} expected)")
        crcs = decode_checksums(sums) if result.checksums else None
        cursor = txn.cursor()
        if cursor.set_range(b"_"):
            for key in cursor.iternext(values=False):
                if key not in (META_KEY, CHECKSUMS_KEY):
                    result.problem(f"unexpected key {key!r} (a leftover of an unfinished run?)")
        if last_record_index(txn) >= meta.count:
            result.problem(f"records beyond the count {meta.count} (up to "
                           f"{last_record_index(txn)})")
        for first in range(0, meta.count, chunk):
            jobs = [(i, paths[i] if i < len(paths) else None, txn.get(record_key(i)),
                     crcs[i] if crcs else None, len(meta.classes), meta.version)
                    for i in range(first, min(first + chunk, meta.count))]
            for found in pool.map(_check_record, jobs):
                for text in found:
                    result.problem(text)
    return result


def _name(index: int, rel: str | None) -> str:
    return f"record {index} ({rel})" if rel else f"record {index}"


def _compare_sources(txn, listing, meta, workers: int, result: Verification) -> list[str]:
    """Each record against what its source converts to now under the database's cap; the
    images' relative paths, in record order (``workers`` threads check the sources)."""
    paths, cap = [], Cap.from_record(meta.cap)  # the conversion's --max-side / --quality
    with closing(check_files(listing.files, workers, cap=cap)) as checks:
        for src, checked in zip(listing.files, checks):
            if isinstance(checked, str):
                continue
            name, key = _name(len(paths), src.rel), record_key(len(paths))
            paths.append(src.rel)
            try:  # a missing or malformed record: reported by the record pass
                data, label = decode_record(txn.get(key))
            except LMDBFormatError:
                continue
            why = differs(data, checked)
            if why:
                result.problem(f"{name}: {why}")
            if label != src.label:
                result.problem(f"{name}: label {label}, the source's is {src.label}")
    if len(paths) != meta.count:
        result.problem(f"{result.dataset} has {len(paths)} images, the database {meta.count}")
    return paths


def _check_record(job) -> list[str]:
    index, rel, value, crc, num_classes, version = job
    name = _name(index, rel)
    if value is None:
        return [f"{name}: missing"]
    found = []
    if crc is not None and record_checksum(value) != crc:
        found.append(f"{name}: checksum mismatch (stored bytes changed after conversion)")
    try:
        data, label = decode_record(value)
    except LMDBFormatError as exc:
        return found + [f"{name}: {exc}"]
    if not isinstance(label, int) or not 0 <= label < num_classes:
        found.append(f"{name}: label {label!r} outside 0..{num_classes - 1}")
    if is_raw(data):
        if version < RAW_VERSION:
            return found + [f"{name}: a raw record in a version-{version} database"]
        if raw_header(data) is None:
            return found + [f"{name}: a malformed raw record (its header does not match its "
                            f"{len(data)} bytes)"]
    try:
        check(data)  # the loaders' acceptance rule: a bomb is named, never decoded
        with capture():  # libjpeg's warnings about a kept image: not a finding, not printed
            decode(data)
    except Refused as exc:
        found.append(f"{name}: refused by the loaders ({exc})")
    except Exception as exc:  # noqa: BLE001 - any decoder failure is the finding
        found.append(f"{name}: does not decode ({str(exc).splitlines()[0] if str(exc) else exc!r})")
    return found
