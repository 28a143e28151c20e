"""Indexing WebDataset shards written by other tools (``folder2shards.py --index``), e.g.
``timm/imagenet-1k-wds``, unchanged: one pass over each tar's headers writes ``index.json`` and the
``.idx`` files, beside the shards or elsewhere (each shard's ``url`` then says where). Labels are
the records' ``.cls``, indices into the sorted WNIDs, which come from the records' ``.json``
(``wnid``, ``synset``, or a ``filename``/``path`` or key such as ``n01440764_10026``) or from
``classes`` (an ``index.json`` or one WNID a line: val names carry none)."""
from __future__ import annotations

import json
import os
import re
import tarfile
import time
from itertools import groupby

from ._codec import INDEX_NAME, RecordSpan, ShardFormatError, ShardIndex, idx_name, write_idx
from .locations import is_stream, open_stream

_WNID = re.compile(r"n\d{8}")
_WNID_FIELDS = ("wnid", "synset", "synset_id", "class_id")
_NAME_FIELDS = ("filename", "file_name", "path")
_EXTENSION = re.compile(r"\.[^/]*$")  # from the first dot after the last "/" (WebDataset's key)


def _wnid_of(key: str, meta: dict) -> str | None:
    """The WNID a record's ``.json`` or key names, or None."""
    for field in _WNID_FIELDS:
        if isinstance(meta.get(field), str) and _WNID.fullmatch(meta[field]):
            return meta[field]
    for text in [meta.get(f) for f in _NAME_FIELDS] + [key]:
        if isinstance(text, str):
            match = _WNID.match(os.path.basename(text))
            if match and text[len(match[0]):][:1] in ("_", "/", ""):
                return match[0]
    return None


class _Counting:
    """A stream that counts the bytes read from it."""

    def __init__(self, stream):
        self.stream, self.count = stream, 0

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.count += len(data)
        return data


def _records(url: str) -> tuple[list[tuple[RecordSpan, int, str | None, str | None]], int]:
    """``([(span, label, wnid, name)], shard bytes)``, members grouped by key as WebDataset does.
    Raises :class:`ShardFormatError` naming the shard."""
    local = not is_stream(url)
    stream = None if local else _Counting(open_stream(url))
    records = []
    try:
        # a local tar is read header by header, seeking past the images; a stream front to back
        with (tarfile.open(url, "r:") if local else tarfile.open(fileobj=stream, mode="r|")) \
                as tar:
            for key, members in groupby((i for i in tar if i.isreg()),
                                        lambda info: _EXTENSION.sub("", info.name)):
                found = {}
                for info in members:
                    ext = info.name[len(key) + 1:]
                    found[ext] = (info.offset_data, info.size, tar.extractfile(info).read()
                                  if ext in ("cls", "json") else None)
                records.append(_record(url, key, found))
    except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
        raise ShardFormatError(f"{url}: unreadable or truncated tar ({exc})") from None
    finally:
        if stream is not None:
            stream.stream.close()
    return records, os.path.getsize(url) if local else stream.count


def _record(url: str, key: str, found: dict) -> tuple:
    """One record of :func:`_records` from its members ``{ext: (offset, size, data)}``."""
    if "jpg" not in found or "cls" not in found:
        raise ShardFormatError(f"{url}: record {key} has no .jpg or no .cls (found "
                               f"{', '.join(sorted(found))})")
    (image_at, image_size, _), (label_at, label_size, data) = found["jpg"], found["cls"]
    label = data.decode("utf-8", "replace")
    if not label.strip().isdigit():
        raise ShardFormatError(f"{url}: record {key}: .cls {label[:20]!r} is no class index")
    meta = json.loads(found["json"][2] or b"{}") if "json" in found else {}
    meta = meta if isinstance(meta, dict) else {}
    name = meta.get("class_name")
    return (RecordSpan(key, image_at, image_size, label_at, label_size), int(label.strip()),
            _wnid_of(key, meta), name if isinstance(name, str) else None)


def _classes(found: list, classes_file: str | None, spec: str) -> tuple[list[str], list | None]:
    """The sorted WNIDs (index = label) and class names the records and ``classes_file`` give.
    Raises :class:`ShardFormatError` saying what is needed."""
    wnids, names = {}, {}
    for url, records in found:
        for span, label, wnid, name in records:
            if wnid is not None and wnids.setdefault(label, wnid) != wnid:
                raise ShardFormatError(f"{url}: record {span.key}: label {label} is {wnid} here "
                                       f"and {wnids[label]} elsewhere")
            if name:
                names.setdefault(label, name)
    top = max((r[1] for _, records in found for r in records), default=-1)
    if classes_file:  # WNIDs in label order: an index.json or one a line
        try:
            with open(classes_file) as f:
                text = f.read()
        except OSError as exc:
            raise ShardFormatError(f"--classes {classes_file}: cannot read ({exc.strerror})") \
                from None
        classes = (ShardIndex.from_json(text, classes_file).classes
                   if classes_file.endswith(".json") else
                   [line.split()[0] for line in text.splitlines() if line.strip()])
        wrong = [label for label, wnid in wnids.items()
                 if label >= len(classes) or classes[label] != wnid]
        if wrong or top >= len(classes):
            raise ShardFormatError(f"{spec}: labels disagree with --classes {classes_file} "
                                   f"(label {wrong[0] if wrong else top})")
    else:
        missing = [label for label in range(top + 1) if label not in wnids]
        if missing:
            raise ShardFormatError(
                f"{spec}: the records name no WNID for label {missing[0]} (a .json 'wnid' or "
                "'filename' like n01440764_10026.JPEG); pass --classes with the train split's "
                "index.json or a file of the WNIDs in label order")
        classes = [wnids[label] for label in range(top + 1)]
    unsorted = [i for i in range(1, len(classes)) if classes[i] <= classes[i - 1]]
    if unsorted:
        raise ShardFormatError(f"{spec}: labels are not indices into the sorted WNIDs (label "
                               f"{unsorted[0]} is {classes[unsorted[0]]}); the loaders need "
                               "that order")
    return classes, [names.get(i, "") for i in range(len(classes))] if names else None


def index_shards(spec: str, output: str | None = None, classes_file: str | None = None,
                 progress: bool = True) -> str:
    """Index the foreign shards ``spec`` (a folder of ``*.tar``, or a brace pattern of paths or
    URLs) into ``output`` (default: the shards' folder; required for remote shards): a DALI
    ``.idx`` per shard and ``index.json``, written last. Raises :class:`ShardFormatError` (one
    line) for an unreadable shard, a record without ``.jpg``/``.cls``, classes that cannot be told,
    or an output that cannot be written."""
    from braceexpand import braceexpand
    from tqdm import tqdm

    start = time.perf_counter()
    urls = (sorted(os.path.join(spec, n) for n in os.listdir(spec) if n.endswith(".tar"))
            if os.path.isdir(spec) else list(braceexpand(spec)))
    if not urls:
        raise ShardFormatError(f"{spec}: no .tar shards")
    if output is None:
        if is_stream(urls[0]):
            raise ShardFormatError(f"{spec}: remote shards: give -o, a folder for the index")
        output = os.path.dirname(os.path.abspath(urls[0]))
    names = [os.path.basename(u) for u in urls]
    if len(set(names)) != len(names):
        raise ShardFormatError(f"{spec}: two shards have one name")
    found = [(url, _records(url)) for url in tqdm(urls, unit="shard", desc="indexing",
                                                  disable=not progress or None)]
    classes, class_names = _classes([(u, r) for u, (r, _) in found], classes_file, spec)
    try:
        os.makedirs(output, exist_ok=True)
        entries = []
        for url, (records, size) in found:
            name = os.path.basename(url)
            write_idx(os.path.join(output, idx_name(name)), [r[0] for r in records])
            entry = {"name": name, "records": len(records), "bytes": size}
            if is_stream(url) or os.path.dirname(os.path.abspath(url)) != os.path.abspath(output):
                entry["url"] = url if is_stream(url) else os.path.relpath(url, output)
            entries.append(entry)
        ShardIndex(classes, entries, None, None, class_names).write(output)
    except OSError as exc:
        raise ShardFormatError(f"{output}: cannot write the index ({exc.strerror or exc}); "
                               "for read-only shards give -o, a folder of its own") from None
    return (f"indexed {sum(e['records'] for e in entries)} records of {len(entries)} shards "
                f"({len(classes)} classes) into {os.path.join(output, INDEX_NAME)} in "
                f"{time.perf_counter() - start:.1f} s")
