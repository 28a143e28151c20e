"""The writing side of ``folder2lmdb.py``: the output directory, the resume state of an unfinished
conversion and the transactions."""
from __future__ import annotations

import os
import shutil
import sys
from itertools import takewhile

import lmdb

from formats.conversion import REPORT_NAME, ConversionError, ResumeState

from ._codec import (PROGRESS_KEY, LMDBFormatError, close_readonly, is_lmdb, last_record_index,
                     read_meta)

_MiB = 1 << 20
_MIN_FREE = 16 * _MiB  # room for the lock file and the first batches


def prepare_output(output: str, overwrite: bool, wanted: ResumeState) -> ResumeState:
    """Make ``output`` ready; the recorded state of an unfinished conversion of the same source
    and settings (``wanted``'s), or ``wanted`` to start afresh. Raises :class:`ConversionError` for
    another unfinished conversion or a complete one (unless ``overwrite``: start over), or a
    folder of other files; ``lmdb.Error``, ``OSError``."""
    if os.path.exists(output) and (not os.path.isdir(output)
                                   or (os.listdir(output) and not is_lmdb(output))):
        raise ConversionError(f"{output}: exists and is not an LMDB directory; choose another -o")
    if is_lmdb(output):
        try:
            meta = read_meta(output)
        except LMDBFormatError:
            meta = None  # an unfinished conversion: resume it or refuse
        if meta is not None and not overwrite:
            raise ConversionError(
                f"{output}: already holds a complete database of {meta.count} images "
                "(pass --overwrite to replace it)")
        close_readonly(output)
        if meta is None and not overwrite:
            env = lmdb.open(output, subdir=True, readonly=True, lock=False)
            try:
                with env.begin() as txn:
                    value, records = txn.get(PROGRESS_KEY), last_record_index(txn) + 1
            finally:
                env.close()
            if value is not None or records:
                recorded = ResumeState.decode(value)
                if recorded is not None and recorded.records != records:
                    recorded = None  # committed together: a mismatch means another writer
                wanted.refuse_other(output, recorded)
                return recorded
            print(f"folder2lmdb.py: {output}: no resume state (interrupted before its first "
                  "commit); starting over", file=sys.stderr)
        _remove_database(output)
    os.makedirs(output, exist_ok=True)
    return wanted


def _remove_database(output: str) -> None:
    """Delete the LMDB's files in ``output``, keeping the folder: another process opening the
    database meanwhile (a reader creates ``lock.mdb``) made removing the folder itself fail with
    "Directory not empty". Raises ``OSError``."""
    for name in ("data.mdb", "lock.mdb", REPORT_NAME, REPORT_NAME + ".tmp"):
        try:
            os.remove(os.path.join(output, name))
        except FileNotFoundError:
            pass


class Writer:
    """Writes batches of records in one transaction each, doubling ``map_size`` (bytes) when full.
    Raises :class:`ConversionError` if the disk has under ``_MIN_FREE`` bytes free."""

    def __init__(self, output: str, map_size: int):
        self.output = output
        # LMDB maps its lock file: a full disk is a silent SIGBUS there, not an ENOSPC
        free = shutil.disk_usage(output).free
        if free < _MIN_FREE:
            raise ConversionError(f"{output}: only {free / _MiB:.1f} MiB free on its disk")
        self.env = lmdb.open(output, map_size=map_size, subdir=True, meminit=False,
                             map_async=True)

    def commit(self, puts, delete_prefix: bytes | None = None) -> None:
        """Put ``(key, value)`` pairs, and delete the keys starting with ``delete_prefix``, in one
        transaction. Raises :class:`ConversionError` if the disk or the map cannot take it."""
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    if delete_prefix is not None:
                        cursor = txn.cursor()
                        cursor.set_range(delete_prefix)
                        while cursor.key().startswith(delete_prefix) and cursor.delete():
                            pass
                    for key, value in puts:
                        txn.put(key, value)
                return
            except lmdb.MapFullError:  # the aborted transaction left no trace: grow the map
                size = self.env.info()["map_size"] * 2
                try:
                    self.env.set_mapsize(size)
                except (lmdb.Error, OSError, OverflowError) as exc:
                    raise ConversionError(f"{self.output}: cannot grow the LMDB map to "
                                          f"{size / _MiB:.0f} MiB ({exc})") from None
            except (lmdb.Error, OSError) as exc:
                raise ConversionError(f"{self.output}: cannot write the database ({exc}); "
                                      "is the disk full?") from None

    def read_prefix(self, prefix: bytes) -> list[bytes]:
        """Values of the keys starting with ``prefix``, in key order."""
        with self.env.begin() as txn:
            cursor = txn.cursor()
            cursor.set_range(prefix)  # unpositioned if none: from the first key, a record
            return [v for _, v in takewhile(lambda item: item[0].startswith(prefix), cursor)]

    def close(self) -> None:
        self.env.sync(True)
        self.env.close()

