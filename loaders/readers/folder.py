"""JPEG class folders (``root/<wnid>/<image>.JPEG``) listed as the converters list them
(:func:`formats.sources.class_files`): ``main.py`` and ``folder2lmdb.py`` count the same."""
from __future__ import annotations

import os

from formats.lmdb import is_lmdb
from formats.sources import DatasetError, class_files

from ..errors import DataError
from ..settings import LoaderSettings
from . import Reader


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class FolderReader(Reader):
    """A split's class folders: ``classes``, ``class_to_idx`` and ``samples`` (``(path,
    label)``) as ``ImageFolder``'s, hidden files and folders left out. Raises
    :class:`~formats.sources.DatasetError` if ``root`` has no class folder or no file."""

    def __init__(self, root: str):
        self.classes, files = class_files(root)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.samples = [(path, label) for path, _, label in files]

    def __len__(self) -> int:
        return len(self.samples)

    def read(self, index: int) -> tuple[bytes, int]:
        path, label = self.samples[index]
        return read_file(path), label

    def name_of(self, index: int) -> str:
        return self.samples[index][0]


def open_reader(root: str, settings: LoaderSettings | None = None) -> FolderReader:
    """``root``'s :class:`FolderReader`. Raises :class:`DataError` for an LMDB, not a folder."""
    if is_lmdb(root):
        raise DataError(f"{root}: is an LMDB database; add --lmdb")
    if not os.path.isdir(root):
        raise DataError(f"{root}: not a directory of class folders")
    try:
        return FolderReader(root)
    except DatasetError as exc:
        raise DataError(str(exc)) from None
