"""``folder2shards.py --verify``: check a split's shards against ``index.json``, their ``.idx``
files, the converter's SHA-256 digests and, optionally, their source."""
from __future__ import annotations

import hashlib
import os
import re
import tarfile
from concurrent.futures import ThreadPoolExecutor

from decode.raw import is_raw, raw_header
from formats.cap import Cap
from formats.conversion import REPORT_NAME, Verification, differs, source_to_compare
from formats.images import check_file, reencode_reason
from formats.sources import read_source

from ._codec import (IMAGE_EXT, INDEX_NAME, LABEL_EXT, RAW_EXT, RecordSpan, ShardFormatError,
                     ShardIndex, idx_name, idx_text, read_idx, source_keys)


def verify(folder: str, dataset: str | None = None, workers: int = 8,
           digests: dict[str, str] | None = None, split: str | None = None) -> Verification:
    """Check the shards in ``folder``: ``index.json``, each shard's size and (``digests``) SHA-256,
    its records and ``.idx`` offsets, labels, baseline JPEG headers, no unlisted ``.tar``; with
    ``dataset``, each record against its source in the seed's order and cap, and every source
    stored or in ``skipped.tsv``. Raises :class:`~formats.sources.DatasetError` for a bad one."""
    result = Verification(folder, dataset=dataset, shards=0)
    try:
        with open(os.path.join(folder, INDEX_NAME)) as f:
            index = ShardIndex.from_json(f.read(), os.path.join(folder, INDEX_NAME))
    except OSError:
        result.problem(f"{folder}: no {INDEX_NAME} (an unfinished conversion, or no shards)")
        return result
    except ShardFormatError as exc:
        result.problem(str(exc))
        return result
    result.count, result.classes = index.records, len(index.classes)
    result.shards, result.checksums = len(index.shards), bool(digests)
    if any("url" in s for s in index.shards):
        result.problem(f"{folder}: indexes shards written by another tool (folder2shards.py "
                       "--index); --verify checks shards written by folder2shards.py")
        return result
    with source_to_compare(result, split, index.seed, index.classes) as listing, \
            ThreadPoolExecutor(max(1, workers)) as pool:
        sources = _Sources(listing, folder, index, result) if listing else None
        for shard in index.shards:
            digest = (digests or {}).get(shard["name"])
            for chunk in _shard_records(folder, shard, digest, len(index.classes), result):
                if sources:
                    sources.note(chunk)
                    for text in pool.map(sources.compare, chunk):
                        if text:
                            result.problem(text)
        if sources:
            sources.finish()
    listed = {s["name"] for s in index.shards}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".tar") and name not in listed:
            result.problem(f"{name}: a shard not listed in {INDEX_NAME}")
    return result


def _shard_records(folder: str, shard: dict, digest: str | None, num_classes: int,
                   result: Verification, chunk: int = 256):
    """Yield lists of ``(key, image, label or None)`` while checking one shard."""
    name, path = shard["name"], os.path.join(folder, shard["name"])
    if not os.path.isfile(path):
        return result.problem(f"{name}: missing")
    if os.path.getsize(path) != shard["bytes"]:
        result.problem(f"{name}: {os.path.getsize(path)} bytes, {INDEX_NAME} says "
                       f"{shard['bytes']}")
    elif digest:
        with open(path, "rb") as f:
            if hashlib.file_digest(f, "sha256").hexdigest() != digest:
                result.problem(f"{name}: SHA-256 differs from the conversion's (changed since)")
    spans, pending, records = [], None, []
    try:
        with tarfile.open(path, "r:") as tar:
            for info in tar:
                data = tar.extractfile(info).read() if info.isreg() else b""
                base, _, ext = info.name.rpartition(".")
                if ext in (IMAGE_EXT, RAW_EXT) and pending is None:
                    pending = (base, info.offset_data, data, ext)
                elif ext == LABEL_EXT and pending and pending[0] == base:
                    key, image_at, image, image_ext = pending
                    spans.append(RecordSpan(key, image_at, len(image), info.offset_data,
                                            len(data), image_ext))
                    records.append((key, image, _label(name, key, image, data, num_classes,
                                                       result)))
                    pending = None
                else:
                    result.problem(f"{name}: unexpected member {info.name!r}")
                if len(records) >= chunk:
                    yield records
                    records = []
    except (tarfile.TarError, OSError, EOFError) as exc:
        result.problem(f"{name}: truncated or not a tar ({exc})")
    if records:
        yield records
    _check_idx(path, shard, spans, result)


def _label(name: str, key: str, image: bytes, data: bytes, num_classes: int,
           result: Verification) -> int | None:
    """The label in a ``.cls`` member's ``data``, or None (a problem); also reports an image that
    is not a baseline JPEG by its headers or a malformed raw record."""
    why = reencode_reason(image) if not is_raw(image) else None
    if is_raw(image) and raw_header(image) is None:
        result.problem(f"{name} {key}: a malformed raw record (its header does not match its "
                       f"{len(image)} bytes)")
    elif why is not None:
        result.problem(f"{name} {key}: image is no baseline JPEG ({why})")
    if not data.isdigit() or int(data) >= num_classes:
        result.problem(f"{name} {key}: label {data[:20]!r} outside 0..{num_classes - 1}")
        return None
    return int(data)


def _check_idx(path: str, shard: dict, spans: list[RecordSpan], result) -> None:
    """The tar's record count, and its ``.idx`` as ``write_idx`` writes it."""
    name, idx = shard["name"], idx_name(path)
    if len(spans) != shard["records"]:
        result.problem(f"{name}: {len(spans)} records, {INDEX_NAME} says {shard['records']}")
    try:
        with open(idx) as f:
            text = f.read()
        read_idx(text, idx)
    except OSError:
        return result.problem(f"{name}: no DALI index {os.path.basename(idx)}")
    except ShardFormatError as exc:
        return result.problem(str(exc))
    if text != idx_text(spans):
        result.problem(f"{os.path.basename(idx)}: does not match the members of {name}")


class _Sources:
    """``--verify --dataset``: each record against the source file its key names."""

    def __init__(self, listing, folder: str, index: ShardIndex, result: Verification):
        keys = source_keys(listing.classes, listing.files)
        self.files, self.result, self.seen = listing.files, result, []
        self.by_key = {keys[src.rel]: (at, src) for at, src in enumerate(listing.files)}
        self.skipped = _read_report(os.path.join(folder, REPORT_NAME), result)
        self.cap = Cap.from_record(index.cap)  # the conversion's --max-side / --quality

    def note(self, records: list) -> None:
        """Remember where the next ``records`` stand in the listing."""
        self.seen += [self.by_key[r[0]][0] for r in records if r[0] in self.by_key]

    def compare(self, record: tuple) -> str | None:
        """The problem with one ``(key, image bytes, label)`` record, or None."""
        key, image, label = record
        if key not in self.by_key:
            return f"record {key}: no such source file in {self.result.dataset}"
        _, src = self.by_key[key]
        if label is not None and label != src.label:
            return f"record {key}: label {label}, the source {src.rel} has {src.label}"
        try:
            if read_source(src) == image:
                return None
        except OSError as exc:
            return f"record {key}: cannot read its source {src.where()} ({exc.strerror})"
        checked = check_file(src, "full", self.cap)  # not stored verbatim: the re-encoding
        why = ("image bytes differ from the source" if isinstance(checked, str)
               else differs(image, checked))
        return why and f"record {key} ({src.rel}): {why}"

    def finish(self) -> None:
        """Every source file in the shards (in the seed's order) or in ``skipped.tsv``."""
        if self.seen != sorted(self.seen):
            self.result.problem("records are not in the order of the index's seed")
        seen = set(self.seen)
        for at, src in enumerate(self.files):
            if at not in seen and src.rel not in self.skipped:
                self.result.problem(f"{src.rel}: neither in the shards nor in {REPORT_NAME}")


def _read_report(path: str, result: Verification) -> set[str]:
    """The relative paths a ``skipped.tsv`` lists, escapes undone."""
    unescape = {"t": "\t", "n": "\n", "\\": "\\"}
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().split("\n")[1:]
    except OSError:
        result.problem(f"no {REPORT_NAME} beside the shards")
        return set()
    return {re.sub(r"\\(.)", lambda m: unescape.get(m[1], m[1]), line.split("\t")[0])
            for line in lines if line}
