"""Hugging Face's ``ILSVRC/imagenet-1k`` folder: Parquet (``data/train-*.parquet``,
``data/validation-*.parquet``: ``image`` {``bytes``, ``path``}, ``label`` indexing
``classes.py``'s sorted WNIDs) or, earlier, ``data/train_images_*.tar.gz`` and
``data/val_images.tar.gz``; file names ``<IMAGE_FILENAME>_<WNID>.JPEG`` map to the class-folder
``rel``. Neither is seekable per image: the images are staged first (:func:`stage_sequential`)."""
from __future__ import annotations

import ast
import glob
import hashlib
import os
import re
import shutil
import tarfile
from typing import Iterator

import msgpack

from ._listing import DatasetError, Listing, Source, class_listing, replace_synced

CLASSES_PY = "classes.py"
IMAGES, MANIFEST = "images.bin", "manifest.msgpack"  # a staging's files
_SPLIT_FILES = {"train": ("train-*.parquet", "train_images_*.tar.gz"),
                "val": ("validation-*.parquet", "val_images.tar.gz")}
_NAME = re.compile(r"(.+)_(n\d{8})(\.[A-Za-z]+)")


def find_files(root: str, split: str) -> tuple[str, list[str]]:
    """``("parquet" | "tar.gz", files)`` of ``split`` in ``root[/data]``, or ``("", [])``."""
    for kind, pattern in zip(("parquet", "tar.gz"), _SPLIT_FILES[split]):
        for folder in (os.path.join(root, "data"), root):
            found = sorted(glob.glob(os.path.join(folder, pattern)))
            if found:
                return kind, found
    return "", []


def read_classes_py(root: str) -> tuple[list[str], list[str]] | None:
    """Sorted WNIDs and names of ``IMAGENET2012_CLASSES`` in ``root/classes.py`` (parsed, never
    run); None without it. Raises :class:`DatasetError`."""
    path = os.path.join(root, CLASSES_PY)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(
                    getattr(t, "id", "") == "IMAGENET2012_CLASSES" for t in node.targets):
                value = node.value.args[0] if isinstance(node.value, ast.Call) else node.value
                pairs = ast.literal_eval(value)
                pairs = list(pairs.items()) if isinstance(pairs, dict) else list(pairs)
                break
        else:
            raise ValueError("no IMAGENET2012_CLASSES")
    except (OSError, SyntaxError, ValueError, IndexError, AttributeError) as exc:
        raise DatasetError(f"{path}: cannot read IMAGENET2012_CLASSES ({exc})") from None
    wnids = [str(w) for w, _ in pairs]
    if wnids != sorted(wnids):
        raise DatasetError(f"{path}: IMAGENET2012_CLASSES is not in sorted WNID order")
    return wnids, [str(n) for _, n in pairs]


def class_rel(name: str) -> tuple[str, str] | None:
    """``(wnid, rel)`` of a file name ``<IMAGE_FILENAME>_<WNID>.JPEG``, or None."""
    match = _NAME.fullmatch(os.path.basename(name))
    return (match[2], f"{match[2]}/{match[1]}{match[3]}") if match else None


def list_huggingface(root: str, split: str) -> Listing:
    """The ``split`` in ``root``, sources ``(file, item number)`` until staged. Raises
    :class:`DatasetError` for bad columns, files, names, WNIDs or labels."""
    kind, paths = find_files(root, split)
    if not paths:
        raise DatasetError(f"{root}: no Hugging Face {split} files (data/*.parquet or "
                           "data/*.tar.gz)")
    known = read_classes_py(root)
    items = []  # (path, number, name, label or None)
    for path in paths:
        if kind == "parquet":
            items += _parquet_items(path)
        else:  # a full read of the archive for its names
            items += [(path, number, name, None) for number, name, _ in _targz(path, read=False)]
    classes, names = known or (sorted({class_rel(n)[0] for _, _, n, _ in items
                                       if n and class_rel(n)}), None)
    label_of = {wnid: label for label, wnid in enumerate(classes)}
    files = [_source(path, number, name, label, classes, label_of)
             for path, number, name, label in items]
    via = f"labels from {CLASSES_PY}" if known else f"no {CLASSES_PY}: classes from file names"
    listing = class_listing(root, classes, files, f"Hugging Face {kind}: {len(paths)} "
                            f"{split} files in {os.path.dirname(paths[0])} ({via})", names)
    listing.stage = stage_sequential
    return listing


def _source(path: str, number: int, name: str | None, label: int | None, classes: list[str],
            label_of: dict[str, int]) -> Source:
    """The source of item ``number`` of ``path``, checked against its label."""
    found = class_rel(name) if name else None
    if found is None and (label is None or not 0 <= label < len(classes)):
        raise DatasetError(f"{path}: item {number}: {name!r} names no WNID "
                           "(<IMAGE_FILENAME>_<WNID>.JPEG)")
    if found is None:  # Parquet row without a path: named after its row
        return Source(path, f"{classes[label]}/{os.path.basename(path)}_{number}.JPEG", label,
                      number)
    wnid, rel = found
    if wnid not in label_of:
        raise DatasetError(f"{path}: {name}: {wnid} is not a class of {CLASSES_PY}")
    if label is not None and label != label_of[wnid]:
        raise DatasetError(f"{path}: row {number}: label {label}, but {name} is class "
                           f"{label_of[wnid]} ({wnid})")
    return Source(path, rel, label_of[wnid], number)


def _parquet_items(path: str) -> list[tuple[str, int, str | None, int]]:
    """``(path, row, image path, label)`` of a Parquet file, without reading the images."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        schema = parquet.schema_arrow
        image = schema.field("image").type if "image" in schema.names else None
        missing = [c for c, ok in (("image", image is not None), ("label", "label" in schema.names))
                   if not ok]
        if not missing and not (pa.types.is_struct(image) and image.get_field_index("bytes") >= 0):
            missing = ["image.bytes"]
        if missing:
            raise DatasetError(f"{path}: no column {missing[0]!r} (Hugging Face's schema: "
                               "image {bytes, path}, label)")
        has_path = image.get_field_index("path") >= 0
        table = parquet.read(columns=(["image.path"] if has_path else []) + ["label"])
    except (OSError, pa.ArrowException) as exc:
        raise DatasetError(f"{path}: not a readable Parquet file ({exc})") from None
    labels = table.column("label").to_pylist()
    paths = ([row["path"] for row in table.column("image").to_pylist()] if has_path
             else [None] * len(labels))
    return [(path, row, name, label) for row, (name, label) in enumerate(zip(paths, labels))]


def _targz(path: str, read: bool) -> Iterator[tuple[int, str, bytes | None]]:
    """``(member number, name, bytes if read)`` of each file of a ``.tar.gz``, front to back.
    Raises :class:`DatasetError` naming the file."""
    try:
        with tarfile.open(path, "r|gz") as tar:
            for number, info in enumerate(tar):
                if info.isreg():
                    yield number, info.name, tar.extractfile(info).read() if read else None
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise DatasetError(f"{path}: truncated or not a .tar.gz ({exc})") from None


def read_items(path: str):
    """``(item number, bytes)`` of each image of a Parquet file (a row group at a time) or
    ``.tar.gz``, front to back. Raises :class:`DatasetError` naming the file."""
    if path.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            parquet, row = pq.ParquetFile(path), 0
            for group in range(parquet.metadata.num_row_groups):
                column = parquet.read_row_group(group, columns=["image.bytes"]).column("image")
                for value in column.combine_chunks().field("bytes").to_pylist():
                    yield row, value or b""
                    row += 1
        except (OSError, pa.ArrowException) as exc:
            raise DatasetError(f"{path}: unreadable Parquet file ({exc})") from None
        return
    for number, _, data in _targz(path, read=True):
        yield number, data


def stage_sequential(files: list[Source], folder: str, progress: bool = True) -> None:
    """Staging: point each of ``files`` (``(archive, item number)`` sources) at a copy of its bytes
    in ``folder/images.bin``, copied in one pass (:func:`read_items`) unless ``folder`` holds a
    complete staging of the same items (``manifest.msgpack``), so the shuffled conversion reads
    each with one ``pread``. Needs free disk for the images until the converter deletes it. Raises
    :class:`DatasetError` for an unreadable archive or a lost item, ``OSError`` if the folder
    cannot be written."""
    from tqdm import tqdm

    # a complete staging's key: SHA-256 of the archives (path, size, mtime) and items named
    digest = hashlib.sha256()
    for path in sorted({s.path for s in files}):
        st = os.stat(path)
        digest.update(msgpack.packb([path, st.st_size, st.st_mtime_ns]))
    for src in sorted(files, key=lambda s: (s.path, s.offset)):
        digest.update(msgpack.packb([src.path, src.offset, src.rel]))
    key, manifest = digest.digest(), os.path.join(folder, MANIFEST)
    by_item = {(s.path, s.offset): s for s in files}
    try:
        with open(manifest, "rb") as f:
            stored, rows = msgpack.unpackb(f.read(), raw=False)
        spans = {(p, n): (a, s) for p, n, a, s in rows} if stored == key else None
    except (OSError, ValueError, msgpack.exceptions.ExtraData):
        spans = None
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
        replace_synced(manifest, msgpack.packb([key, [[p, n, a, s] for (p, n), (a, s)
                                                      in spans.items()]]))
    images = os.path.join(folder, IMAGES)
    for item, src in by_item.items():
        src.path, (src.offset, src.size) = images, spans[item]
