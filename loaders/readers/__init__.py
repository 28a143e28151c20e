"""Readers: one per on-disk source behind one interface (:class:`Reader`, as timm's)."""
from __future__ import annotations

import importlib
import os
from typing import Sequence

from ..errors import DataError
from ..orders import Order, ShardOrder, shuffled_order
from ..settings import DistInfo, LoaderSettings

# source name (LoaderSettings.source) -> module whose open_reader(path, settings) makes one
READERS = {
    "folder": "loaders.readers.folder",
    "lmdb": "loaders.readers.lmdb_records",
    "shards": "loaders.readers.shards",
}


class Reader:
    """One split of a source: ``classes``, ``len()``, ``read(i) -> (encoded bytes, label)``,
    ``name_of(i)``, its epoch orders. ``read`` may run in several threads and raises
    :class:`DataError` for a damaged store, ``IndexError`` outside ``0..len-1``."""

    classes: Sequence[str]  # class names, index = label
    # read(i) in any order costs about the same; else (streamed shards) each pass is planned by
    # plan_pass here and taken by follow in the (kept) workers
    random_access = True

    def train_order(self, settings: LoaderSettings, dist: DistInfo) -> Order:
        """This rank's training order: :func:`~loaders.orders.shuffled_order` unless overridden."""
        return shuffled_order(len(self), settings, dist)

    def val_order(self, settings: LoaderSettings, dist: DistInfo) -> Order:
        """The validation epoch order of this rank: every sample once across ranks."""
        return ShardOrder(len(self), dist.rank, dist.world_size)

    def plan_pass(self, order: Order, epoch: int, remaining: list[int] | None) -> tuple | None:
        """The pass about to start: ``epoch`` of ``order``, ``remaining`` of a resumed one; what
        the workers' ``follow`` takes."""


def open_reader(source: str, path: str, settings: LoaderSettings) -> Reader:
    """The :class:`Reader` of ``source`` (a key of :data:`READERS`) over the split at ``path``.
    Raises ``KeyError`` for an unknown source, :class:`DataError` for a bad split."""
    return importlib.import_module(READERS[source]).open_reader(path, settings)


def split_paths(data: str | None, train: str | None = None,
                val: str | None = None) -> tuple[str, str]:
    """``--train``/``--val``, else ``data/train`` and ``data/val``. Raises :class:`DataError`
    for a root not given or not there (URLs, ``pipe:``, braces: the shard reader's to check)."""
    paths = []
    for split, given in (("train", train), ("val", val)):
        path = given or (os.path.join(data, split) if data else None)
        if path is None:
            raise DataError(f"no {split} data: give DIR (holding train/ and val/) or "
                            f"--{split} PATH")
        remote = "://" in path or path.startswith("pipe:") or "{" in path
        if not remote and not os.path.exists(path):
            raise DataError(f"{path}: no such file or directory")
        paths.append(path)
    return paths[0], paths[1]


def check_same_classes(train_classes: Sequence[str], val_classes: Sequence[str]) -> None:
    """Raise :class:`DataError` unless train and val list the same classes in the same order."""
    if list(train_classes) != list(val_classes):
        only_train = sorted(set(train_classes) - set(val_classes))[:3]
        only_val = sorted(set(val_classes) - set(train_classes))[:3]
        raise DataError(
            f"train and val have different classes ({len(train_classes)} vs {len(val_classes)}; "
            f"only in train: {only_train}, only in val: {only_val})")
