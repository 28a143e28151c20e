"""LMDB backend: reads databases written by ``folder2lmdb.py`` (format in ``_lmdb_codec``).

Named ``lmdb_records`` rather than ``lmdb`` so it can never shadow the ``lmdb`` package.
"""
from __future__ import annotations

import os
import sys

from torch.utils.data import Dataset

from ._common import DataError, DistInfo, check_same_classes, make_loader, split_paths
from ._lmdb_codec import (LMDBFormatError, decode_record, is_open, open_readonly, read_meta,
                          record_key)
from ._order import BlockShuffleSampler
from ._transforms import build_transform


class LMDBDataset(Dataset):
    """Map-style dataset over one LMDB: item ``i`` is ``(transform(jpeg_bytes), label)``
    (the raw bytes without a transform).

    The environment is opened lazily in whichever process reads first and reopened after a
    fork (py-lmdb: an environment must not cross ``fork()``), and it is dropped when pickled,
    so the dataset works under both the fork and the spawn start methods. The length and class
    names come from the metadata record; no per-sample list is held.

    ``readahead`` opens the environment with OS readahead on (see
    :func:`~loaders._lmdb_codec.open_readonly`); leave it off for random order.

    Raises :class:`~loaders._common.DataError` at construction if ``path`` is not a complete
    database, and ``KeyError`` for a missing record.
    """

    def __init__(self, path: str, transform=None, readahead: bool = False):
        self.path = path
        self.transform = transform
        self.readahead = readahead
        try:
            meta = read_meta(path)
        except LMDBFormatError as exc:
            raise DataError(str(exc)) from None
        self.classes = list(meta.classes)
        self.shuffle_seed = meta.shuffle_seed  # None: records sorted by class
        self._len = meta.count
        self._env = None
        self._pid = None

    def __len__(self) -> int:
        return self._len

    def _open(self):
        # is_open: another dataset on the same file may have reopened it with the other
        # readahead setting, which closes this one's handle.
        if self._env is None or self._pid != os.getpid() or not is_open(self._env):
            self._env = open_readonly(self.path, self.readahead)
            self._pid = os.getpid()
        return self._env

    def read(self, index: int) -> tuple[bytes, int]:
        """The stored ``(jpeg_bytes, label)`` of record ``index``."""
        if not 0 <= index < self._len:
            raise IndexError(f"record {index} out of range 0..{self._len - 1}")
        with self._open().begin() as txn:
            value = txn.get(record_key(index))
        if value is None:
            raise KeyError(f"{self.path}: record {index} missing")
        return decode_record(value)

    def name_of(self, index: int) -> str:
        """Where record ``index`` lives, for messages."""
        return f"{self.path} record {index}"

    def __getitem__(self, index: int):
        jpeg_bytes, label = self.read(index)
        return (self.transform(jpeg_bytes) if self.transform else jpeg_bytes), label

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_env"] = None
        state["_pid"] = None
        return state


def readahead_for(path: str, choice) -> bool:
    """Whether to open ``path`` with OS readahead: ``"on"``/``True``, ``"off"``/``False``, or
    ``"auto"``: on when the database is at most half of the memory available now.

    Measured (README, *Loader throughput* and *Large datasets*): on a database the page cache
    can hold, readahead makes random reads faster (fewer page faults: ~20% more images/s on the
    sample); on one larger than memory it makes them several times slower (each fault reads
    megabytes that are evicted before use), so ``auto`` stays off when in doubt.
    """
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


def warn_if_class_sorted(dataset: LMDBDataset, path: str, sampler: BlockShuffleSampler) -> None:
    """One stderr line when block order reads a database whose records are sorted by class:
    its open blocks then hold only a few classes, and so does every batch."""
    if dataset.shuffle_seed is not None:
        return
    # Each open block spans 1 + block_size / (records per class) classes, on average.
    per_block = 1 + sampler.block_size * len(dataset.classes) / max(1, len(dataset))
    classes = sampler.buffer_blocks * per_block
    if classes >= len(dataset.classes):
        return
    print(f"warning: --lmdb-order block: {path} stores its records sorted by class, so a batch "
          f"draws on about {classes:.0f} of {len(dataset.classes)} classes; rewrite it with "
          "folder2lmdb.py --shuffle-seed 0", file=sys.stderr)


def build_loaders(args, dist: DistInfo):
    """``(train, val)`` :class:`~loaders._common.DeviceLoader` s over the two LMDBs.

    ``args.lmdb_order == "block"`` reads training records in block-shuffled order
    (:class:`~loaders._order.BlockShuffleSampler`, ``args.lmdb_block_size`` records per block,
    ``args.lmdb_buffer_blocks`` open blocks); validation is always read in index order.
    ``args.lmdb_readahead`` (``on``/``off``/``auto``, see :func:`readahead_for`) sets OS
    readahead. Namespaces without these attributes get random order, 256, 8, readahead off.
    """
    train_path, val_path = split_paths(args)
    choice = getattr(args, "lmdb_readahead", "off")
    train_set = LMDBDataset(train_path, build_transform(args, train=True),
                            readahead=readahead_for(train_path, choice))
    val_set = LMDBDataset(val_path, build_transform(args, train=False),
                          readahead=readahead_for(val_path, choice))
    check_same_classes(train_set.classes, val_set.classes)
    sampler = None
    if getattr(args, "lmdb_order", "random") == "block":
        try:
            sampler = BlockShuffleSampler(
                len(train_set), block_size=getattr(args, "lmdb_block_size", 256),
                buffer_blocks=getattr(args, "lmdb_buffer_blocks", 8), rank=dist.rank,
                world_size=dist.world_size, seed=args.seed)
        except ValueError as exc:
            raise DataError(f"--lmdb-order block: {exc}") from None
        if dist.rank == 0:
            warn_if_class_sorted(train_set, train_path, sampler)
    return (make_loader(train_set, args, dist, train=True, classes=train_set.classes,
                        sampler=sampler),
            make_loader(val_set, args, dist, train=False, classes=val_set.classes))
