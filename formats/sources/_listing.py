"""What every source layout lists: :class:`Source` (one image and where its bytes are),
:class:`Listing` (a split's classes and sources), :func:`read_source` and the one error a
listing raises, :class:`DatasetError`. Nothing here imports the image rules, so
:mod:`formats.images` can re-export these names."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, replace


class DatasetError(Exception):
    """The dataset cannot be used (missing, no class folder, no file, a damaged or incomplete
    download, labels that do not match the images): one line naming the file."""


@dataclass(slots=True)
class Source:
    """One candidate image: ``path`` of the file holding its bytes (the image file itself, or
    the archive it lies in), ``rel`` its path as the extracted class-folder layout has it
    (``<wnid>/<file name>``: decides the shuffled order), ``label``; ``offset`` and ``size``:
    where its bytes lie in ``path`` (a tar member's data, in bytes), ``-1`` for the whole file.
    Slotted: a listing holds 1.28 M of them for ImageNet."""

    path: str
    rel: str
    label: int
    offset: int = -1
    size: int = -1

    def where(self) -> str:
        """The source as a message names it: its file, or ``archive[member rel]``."""
        return self.path if self.offset < 0 else f"{self.path}[{self.rel}]"


def read_source(src: Source) -> bytes:
    """The bytes of ``src``: the whole file, or ``size`` bytes at ``offset`` (one ``pread``).
    Raises ``OSError`` (``EIO``-like, with a message) if the archive ends before them."""
    with open(src.path, "rb", buffering=0) as f:
        if src.offset < 0:
            return f.read()
        data = os.pread(f.fileno(), src.size, src.offset)
    if len(data) != src.size:
        raise OSError(5, f"archive ends inside this member ({len(data)} of {src.size} bytes)")
    return data


@dataclass
class Listing:
    """A split as the converter sees it: sorted ``classes`` (WNIDs; index = label), its
    ``files`` (sources in the extracted class-folder layout's order: by class, then by name),
    ``empty_classes``; ``layout`` says which download it came from (``detect``'s line),
    ``names`` the human-readable class names where the source has them (None otherwise);
    ``stage``: for sources that can only be read front to back (``.tar.gz``, Parquet), the
    callable that copies their bytes to a seekable file first (:mod:`formats.sources._staging`)."""

    root: str
    classes: list[str]
    files: list[Source]
    empty_classes: list[str]
    shuffle_seed: int | None = None  # None: ImageFolder's order (sorted by class)
    layout: str = "class folders"
    names: list[str] | None = None
    stage: object = field(default=None, repr=False)

    def shuffled(self, seed: int) -> "Listing":
        """The same listing with ``files`` in a pseudo-random order fixed by ``seed``: sorted
        by the SHA-256 of ``seed`` and each file's relative path, so the order depends on
        nothing else (not the Python or NumPy version, not the listing order, not the layout
        the files came from) and resuming a conversion, or verifying one, recomputes it
        exactly."""
        def key(src: Source) -> bytes:
            return hashlib.sha256(b"%d\0" % seed + os.fsencode(src.rel)).digest()

        return replace(self, files=sorted(self.files, key=key), shuffle_seed=seed)


def class_listing(root: str, classes: list[str], files: list[Source], layout: str,
                  names: list[str] | None = None) -> Listing:
    """A :class:`Listing` of ``files`` sorted as the class-folder layout lists them (by
    ``rel``: class folder, then file name), with the classes that have no file."""
    files.sort(key=lambda s: s.rel)
    present = {s.label for s in files}
    empty = [name for label, name in enumerate(classes) if label not in present]
    return Listing(root, classes, files, empty, layout=layout, names=names)
