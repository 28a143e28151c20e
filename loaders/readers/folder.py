"""JPEG class folders (``root/<wnid>/<image>.JPEG``) by torchvision's ``ImageFolder`` scan, so
labels are its ``class_to_idx``, as pytorch/examples imagenet/main.py reads them."""
from __future__ import annotations

import os

from torchvision import datasets

from formats.lmdb import is_lmdb

from ..errors import DataError
from ..orders import Order, ShardOrder, shuffled_order
from ..settings import DistInfo, LoaderSettings
from . import Reader


def read_file(path: str) -> bytes:
    """A file's bytes (decoding is the pipeline's)."""
    with open(path, "rb") as f:
        return f.read()


class FolderReader(datasets.ImageFolder, Reader):
    """:class:`~loaders.readers.Reader` over one split's class folders by ``ImageFolder``'s scan
    (``samples``: ``(path, label)``), hidden folders (``.ipynb_checkpoints``) not classes and empty
    ones kept, as ``folder2lmdb.py`` sees them; ``dataset[i]``: the file's bytes and label."""

    def __init__(self, root: str):
        super().__init__(root, loader=read_file, allow_empty=True)

    def find_classes(self, directory: str):
        classes = sorted(e.name for e in os.scandir(directory)
                         if e.is_dir() and not e.name.startswith("."))
        if not classes:
            raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
        return classes, {name: i for i, name in enumerate(classes)}

    def read(self, index: int) -> tuple[bytes, int]:
        path, label = self.samples[index]
        return read_file(path), label

    def name_of(self, index: int) -> str:
        """The file behind sample ``index``."""
        return self.samples[index][0]

    def train_order(self, settings: LoaderSettings, dist: DistInfo) -> Order:
        return shuffled_order(len(self), settings, dist)

    def val_order(self, settings: LoaderSettings, dist: DistInfo) -> ShardOrder:
        return ShardOrder(len(self), dist.rank, dist.world_size)


def open_image_folder(root: str) -> FolderReader:
    """``root``'s :class:`FolderReader`. :class:`DataError`: an LMDB, not a folder, no image."""
    if is_lmdb(root):
        raise DataError(f"{root}: is an LMDB database; add --lmdb")
    if not os.path.isdir(root):
        raise DataError(f"{root}: not a directory of class folders")
    try:
        reader = FolderReader(root)
    except (FileNotFoundError, OSError) as exc:
        raise DataError(f"{root}: {exc}") from None
    if not reader.samples:
        raise DataError(f"{root}: no images in its class folders")
    return reader


def open_reader(path: str, settings: LoaderSettings) -> FolderReader:
    """This source's entry of ``loaders.readers.READERS``."""
    return open_image_folder(path)
