"""What every source layout lists (:class:`Source`, :class:`Listing`, :func:`read_source`,
:class:`DatasetError`), free of the image rules, the formats' one atomic file write
(:func:`replace_synced`), and the extracted layout: class folders ``root/<wnid>/<image>``, as
torchvision's ``ImageFolder`` reads them but for hidden files and folders (a Mac's ``._NAME``,
``.ipynb_checkpoints``): the one listing of the converters and ``main.py``'s folder loader."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, replace


class DatasetError(Exception):
    """The dataset cannot be used (missing, no class folder, no file, a damaged or incomplete
    download, labels that do not match): one line naming the file."""


@dataclass(slots=True)
class Source:
    """One image: ``path`` holding its bytes (file or archive), ``rel`` (``<wnid>/<name>``, which
    orders the shuffle), ``label``, ``offset``/``size`` in ``path`` (-1: whole file)."""

    path: str
    rel: str
    label: int
    offset: int = -1
    size: int = -1

    def where(self) -> str:
        """The source as messages name it: its file, or ``archive[rel]``."""
        return self.path if self.offset < 0 else f"{self.path}[{self.rel}]"


def read_source(src: Source) -> bytes:
    """The bytes of ``src``: the whole file, or ``size`` bytes at ``offset`` (one ``pread``).
    Raises ``OSError`` (also if the archive ends before them)."""
    with open(src.path, "rb", buffering=0) as f:
        if src.offset < 0:
            return f.read()
        data = os.pread(f.fileno(), src.size, src.offset)
    if len(data) != src.size:
        raise OSError(5, f"archive ends inside this member ({len(data)} of {src.size} bytes)")
    return data


@dataclass
class Listing:
    """A split: sorted ``classes`` (WNIDs; index = label), ``files`` (by class, then name),
    ``empty_classes``, ``layout`` in words, ``names`` (or None), ``stage`` (or None: a copy to a
    seekable file, first, of sources readable only front to back)."""

    root: str
    classes: list[str]
    files: list[Source]
    empty_classes: list[str]
    shuffle_seed: int | None = None  # None: ImageFolder's order (sorted by class)
    layout: str = "class folders"
    names: list[str] | None = None
    stage: object = field(default=None, repr=False)

    def shuffled(self, seed: int) -> "Listing":
        """``files`` sorted by SHA-256 of ``seed`` and each ``rel``: an order nothing else changes,
        so resume and ``--verify`` recompute it."""
        def key(src: Source) -> bytes:
            return hashlib.sha256(b"%d\0" % seed + os.fsencode(src.rel)).digest()

        return replace(self, files=sorted(self.files, key=key), shuffle_seed=seed)


def class_listing(root: str, classes: list[str], files: list[Source], layout: str,
                  names: list[str] | None = None, by_rel: bool = True) -> Listing:
    """A :class:`Listing` of ``files`` (sorted by ``rel`` if ``by_rel``), with its empty
    classes."""
    if by_rel:
        files.sort(key=lambda s: s.rel)
    present = {s.label for s in files}
    empty = [name for label, name in enumerate(classes) if label not in present]
    return Listing(root, classes, files, empty, layout=layout, names=names)


def named_classes(by_wnid: dict[str, str]) -> tuple[list[str], list[str], dict[str, int]]:
    """The sorted WNIDs of ``{WNID: words}``, their words and ``{WNID: label}``."""
    classes = sorted(by_wnid)
    return classes, [by_wnid[w] for w in classes], {w: label for label, w in enumerate(classes)}


def class_folders(root: str) -> list[str]:
    """The sorted non-hidden folders in ``root``. Raises ``OSError``."""
    return sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))


def class_files(root: str) -> tuple[list[str], list[tuple[str, str, int]]]:
    """``(classes, files)`` of ``root``: classes its sorted non-hidden folders (ImageFolder's
    ``class_to_idx``, which also counts hidden ones), files ``(path, rel, label)`` of every
    non-hidden file below them in ``make_dataset``'s order (tuples: a listing of ImageNet costs
    about what ImageFolder's does). Raises :class:`DatasetError` if ``root`` is missing or has no
    class folder or file."""
    if not os.path.isdir(root):
        raise DatasetError(f"{root}: no such directory")
    try:
        classes = class_folders(root)
    except OSError as exc:
        raise DatasetError(f"{root}: cannot list ({exc.strerror})") from None
    if not classes:
        raise DatasetError(f"Couldn't find any class folder in {root}.")
    files = []
    for label, name in enumerate(classes):
        top, walked = os.path.join(root, name), []
        for dirpath, dirnames, fnames in os.walk(top, followlinks=True):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            walked.append((dirpath, sorted(f for f in fnames if not f.startswith("."))))
        for folder, fnames in sorted(walked):
            inside = name + folder[len(top):]  # os.path.relpath's answer, ~10x cheaper
            files += [(f"{folder}{os.sep}{f}", f"{inside}{os.sep}{f}", label) for f in fnames]
    if not files:
        raise DatasetError(f"{root}: no files in its {len(classes)} class folders")
    return classes, files


def list_sources(root: str) -> Listing:
    """The :class:`Listing` of :func:`class_files`, empty classes kept. Raises
    :class:`DatasetError`."""
    classes, files = class_files(root)
    return class_listing(root, classes, [Source(*file) for file in files],
                         f"class folders {root}", by_rel=False)


def write_synced(path: str, data: bytes) -> None:
    """Write ``data`` to ``path``, synced. Raises ``OSError``."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def replace_synced(path: str, data: bytes | str, tmp: str | None = None) -> None:
    """Write ``data`` (str: UTF-8, surrogates escaped) to ``path`` atomically: synced as ``tmp``
    (default ``path.tmp``), then renamed, so no reader sees half of it. Raises ``OSError``."""
    tmp = tmp or path + ".tmp"
    write_synced(tmp, data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data)
    os.replace(tmp, path)
