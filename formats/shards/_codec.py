"""Names, the tar writer, DALI's ``.idx`` files, ``index.json`` and the files of a conversion of
the shard layout (:mod:`formats.shards`), shared by the writers, the verifier and the reader."""
from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
from dataclasses import dataclass, field

from formats.cap import Cap
from formats.conversion import ConversionError, ResumeState, write_report
from formats.images import RULES_VERSION
from formats.sources import Listing, replace_synced

INDEX_NAME, PROGRESS_NAME = "index.json", "progress.json"
# the files of a conversion in progress or done (the job array's blocks and lock included)
_OURS = re.compile(r"(.+-\d{6}\.(tar|idx|done)|index\.json|progress\.json|skipped\.tsv)"
                   r"(\.lock|(\.\d+)?\.tmp)?")
FORMAT_NAME, FORMAT_VERSION = "webdataset-imagenet", 2  # the newest read; 1 written without raw
BASE_VERSION, RAW_VERSION = 1, 2  # 2: records may be raw pixels (KEY.ppm, decode.raw)
IDX_VERSION = "v1.2"  # DALI's webdataset index format (nvidia/dali wds2idx.py)
IMAGE_EXT, LABEL_EXT = "jpg", "cls"
RAW_EXT = "ppm"  # a raw record's member: a binary PPM/PGM (decode.raw), PIL and DALI read it


class ShardFormatError(Exception):
    """A shard, index or index.json that does not follow the layout: one-line message."""


def shard_name(prefix: str, number: int) -> str:
    return f"{prefix}-{number:06d}.tar"


def idx_name(tar_name: str) -> str:
    """The DALI index beside ``tar_name`` (``train-000000.tar`` -> ``train-000000.idx``)."""
    return tar_name.removesuffix(".tar") + ".idx"


def record_key(wnid: str, path: str) -> str:
    """``<wnid>/<stem>`` of ``path``, dots in the stem replaced by ``_`` (WebDataset splits a
    member name at its first dot after the last ``/``)."""
    stem = os.path.splitext(os.path.basename(path))[0].replace(".", "_")
    return f"{wnid}/{stem}"


_KEY_BYTES = 88  # a ustar name holds 100 bytes: KEY + ".jpg", and room for a "_2" on repeats


def source_keys(classes: list[str], files) -> dict[str, str]:
    """Each file's record key, by ``rel``: :func:`record_key`, spaces and unprintables ``_``
    (``.idx`` splits at spaces), hashed to fit ustar, repeats ``_2``, ``_3``... in path order."""
    keys, used = {}, set()
    for src in sorted(files, key=lambda s: s.rel):
        key = "".join(c if c.isprintable() and not c.isspace() and not "\ud800" <= c <= "\udfff"
                      else "_" for c in record_key(classes[src.label], src.rel))
        if len(key.encode()) > _KEY_BYTES:
            digest = hashlib.sha1(os.fsencode(src.rel)).hexdigest()[:12]
            head = key.encode()[:_KEY_BYTES - 13].decode("utf-8", "ignore")
            key = f"{head.replace('.', '_')}_{digest}"
        unique, repeat = key, 1
        while unique in used:
            repeat += 1
            unique = f"{key}_{repeat}"
        used.add(unique)
        keys[src.rel] = unique
    return keys


@dataclass(frozen=True)
class RecordSpan:
    """Byte offsets and sizes of one record's member data in its tar: the image (``KEY.jpg``, or
    ``KEY.ppm``: ``ext``) and ``KEY.cls``."""

    key: str
    image_offset: int
    image_size: int
    label_offset: int
    label_size: int
    ext: str = IMAGE_EXT


class ShardWriter:
    """Writes records to one tar: ``tarfile``'s bytes with fixed metadata (mtime 0, mode 0444: same
    records, same bytes), each member in one ``os.writev`` (``addfile``'s 16 KiB pieces let the
    checking threads starve the writer of the GIL; docs/performance.md#converters). ``tell()``:
    bytes so far. Raises :class:`ShardFormatError` for a name over 100 bytes, ``OSError``."""

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        self._offset = 0
        self._sha256 = hashlib.sha256()  # of the bytes written, so the shard is not read again

    def _add(self, name: str, data: bytes) -> int:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), 0, 0o444
        info.uname = info.gname = ""
        if len(name.encode()) > 100:
            raise ShardFormatError(f"{name}: member name longer than 100 bytes")
        header = info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")
        data_at = self._offset + len(header)
        self._write([header, data, bytes(-len(data) % tarfile.BLOCKSIZE)])
        return data_at

    def _write(self, pieces: list[bytes]) -> None:
        size = sum(map(len, pieces))
        for piece in pieces:
            self._sha256.update(piece)
        written = os.writev(self._fd, pieces)
        if written < size:  # a short write (a signal, a full disk): the rest, or its OSError
            rest = memoryview(b"".join(pieces))[written:]
            while rest:
                rest = rest[os.write(self._fd, rest):]
        self._offset += size

    def write(self, key: str, image: bytes, label: int, ext: str = IMAGE_EXT) -> RecordSpan:
        """Append ``KEY.<ext>`` (``image``) and ``KEY.cls`` (``label``); their span."""
        label_bytes = str(int(label)).encode()
        image_at = self._add(f"{key}.{ext}", image)
        label_at = self._add(f"{key}.{LABEL_EXT}", label_bytes)
        return RecordSpan(key, image_at, len(image), label_at, len(label_bytes), ext)

    def tell(self) -> int:
        return self._offset

    def close(self, sync: bool = False) -> None:
        """Write the end blocks and close (``sync``: ``fsync`` first); ``OSError``."""
        end = self._offset + 2 * tarfile.BLOCKSIZE  # two zero blocks, padded to a 10 KiB record
        self._write([bytes(2 * tarfile.BLOCKSIZE + -end % tarfile.RECORDSIZE)])
        try:
            if sync:
                os.fsync(self._fd)
        finally:
            os.close(self._fd)

    def sha256(self) -> str:
        return self._sha256.hexdigest()


def idx_text(spans: list[RecordSpan]) -> str:
    """DALI's index of one shard's records (``.idx``): a header line, then a line a record."""
    return f"{IDX_VERSION} {len(spans)}\n" + "".join(
        f"{s.ext} {s.image_offset} {s.image_size} {s.key}.{s.ext} {LABEL_EXT} {s.label_offset} "
        f"{s.label_size} {s.key}.{LABEL_EXT}\n" for s in spans)


def write_idx(path: str, spans: list[RecordSpan]) -> None:
    """Write DALI's index of one shard to ``path``, atomically. Raises ``OSError``."""
    replace_synced(path, idx_text(spans))


def read_idx(text: str, name: str = "index") -> list[tuple[int, int, int, int]]:
    """``(image_offset, image_size, label_offset, label_size)`` in bytes per record of a DALI
    ``v1.2`` index of ``jpg`` (or ``ppm``) + ``cls`` records. Raises :class:`ShardFormatError`."""
    lines = text.splitlines()
    head = lines[0].split() if lines else []
    if len(head) != 2 or head[0] != IDX_VERSION or not head[1].isdigit():
        raise ShardFormatError(f"{name}: not a DALI webdataset index ({IDX_VERSION} N)")
    spans = []
    for number, line in enumerate(lines[1:], 2):
        fields = line.split()
        parts = {fields[i]: fields[i + 1: i + 3] for i in range(0, len(fields) - 3, 4)}
        image = parts.get(IMAGE_EXT) or parts.get(RAW_EXT)
        if image is None or LABEL_EXT not in parts:
            raise ShardFormatError(f"{name}: line {number}: a record without .jpg and .cls")
        (io_, is_), (lo, ls) = image, parts[LABEL_EXT]
        spans.append((int(io_), int(is_), int(lo), int(ls)))
    if len(spans) != int(head[1]):
        raise ShardFormatError(f"{name}: {len(spans)} records, header says {head[1]}")
    return spans


@dataclass(frozen=True)
class ShardIndex:
    """A split's ``index.json``: ``classes`` (WNIDs; index = label), ``shards`` (``name``,
    ``records``, ``bytes``, and ``url`` for one kept elsewhere, relative, absolute or a URL), the
    shuffle ``seed``, the image ``rules`` version; optionally ``names``, ``cap`` and ``raw``
    (version 2)."""

    classes: list[str]
    shards: list[dict]
    seed: int | None = None
    rules: int | None = None
    names: list[str] | None = None  # optional: human-readable class names, where known
    cap: dict = field(default_factory=dict)
    raw: dict = field(default_factory=dict)

    @property
    def records(self) -> int:
        return sum(s["records"] for s in self.shards)

    def write(self, folder: str) -> None:
        """Write ``folder/index.json`` atomically. Raises ``OSError``."""
        extra = {"names": self.names} if self.names is not None else {}
        replace_synced(os.path.join(folder, INDEX_NAME), json.dumps({
            "format": FORMAT_NAME, "version": RAW_VERSION if self.raw else BASE_VERSION,
            "classes": self.classes, "seed": self.seed, "rules": self.rules,
            "records": self.records, "bytes": sum(s["bytes"] for s in self.shards), **self.cap,
            "shards": self.shards, **extra, **({"raw": self.raw} if self.raw else {})}, indent=1))

    @classmethod
    def from_json(cls, text: str, name: str = INDEX_NAME) -> "ShardIndex":
        """Raises :class:`ShardFormatError`."""
        try:
            data = json.loads(text)
            if data.get("format") != FORMAT_NAME or data.get("version") not in (BASE_VERSION,
                                                                                RAW_VERSION):
                raise ShardFormatError(f"{name}: not a {FORMAT_NAME} v1 or v{FORMAT_VERSION} "
                                       "index")
            shards = [{"name": str(s["name"]), "records": int(s["records"]),
                       "bytes": int(s["bytes"]), **({"url": str(s["url"])} if "url" in s else {})}
                      for s in data["shards"]]
            names = data.get("names")
            index = cls(list(data["classes"]), shards, data.get("seed"), data.get("rules"),
                        list(names) if names is not None else None, Cap.fields_in(data),
                        dict(data.get("raw") or {}))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ShardFormatError(f"{name}: unreadable index ({exc})") from None
        if index.records != data.get("records", index.records):
            raise ShardFormatError(f"{name}: shard record counts do not add up to 'records'")
        return index


def in_place(output: str, shard: dict) -> bool:
    """Whether a finished shard (its progress entry) is in ``output`` at its size, with its
    ``.idx``."""
    tar = os.path.join(output, shard["name"])
    return (os.path.isfile(tar) and os.path.getsize(tar) == shard["bytes"]
            and os.path.isfile(idx_name(tar)))


def refuse_foreign(output: str) -> list[str]:
    """The names in ``output`` (none if absent). Raises :class:`ConversionError` for a file or a
    folder holding files other than a conversion's."""
    if os.path.exists(output) and not os.path.isdir(output):
        raise ConversionError(f"{output}: exists and is not a directory; choose another -o")
    names = sorted(os.listdir(output)) if os.path.isdir(output) else []
    foreign = [n for n in names if not _OURS.fullmatch(n)]
    if foreign:
        raise ConversionError(f"{output}: holds files other than shards ({foreign[0]}); "
                              "choose another -o")
    return names


def write_index(output: str, listing: Listing, state: ResumeState, skips: list,
                raw: dict) -> None:
    """``skipped.tsv`` (``skips``, in source order), then ``index.json`` of ``state``'s shards,
    last. Raises :class:`ConversionError` if there is no shard, ``OSError``."""
    write_report(output, listing, state.records, skips)
    entries = [{k: s[k] for k in ("name", "records", "bytes")} for s in state.shards]
    ShardIndex(listing.classes, entries, state.settings["shuffle_seed"], RULES_VERSION,
               names=listing.names, cap=state.settings["cap"], raw=raw).write(output)
