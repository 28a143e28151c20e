"""The writing side of ``folder2lmdb.py``: the output directory, the resume state of an unfinished
conversion and the transactions."""
from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field

import lmdb
import msgpack

from formats.conversion import REPORT_NAME, ConversionError, refuse_other_cap

from ._codec import (PROGRESS_KEY, LMDBFormatError, close_readonly, is_lmdb, last_record_index,
                     read_meta)

_MiB = 1 << 20
_MIN_FREE = 16 * _MiB  # room for the lock file and the first batches


@dataclass
class ResumeState:
    """What an interrupted conversion committed, under ``PROGRESS_KEY`` in every batch's
    transaction: the ``fingerprint`` a resume needs, ``done`` source files, ``records`` (``bytes``,
    ``reencoded``), ``skipped``, ``cap`` and ``raw`` (if any); ``resumed_at``: ``done`` when this
    run started (not stored)."""

    fingerprint: bytes
    done: int = 0
    records: int = 0
    bytes: int = 0
    reencoded: int = 0
    skipped: int = 0
    cap: dict = field(default_factory=dict)
    raw: dict = field(default_factory=dict)  # the raw share's RawChoice.state(), if any
    resumed_at: int = field(default=0, compare=False)

    def encode(self) -> bytes:
        values = [self.fingerprint, self.done, self.records, self.bytes, self.reencoded,
                  self.skipped, self.cap]
        return msgpack.packb(values + [self.raw] if self.raw else values, use_bin_type=True)

    @classmethod
    def decode(cls, value: bytes) -> "ResumeState":
        return cls(*msgpack.unpackb(value, raw=False))



def prepare_output(output: str, overwrite: bool, fp: bytes,
                   cap: dict | None = None) -> ResumeState | None:
    """Make ``output`` ready; the resume state of an unfinished conversion of the same source, or
    None to start afresh. Replaces other unfinished ones (another ``cap``, or a complete one, only
    with ``overwrite``). Raises :class:`ConversionError`."""
    if os.path.exists(output) and (not os.path.isdir(output)
                                   or (os.listdir(output) and not is_lmdb(output))):
        raise ConversionError(f"{output}: exists and is not an LMDB directory; choose another -o")
    if is_lmdb(output):
        try:
            meta = read_meta(output)
        except LMDBFormatError:
            meta = None  # an unfinished conversion: resume it or start again
        if meta is not None and not overwrite:
            raise ConversionError(
                f"{output}: already holds a complete database of {meta.count} images "
                "(pass --overwrite to replace it)")
        close_readonly(output)
        if meta is None:
            state = _read_resume_state(output)
            if state is not None and state.fingerprint == fp:
                return state
            if state is not None and not overwrite:
                refuse_other_cap(output, state.cap, cap or {})
            why = ("the files or settings changed since this conversion was interrupted"
                   if state is not None else "no resume state (interrupted before its first "
                   "commit)")
            print(f"folder2lmdb.py: {output}: {why}; starting over", file=sys.stderr)
        _remove_database(output)
    os.makedirs(output, exist_ok=True)
    return None


def _remove_database(output: str) -> None:
    """Delete the LMDB's files in ``output``, keeping the folder: another process opening the
    database meanwhile (a reader creates ``lock.mdb``) made removing the folder itself fail with
    "Directory not empty". Raises ``OSError``."""
    for name in ("data.mdb", "lock.mdb", REPORT_NAME, REPORT_NAME + ".tmp"):
        try:
            os.remove(os.path.join(output, name))
        except FileNotFoundError:
            pass


def _read_resume_state(output: str) -> ResumeState | None:
    """The resume state of ``output`` if it matches the records, else None."""
    try:
        env = lmdb.open(output, subdir=True, readonly=True, lock=False)
    except lmdb.Error:
        return None
    try:
        with env.begin() as txn:
            value = txn.get(PROGRESS_KEY)
            state = ResumeState.decode(value) if value else None
            # committed together: a mismatch means another writer
            if state is not None and last_record_index(txn) + 1 != state.records:
                return None
            return state
    except Exception:  # noqa: BLE001 - unreadable state of any kind: start over
        return None
    finally:
        env.close()


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
            except lmdb.MapFullError:
                # the aborted transaction left no trace
                self._grow()
            except (lmdb.Error, OSError) as exc:
                raise ConversionError(f"{self.output}: cannot write the database ({exc}); "
                                      "is the disk full?") from None

    def _grow(self) -> None:
        size = self.env.info()["map_size"] * 2
        try:
            self.env.set_mapsize(size)
        except (lmdb.Error, OSError, OverflowError) as exc:
            raise ConversionError(f"{self.output}: cannot grow the LMDB map to "
                                  f"{size / _MiB:.0f} MiB ({exc})") from None

    def read_prefix(self, prefix: bytes) -> list[bytes]:
        """Values of the keys starting with ``prefix``, in key order."""
        with self.env.begin() as txn:
            cursor = txn.cursor()
            if not cursor.set_range(prefix):
                return []
            values = []
            for key, value in cursor:
                if not key.startswith(prefix):
                    break
                values.append(value)
            return values

    def close(self) -> None:
        self.env.sync(True)
        self.env.close()

