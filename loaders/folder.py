"""JPEG folder backend: an ImageNet-layout directory (``root/<wnid>/<image>.JPEG``) read with
torchvision's ``ImageFolder``, so labels are ``ImageFolder.class_to_idx`` by construction."""
from __future__ import annotations

import os

from torchvision import datasets

from ._common import DataError, DistInfo, check_same_classes, make_loader, split_paths
from ._lmdb_codec import is_lmdb
from ._transforms import build_transform, read_file


def open_image_folder(root: str, transform=None) -> datasets.ImageFolder:
    """``ImageFolder(root)`` yielding ``(transform(file bytes), int label)``; with the transforms
    of ``loaders._transforms`` that is ``(uint8 tensor (3, H, W), label)``.

    Raises :class:`DataError` if ``root`` is an LMDB, not a directory, or holds no images.
    """
    if is_lmdb(root):
        raise DataError(f"{root}: is an LMDB database; add --lmdb")
    if not os.path.isdir(root):
        raise DataError(f"{root}: not a directory of class folders")
    try:
        return datasets.ImageFolder(root, transform=transform, loader=read_file)
    except (FileNotFoundError, OSError) as exc:
        raise DataError(f"{root}: {exc}") from None


def build_loaders(args, dist: DistInfo):
    """``(train, val)`` :class:`~loaders._common.DeviceLoader` s over the JPEG folders."""
    train_root, val_root = split_paths(args)
    train_set = open_image_folder(train_root, build_transform(args, train=True))
    val_set = open_image_folder(val_root, build_transform(args, train=False))
    check_same_classes(train_set.classes, val_set.classes)
    return (make_loader(train_set, args, dist, train=True, classes=train_set.classes),
            make_loader(val_set, args, dist, train=False, classes=val_set.classes))
