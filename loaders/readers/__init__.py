"""Readers: one per on-disk source, behind one interface (:class:`Reader`, as timm's
``readers/reader.py`` + ``reader_factory.py``), so that every pipeline (``loaders.pipelines``)
reads every source and a new format is ``formats/X`` + one reader module + one line in
:data:`READERS`.

A reader is one split: its ``classes``, ``len()`` samples numbered from 0, ``read(i) ->
(encoded bytes, label)``, ``name_of(i)`` for messages, and the split's epoch orders
(``loaders.orders``: ``order(epoch) -> indices``). Optional abilities, with their defaults here:
``random_access`` (False for streamed shards: only pipelines that read each worker's records
front to back can take them) and ``plan_pass`` (streamed shards learn each pass's reading plan
before the workers start).
"""
from __future__ import annotations

import importlib
from typing import Sequence

from ..contract import DistInfo, LoaderSettings
from ..orders import Order

__all__ = ["READERS", "Reader", "open_reader"]

# source name (LoaderSettings.source) -> module whose open_reader(path, settings) makes one
READERS = {
    "folder": "loaders.readers.folder",
    "lmdb": "loaders.readers.lmdb_records",
    "shards": "loaders.readers.shards",
}


class Reader:
    """One split of an on-disk source (subclasses implement the first five members).

    Readers are pickled into spawned DataLoader workers and reopen their files lazily in each
    process; ``read`` may be called from several threads at once (DALI's feeds), and raises :class:`DataError` (one line naming the location) for a damaged
    store, ``IndexError`` for an index outside ``0..len-1``."""

    classes: Sequence[str]  # class names, index = label
    random_access: bool = True  # read(i) in any order costs about the same

    def __len__(self) -> int:
        raise NotImplementedError

    def read(self, index: int) -> tuple[bytes, int]:
        """The stored ``(encoded image bytes, label)`` of sample ``index``."""
        raise NotImplementedError

    def name_of(self, index: int) -> str:
        """Where sample ``index`` lives (a path, or a store and record number), for messages."""
        raise NotImplementedError

    def train_order(self, settings: LoaderSettings, dist: DistInfo) -> Order:
        """The training epoch order of this rank (the seed, rank and world size in it)."""
        raise NotImplementedError

    def val_order(self, settings: LoaderSettings, dist: DistInfo) -> Order:
        """The validation epoch order of this rank: every sample once across ranks."""
        raise NotImplementedError

    @property
    def plans_passes(self) -> bool:
        """Whether :meth:`plan_pass` must run before each pass's workers start (which then
        cannot outlive a pass)."""
        return False

    def plan_pass(self, order: Order, epoch: int, remaining: list[int] | None) -> None:
        """Learn the pass about to start: ``order`` read at ``epoch``, ``remaining`` the
        indices still to come of a resumed epoch (None: all of it)."""


def open_reader(source: str, path: str, settings: LoaderSettings) -> Reader:
    """The :class:`Reader` of ``source`` (a key of :data:`READERS`) over the split at ``path``.
    Raises ``KeyError`` for an unknown source, :class:`DataError` for a bad split."""
    return importlib.import_module(READERS[source]).open_reader(path, settings)
