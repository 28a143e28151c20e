"""Kaggle's copy (ImageNet Object Localization Challenge), extracted:
``ILSVRC/Data/CLS-LOC/train/<wnid>/*.JPEG``, ``ILSVRC/Data/CLS-LOC/val/`` flat with labels in
``LOC_val_solution.csv`` (the WNID is the first word of each box), class names in
``LOC_synset_mapping.txt``."""
from __future__ import annotations

import csv
import os

from ._listing import DatasetError, Listing, Source, class_listing, list_sources, named_classes

TREE = os.path.join("ILSVRC", "Data", "CLS-LOC")
MAPPING, VAL_CSV = "LOC_synset_mapping.txt", "LOC_val_solution.csv"


def list_kaggle(root: str, split: str) -> Listing:
    """The ``split`` of the Kaggle tree in ``root``. Raises :class:`DatasetError` for a missing
    file, a WNID ``LOC_synset_mapping.txt`` lacks, or a val image without a CSV row."""
    path = os.path.join(root, MAPPING)
    try:
        with open(path, encoding="utf-8") as f:
            rows = [line.rstrip("\n").split(" ", 1) for line in f if line.strip()]
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read ({exc.strerror})") from None
    classes, names, label_of = named_classes({row[0]: row[1] if len(row) > 1 else ""
                                              for row in rows})
    folder = os.path.join(root, TREE, split)
    layout = f"Kaggle ILSVRC tree: {folder}"
    if split == "train":
        listing = list_sources(folder)
        unknown = sorted(set(listing.classes) - set(label_of))
        if unknown:
            raise DatasetError(f"{folder}: class folder {unknown[0]} is not in {MAPPING}")
        files = [Source(s.path, s.rel, label_of[listing.classes[s.label]])
                 for s in listing.files]
        return class_listing(folder, classes, files, layout, names)
    labels = _val_labels(os.path.join(root, VAL_CSV), label_of)
    try:
        found = sorted(n for n in os.listdir(folder) if not n.startswith("."))
    except OSError as exc:
        raise DatasetError(f"{folder}: cannot list ({exc.strerror})") from None
    files = []
    for name in found:
        image_id = os.path.splitext(name)[0]
        if image_id not in labels:
            raise DatasetError(f"{folder}: {name} has no row in {VAL_CSV}")
        wnid = classes[labels[image_id]]
        files.append(Source(os.path.join(folder, name), f"{wnid}/{name}", labels[image_id]))
    return class_listing(folder, classes, files, f"{layout} (labels from {VAL_CSV})", names)


def _val_labels(path: str, label_of: dict[str, int]) -> dict[str, int]:
    """``{ImageId: label}`` from ``LOC_val_solution.csv``."""
    labels = {}
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = csv.reader(f)
            header = next(rows, [])
            if header[:2] != ["ImageId", "PredictionString"]:
                raise DatasetError(f"{path}: not ImageId,PredictionString")
            for line, row in enumerate(rows, 2):
                wnid = row[1].split()[0] if len(row) > 1 and row[1].split() else ""
                if wnid not in label_of:
                    raise DatasetError(f"{path}: line {line}: {wnid or 'no WNID'} is not in "
                                       f"{MAPPING}")
                labels[row[0]] = label_of[wnid]
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read ({exc.strerror})") from None
    return labels
