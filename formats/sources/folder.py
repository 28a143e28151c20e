"""The extracted layout: class folders ``root/<wnid>/<image>``, as torchvision's ``ImageFolder``
reads them but for hidden files and folders (a Mac's ``._NAME``, ``.ipynb_checkpoints``): the one
listing of the converters and ``main.py``'s folder loader."""
from __future__ import annotations

import os

from ._listing import DatasetError, Listing, Source, class_listing


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
