"""Where the converters read images from: each ImageNet download as distributed (class folders,
image-net.org's tars, Kaggle's tree, Hugging Face's files; one module each), told apart by
:func:`detect` and listed by :func:`open_dataset`. In every layout ``classes`` are the sorted WNIDs
and each ``rel`` the path in the extracted class folders, so a shuffled conversion writes the same
records in the same order from any of them."""
from __future__ import annotations

import os

from . import huggingface, imagenet_tars as tars, kaggle
from ._listing import (DatasetError, Listing, Source, class_files, class_folders, list_sources,
                       read_source, replace_synced, write_synced)

SPLITS = ("train", "val")
# ILSVRC-2012: images per split and classes (Russakovsky et al. 2015, table 1; the devkit).
EXPECTED = {"train": 1_281_167, "val": 50_000, "classes": 1_000}


def _is_class_folders(path: str) -> bool:
    try:
        return bool(class_folders(path))
    except OSError:  # also no such folder
        return False


def detect(path: str, split: str | None = None) -> tuple[str, str]:
    """``(layout, location)`` of ``split`` in ``path`` (None: ``path`` is the split): ``"class
    folders"``, ``"imagenet tars"``, ``"kaggle"`` or ``"huggingface"``, and what to read. Raises
    :class:`DatasetError` saying what was looked for."""
    if split is None:
        if os.path.isfile(path) and path.endswith(".tar"):
            return "imagenet tars", path
        if _is_class_folders(path) and not os.path.isdir(os.path.join(path, kaggle.TREE)):
            return "class folders", path
    elif split not in SPLITS:
        raise DatasetError(f"--split {split!r}: train or val")
    if not os.path.isdir(path):
        raise DatasetError(f"{path}: no such directory")
    if split is None:
        raise DatasetError(f"Couldn't find any class folder in {path}. For a download folder "
                           "(the official tars, Kaggle's or Hugging Face's) give --split train "
                           "or val")
    if os.path.isdir(os.path.join(path, kaggle.TREE, split)):
        return "kaggle", path
    if huggingface.find_files(path, split)[1]:
        return "huggingface", path
    tar = tars.TRAIN_TAR if split == "train" else tars.VAL_TAR
    for name in (tar, tar.removesuffix(".tar")):  # the tar, or its extracted folder
        if os.path.exists(os.path.join(path, name)):
            return "imagenet tars", os.path.join(path, name)
    folder = os.path.join(path, split)
    if _is_class_folders(folder):
        return "class folders", folder
    if os.path.isdir(folder) and tars.find_devkit(path):
        return "imagenet tars", folder  # the val tar extracted flat, or the class tars of train
    raise DatasetError(
        f"{path}: found no {split} split: looked for class folders {split}/<wnid>/, "
        f"{tar} (+ {tars.DEVKIT}), Kaggle's {kaggle.TREE}/{split}/ and Hugging "
        f"Face's data/*.parquet or data/*.tar.gz")


def open_dataset(path: str, split: str | None = None, allow_partial: bool = False) -> Listing:
    """The :class:`Listing` of ``split`` of ``path`` (:func:`detect`); archives must hold
    :data:`EXPECTED` unless ``allow_partial``. Raises :class:`DatasetError` (one line)."""
    layout, where = detect(path, split)
    if layout == "class folders":
        return list_sources(where)
    split = split or ("val" if "val" in os.path.basename(where) else "train")
    if layout == "kaggle":
        listing = kaggle.list_kaggle(where, split)
    elif layout == "huggingface":
        listing = huggingface.list_huggingface(where, split)
    else:
        devkit = tars.find_devkit(os.path.dirname(os.path.abspath(where)))
        listing = (tars.list_train if split == "train" else tars.list_val)(where, devkit)
    if not allow_partial:
        _check_counts(listing, split, layout)
    return listing


def _check_counts(listing: Listing, split: str, layout: str) -> None:
    """Raise :class:`DatasetError` unless ``listing`` is all of ImageNet's ``split``."""
    problems = []
    if len(listing.classes) != EXPECTED["classes"]:
        problems.append(f"{len(listing.classes):,} classes, ImageNet has "
                        f"{EXPECTED['classes']:,}")
    if listing.empty_classes:
        first = listing.empty_classes[0]
        what = f"{first}.tar" if layout == "imagenet tars" and split == "train" else first
        more = f" and {len(listing.empty_classes) - 1:,} more" if len(listing.empty_classes) > 1 \
            else ""
        problems.append(f"no images of class {what}{more}")
    if len(listing.files) != EXPECTED[split]:
        problems.append(f"{len(listing.files):,} {split} images, ImageNet has "
                        f"{EXPECTED[split]:,}")
    if problems:
        raise DatasetError(f"{listing.root}: " + "; ".join(problems) + " (an incomplete "
                           "download? --allow-partial converts what is there)")
