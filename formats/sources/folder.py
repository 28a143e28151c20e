"""The extracted layout: class folders ``root/<wnid>/<image>``, as torchvision's ``ImageFolder``
reads them."""
from __future__ import annotations

import os

from ._listing import DatasetError, Listing, Source


def list_sources(root: str) -> Listing:
    """The :class:`Listing` of ``root``: classes its sorted non-hidden folders (ImageFolder's
    ``class_to_idx``, which also counts hidden ones), files every non-hidden file below them in
    ``make_dataset``'s order, empty classes kept. Raises :class:`DatasetError` if ``root`` is
    missing or has no class folder or file."""
    if not os.path.isdir(root):
        raise DatasetError(f"{root}: no such directory")
    try:
        classes = sorted(e.name for e in os.scandir(root)
                         if e.is_dir() and not e.name.startswith("."))
    except OSError as exc:
        raise DatasetError(f"{root}: cannot list ({exc.strerror})") from None
    if not classes:
        raise DatasetError(f"Couldn't find any class folder in {root}.")
    files, empty = [], []
    for label, name in enumerate(classes):
        walked = []
        for dirpath, dirnames, fnames in os.walk(os.path.join(root, name), followlinks=True):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            walked.append((dirpath, sorted(f for f in fnames if not f.startswith("."))))
        found = [os.path.join(d, f) for d, fnames in sorted(walked) for f in fnames]
        files += [Source(path, os.path.relpath(path, root), label) for path in found]
        if not found:
            empty.append(name)
    if not files:
        raise DatasetError(f"{root}: no files in its {len(classes)} class folders")
    return Listing(root, classes, files, empty, layout=f"class folders {root}")
