"""Staging: the images of archives readable only front to back (``.tar.gz``, Parquet) copied in one
pass into ``images.bin``, so the shuffled conversion reads each with one ``pread``;
``manifest.msgpack`` marks it complete for a rerun. Needs free disk for the images until the
converter deletes it."""
from __future__ import annotations

import hashlib
import os
import shutil
from typing import Callable, Iterator

import msgpack

from ._listing import DatasetError, Source

IMAGES, MANIFEST = "images.bin", "manifest.msgpack"


def _key(files: list[Source]) -> bytes:
    """SHA-256 of the archives (path, size, mtime) and the items the sources name."""
    digest = hashlib.sha256()
    for path in sorted({s.path for s in files}):
        st = os.stat(path)
        digest.update(msgpack.packb([path, st.st_size, st.st_mtime_ns]))
    for src in sorted(files, key=lambda s: (s.path, s.offset)):
        digest.update(msgpack.packb([src.path, src.offset, src.rel]))
    return digest.digest()


def stage_sequential(files: list[Source], folder: str, progress: bool = True, *,
                     read_items: Callable[[str], Iterator[tuple[int, bytes]]]) -> None:
    """Point each of ``files`` (``(archive, item number)`` sources) at a copy of its bytes in
    ``folder/images.bin``, copying them first unless ``folder`` holds a complete staging of the
    same items; ``read_items(archive)`` yields ``(item number, bytes)`` front to back. Raises
    :class:`DatasetError` for an unreadable archive or a lost item, ``OSError`` if the folder
    cannot be written."""
    from tqdm import tqdm

    key, manifest = _key(files), os.path.join(folder, MANIFEST)
    by_item = {(s.path, s.offset): s for s in files}
    spans = _load(manifest, key)
    if spans is None:
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        spans, at = {}, 0
        bar = tqdm(total=len(files), unit="img", desc="staging", disable=not progress or None)
        with open(os.path.join(folder, IMAGES), "wb") as out:
            for path in sorted({s.path for s in files}):
                for number, data in read_items(path):
                    if (path, number) in by_item:
                        out.write(data)
                        spans[(path, number)] = (at, len(data))
                        at += len(data)
                        bar.update(1)
            out.flush()
            os.fsync(out.fileno())
        bar.close()
        lost = [item for item in by_item if item not in spans]
        if lost:
            raise DatasetError(f"{lost[0][0]}: item {lost[0][1]} listed but not read back "
                               "(the file changed?)")
        with open(manifest + ".tmp", "wb") as f:
            f.write(msgpack.packb([key, [[p, n, a, s] for (p, n), (a, s) in spans.items()]]))
        os.replace(manifest + ".tmp", manifest)
    images = os.path.join(folder, IMAGES)
    for item, src in by_item.items():
        src.path, (src.offset, src.size) = images, spans[item]


def _load(manifest: str, key: bytes) -> dict | None:
    """The spans of a complete staging with ``key``, or None."""
    try:
        with open(manifest, "rb") as f:
            stored, rows = msgpack.unpackb(f.read(), raw=False)
    except (OSError, ValueError, msgpack.exceptions.ExtraData):
        return None
    return {(p, n): (a, s) for p, n, a, s in rows} if stored == key else None
