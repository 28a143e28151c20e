"""LMDB databases written by ``folder2lmdb.py`` (not ``lmdb.py``: it would shadow py-lmdb)."""
from __future__ import annotations

import os
import sys

from formats.lmdb import (LMDBFormatError, decode_record, is_open, open_readonly, read_meta,
                          record_key)

from ..errors import DataError
from ..orders import BlockOrder, Order
from ..settings import DistInfo, LoaderSettings
from . import Reader


class LMDBReader(Reader):
    """One LMDB, sample ``i`` its record ``i``, opened lazily in each process. Raises DataError if
    ``path`` is not a complete database, ``KeyError`` for a missing record."""

    def __init__(self, path: str, readahead: bool = False):
        self.path = path
        self.readahead = readahead
        try:
            meta = read_meta(path)
        except LMDBFormatError as exc:
            raise DataError(str(exc)) from None
        self.classes = list(meta.classes)
        self.shuffle_seed = meta.shuffle_seed  # None: records sorted by class
        self._len = meta.count
        self._env = self._pid = None  # opened by env() in each process

    def __len__(self) -> int:
        return self._len

    def env(self):
        """This process's environment, reopened after a fork or with other readahead."""
        if self._env is None or self._pid != os.getpid() or not is_open(self._env):
            self._env = open_readonly(self.path, self.readahead)
            self._pid = os.getpid()
        return self._env

    def read(self, index: int) -> tuple[bytes, int]:
        if not 0 <= index < self._len:
            raise IndexError(f"record {index} out of range 0..{self._len - 1}")
        with self.env().begin() as txn:
            value = txn.get(record_key(index))
        if value is None:
            raise KeyError(f"{self.path}: record {index} missing")
        return decode_record(value)

    def name_of(self, index: int) -> str:
        return f"{self.path} record {index}"

    def train_order(self, settings: LoaderSettings, dist: DistInfo) -> Order:
        """``--lmdb-order``'s: ``block`` or ``random``. Raises :class:`DataError` for another
        order, block sizes below 1, or block order with ``--ra-sampler``."""
        if settings.lmdb_order == "random":
            return super().train_order(settings, dist)
        if settings.lmdb_order != "block":
            raise DataError(f"--lmdb-order {settings.lmdb_order}: must be random or block")
        if settings.ra_sampler and dist.distributed:
            raise DataError("--ra-sampler is a random order: leave out --lmdb-order block")
        try:
            order = BlockOrder(len(self), block_size=settings.lmdb_block_size,
                               buffer_blocks=settings.lmdb_buffer_blocks, rank=dist.rank,
                               world_size=dist.world_size, seed=settings.seed)
        except ValueError as exc:
            raise DataError(f"--lmdb-order block: {exc}") from None
        if dist.rank == 0:
            warn_if_class_sorted(self, order)
        return order

    def __getstate__(self):
        return {**self.__dict__, "_env": None, "_pid": None}


def readahead_for(path: str, choice) -> bool:
    """OS readahead: ``"on"``/``True``, ``"off"``/``False``, or ``"auto"``: on for a database at
    most half the memory available (~20% faster cached, slower beyond memory)."""
    if choice in (True, "on"):
        return True
    if choice != "auto":
        return False
    data = os.path.join(path, "data.mdb") if os.path.isdir(path) else path
    try:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) * 1024 for line in f
                             if line.startswith("MemAvailable:"))
        return os.path.getsize(data) <= available // 2
    except (OSError, StopIteration, ValueError):
        return False


def warn_if_class_sorted(dataset: LMDBReader, order: BlockOrder) -> None:
    """One stderr line when block order reads records sorted by class (few classes a batch)."""
    if dataset.shuffle_seed is not None:
        return
    # Each open block spans 1 + block_size / (records per class) classes, on average.
    per_block = 1 + order.block_size * len(dataset.classes) / max(1, len(dataset))
    classes = order.buffer_blocks * per_block
    if classes >= len(dataset.classes):
        return
    print(f"warning: --lmdb-order block: {dataset.path} stores its records sorted by class, so a "
          f"batch draws on about {classes:.0f} of {len(dataset.classes)} classes; rewrite it with "
          "folder2lmdb.py --shuffle-seed 0", file=sys.stderr)


def open_reader(path: str, settings: LoaderSettings) -> LMDBReader:
    return LMDBReader(path, readahead=readahead_for(path, settings.lmdb_readahead))
