"""What both ways of writing shards share (one process, :mod:`._convert`; a job array's task,
:mod:`._array`): the name of ``progress.json`` (a :class:`~formats.conversion.ResumeState`
with the finished shards' entries), the shard being written and the loop that checks
source files and writes their records."""
from __future__ import annotations

import json
import os
import re
import tarfile
from contextlib import closing
from dataclasses import dataclass

from decode.acceptance import MAX_PIXELS
from formats import raw_share
from formats.conversion import ConversionError, replace_synced, report_damaged
from formats.images import check_files

from ._codec import IMAGE_EXT, RAW_EXT, ShardWriter, idx_name, write_idx

PROGRESS_NAME = "progress.json"
_OURS = re.compile(r"(.+-\d{6}\.(tar|idx|done)|index\.json|progress\.json|skipped\.tsv)"
                   r"(\.lock|(\.\d+)?\.tmp)?")


def save_json(path: str, data, tmp: str) -> None:
    """Write ``data`` to ``path`` as JSON atomically (:func:`~formats.conversion.replace_synced`
    under the name ``tmp``). Raises ``OSError``."""
    replace_synced(path, json.dumps(data, indent=1).encode(), tmp)


class _OpenShard:
    """The shard being written: its tar writer, record spans and progress entry fields."""

    def __init__(self, output: str, name: str, skipped: list):
        self.name, self.path = name, os.path.join(output, name)
        # under a temporary name until complete: no reader sees half a shard as a shard
        self.writer, self.spans, self.skipped = ShardWriter(self.path + ".tmp"), [], skipped
        self.images = self.reencoded = 0

    def fits(self, size: int, label: int, max_bytes: int, max_records: int | None) -> bool:
        """Whether a record of ``size`` image bytes may join (an empty shard takes any)."""
        if not self.spans:
            return True
        if max_records and len(self.spans) >= max_records:
            return False
        block, record = tarfile.BLOCKSIZE, tarfile.RECORDSIZE
        # each member: a header, its data padded to 512; then two zero blocks, padded to 10 KiB
        grown = self.writer.tell() + sum(block * (1 + -(-n // block)) for n in (size,
                                                                               len(str(label))))
        return -(-(grown + 2 * block) // record) * record <= max_bytes

    def add(self, key: str, checked, label: int, data: bytes, ext: str) -> None:
        """Append ``data`` (``checked.data``, or its raw record with ``ext`` ``ppm``)."""
        self.spans.append(self.writer.write(key, data, label, ext))
        self.images += len(data)
        self.reencoded += checked.reencoded is not None

    def finish(self, done: int) -> dict:
        """Close and sync the tar, write its ``.idx``, and return its progress entry ``{name,
        records, bytes (tar), sha256, done (source files through it), images (image bytes),
        reencoded, skipped ([[rel, reason], ...])}``. Raises ``OSError``."""
        self.writer.close(sync=True)
        write_idx(idx_name(self.path), self.spans)
        os.replace(self.path + ".tmp", self.path)
        return {"name": self.name, "records": len(self.spans), "bytes": self.writer.tell(),
                "sha256": self.writer.sha256(), "done": done, "images": self.images,
                "reencoded": self.reencoded, "skipped": self.skipped}


def in_place(output: str, shard: dict) -> bool:
    """Whether a finished shard (its progress entry) is in ``output``: its tar at the recorded
    size, and its ``.idx``."""
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


@dataclass
class Records:
    """What every shard of one conversion shares: the ``output`` folder, record ``keys``, the byte
    limit and how the files are checked; ``total``: the listing's file count (the raw share's pro
    rata); ``bar``: the progress bar, or None."""

    output: str
    keys: dict
    shard_size: int
    workers: int
    strict: bool
    check: str = "full"
    cap: object = None
    max_pixels: int = MAX_PIXELS
    total: int = 0
    bar: object = None

    def write(self, files: list, first: int, max_records: int | None, name_of, commit,
              choice=None, budget_from: int = 0) -> list:
        """Check ``files`` (source ``first`` on) and write their records as shards named
        ``name_of()``, each ended at ``max_records`` or the byte limit and passed to
        ``commit(shard, done, raw)`` (``done``: source files through it; ``raw``: the raw share's
        totals through it, its budget pro rata of the files from source ``budget_from`` on).
        Returns the skips no shard took (``[[rel, reason]]``: files without one image). Raises
        :class:`ConversionError` (``strict``)."""
        shard, skipped = None, []
        post = raw_share.with_candidate(choice) if choice is not None else None
        with closing(check_files(files, self.workers, self.check,
                                 ahead=max(32, 16 * self.workers), cap=self.cap, post=post,
                                 max_pixels=self.max_pixels)) as results:
            for index, result in enumerate(results, first):
                src = files[index - first]
                if self.bar is not None:
                    self.bar.update(1)
                if isinstance(result, str):  # not an image: the reason
                    if self.strict:
                        raise ConversionError(f"{src.where()}: {result} (--strict)")
                    (shard.skipped if shard else skipped).append([src.rel, result])
                    continue
                if result.warning:
                    report_damaged("folder2shards.py", src, result.warning)
                before = choice.state() if choice is not None else None
                data, ext = (result.raw, RAW_EXT) if choice is not None and choice.take(
                    len(result.data), result.raw and len(result.raw), result.pixels,
                    index + 1 - budget_from, self.total) else (result.data, IMAGE_EXT)
                if shard and not shard.fits(len(data), src.label, self.shard_size, max_records):
                    commit(shard, index, before)
                    shard = None
                if shard is None:
                    shard, skipped = _OpenShard(self.output, name_of(), skipped), []
                shard.add(self.keys[src.rel], result, src.label, data, ext)
        if shard is not None:
            commit(shard, first + len(files), choice.state() if choice else None)
        return skipped
