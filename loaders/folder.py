"""JPEG folder backend: an ImageNet-layout directory (``root/<wnid>/<image>.JPEG``) read with
torchvision's ``ImageFolder``, so labels are ``ImageFolder.class_to_idx`` by construction."""
from __future__ import annotations

import os

from torchvision import datasets

from ._common import DataError, DeviceLoader, DistInfo, check_same_classes, loader_options
from formats.lmdb import is_lmdb
from .orders import RandomOrder, ShardOrder
from ._settings import LoaderSettings
from .transforms import read_file, split_transform


class ImageFolderBytes(datasets.ImageFolder):
    """``ImageFolder`` that hands the transform each file's bytes, ignores hidden class folders
    (``.ipynb_checkpoints``: not a class, as ``folder2lmdb.py`` sees it too) and keeps empty
    class folders as classes, so labels match the converter's."""

    def __init__(self, root: str, transform=None):
        super().__init__(root, transform=transform, loader=read_file, allow_empty=True)

    def find_classes(self, directory: str):
        classes = sorted(e.name for e in os.scandir(directory)
                         if e.is_dir() and not e.name.startswith("."))
        if not classes:
            raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
        return classes, {name: i for i, name in enumerate(classes)}

    def name_of(self, index: int) -> str:
        """The file behind sample ``index``."""
        return self.samples[index][0]


def open_image_folder(root: str, transform=None) -> ImageFolderBytes:
    """``ImageFolder(root)`` yielding ``(transform(file bytes), int label)``; with the transforms
    of ``loaders.transforms`` that is ``(uint8 tensor (3, H, W), label)``.

    Raises :class:`DataError` if ``root`` is an LMDB, not a directory, or holds no images.
    """
    if is_lmdb(root):
        raise DataError(f"{root}: is an LMDB database; add --lmdb")
    if not os.path.isdir(root):
        raise DataError(f"{root}: not a directory of class folders")
    try:
        dataset = ImageFolderBytes(root, transform=transform)
    except (FileNotFoundError, OSError) as exc:
        raise DataError(f"{root}: {exc}") from None
    if not dataset.samples:
        raise DataError(f"{root}: no images in its class folders")
    return dataset


def build_loaders(settings: LoaderSettings, dist: DistInfo):
    """``(train, val)`` :class:`~loaders._common.DeviceLoader` s over the JPEG folders
    ``settings.train_path`` and ``settings.val_path``: training in
    :class:`~loaders.orders.RandomOrder`, validation in :class:`~loaders.orders.ShardOrder`.
    Raises :class:`DataError` for bad folders, mismatched classes or a training shard smaller
    than one batch."""
    sizes = (settings.train_crop_size, settings.val_resize_size, settings.val_crop_size)
    train_set = open_image_folder(settings.train_path, split_transform(True, *sizes))
    val_set = open_image_folder(settings.val_path, split_transform(False, *sizes))
    check_same_classes(train_set.classes, val_set.classes)
    train_order = RandomOrder(len(train_set), dist.rank, dist.world_size, settings.seed)
    val_order = ShardOrder(len(val_set), dist.rank, dist.world_size)
    return (DeviceLoader(train_set, train_order, classes=train_set.classes,
                         **loader_options(settings, dist, train=True)),
            DeviceLoader(val_set, val_order, classes=val_set.classes,
                         **loader_options(settings, dist, train=False)))
