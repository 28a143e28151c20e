"""Writing an LMDB (:mod:`formats.lmdb`) from a listing of image files: checked by several threads,
committed in batches with the resume state by one more, the metadata last."""
from __future__ import annotations

import os
import shutil
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, suppress
from itertools import islice, takewhile

import lmdb
import msgpack
from tqdm import tqdm

from decode.acceptance import MAX_PIXELS
from formats import raw_share
from formats.conversion import (REPORT_NAME, ConversionError, ResumeState, Summary, fingerprint,
                                open_source, stage_folder, staged, stored, write_report)
from formats.images import check_files
from formats.sources import Listing

from ._codec import (CHECKSUMS_KEY, META_KEY, PROGRESS_KEY, RAW_VERSION,
                     LMDBFormatError, Metadata, close_readonly, encode_checksums, encode_meta,
                     encode_record, is_lmdb, last_record_index, read_meta, record_checksum,
                     record_key)

# Commits that may wait for the disk: rides out a stalled fdatasync at ~30 MB a batch.
COMMITS_IN_FLIGHT = 3
_SKIPS, _CRCS = PROGRESS_KEY + b"/skip/", PROGRESS_KEY + b"/crc/"  # per-batch entries
_MiB = 1 << 20
_MIN_FREE = 16 * _MiB  # room for the lock file and the first batches


def convert(dataset: str, output: str, workers: int = 8, overwrite: bool = False,
            map_size: int = 1 << 30, batch_size: int = 256, progress: bool = True,
            strict: bool = False, shuffle_seed: int | None = None,
            check: str = "full", split: str | None = None,
            allow_partial: bool = False, cap=None, raw_budget=None,
            max_pixels: int = MAX_PIXELS) -> Summary:
    """Convert the image folder ``dataset`` (or ``split`` of the download in it; complete unless
    ``allow_partial``) into the LMDB ``output`` and return its :class:`Summary`.

    ``workers`` threads check the files under ``check``; each ``batch_size`` files commit in one
    transaction with the resume state; ``map_size`` (bytes) doubles when full. Non-images go to
    ``skipped.tsv`` (an error with ``strict``). An unfinished conversion of the same files and
    settings resumes; another is refused, naming what differs (``overwrite``: start over).
    ``shuffle_seed``: the records' :meth:`~formats.sources.Listing.shuffled` order (else
    ImageFolder's); ``cap``: a :class:`formats.cap.Cap`; ``raw_budget``: a
    :class:`formats.raw_share.Budget` (version 2); ``max_pixels``: ``--max-image-pixels``.
    Raises :class:`ConversionError` for a bad source or ``check``, a complete or another
    unfinished output without ``overwrite``, or an unwritable or full disk."""
    start = time.perf_counter()
    listing = open_source("folder2lmdb.py", dataset, split, allow_partial, progress, check,
                          shuffle_seed)
    wanted = fingerprint(listing, check, cap, raw_budget, max_pixels, shuffle_seed=shuffle_seed)
    try:
        state = prepare_output(output, overwrite, wanted)
        writer = Writer(output, map_size)
    except (OSError, lmdb.Error) as exc:
        raise ConversionError(f"{output}: cannot create the database "
                              f"({getattr(exc, 'strerror', None) or exc})") from None
    try:
        if state is wanted:
            writer.commit([(PROGRESS_KEY, state.encode())])  # the first transaction
        state.resumed_at = state.done
        with staged(listing, stage_folder(output), progress):
            choice = raw_share.start(raw_budget, listing, check, cap, state.raw, workers)
            post = raw_share.with_candidate(choice) if choice is not None else None
            with closing(check_files(listing.files[state.done:], workers, check,
                                     ahead=2 * batch_size, cap=cap, post=post,
                                     max_pixels=max_pixels)) as results:
                _write_batches(listing, results, state, writer, batch_size, progress, strict,
                               choice)
            _finish(listing, state, writer, output, choice)
    finally:
        writer.close()
    return Summary.of(state, start, output, choice)


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
            with lmdb.open(output, subdir=True, readonly=True, lock=False) as env, \
                    env.begin() as txn:
                value, records = txn.get(PROGRESS_KEY), last_record_index(txn) + 1
            if value is not None or records:
                recorded = ResumeState.decode(value)
                if recorded is not None and recorded.records != records:
                    recorded = None  # committed together: a mismatch means another writer
                wanted.refuse_other(output, recorded)
                return recorded
            print(f"folder2lmdb.py: {output}: no resume state (interrupted before its first "
                  "commit); starting over", file=sys.stderr)
        # the files, not the folder: a reader opening the database meanwhile creates lock.mdb,
        # and removing the folder would fail with "Directory not empty"
        for name in ("data.mdb", "lock.mdb", REPORT_NAME, REPORT_NAME + ".tmp"):
            with suppress(FileNotFoundError):
                os.remove(os.path.join(output, name))
    os.makedirs(output, exist_ok=True)
    return wanted


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


def _write_batches(listing: Listing, results, state: ResumeState, writer: Writer,
                   batch_size: int, progress: bool, strict: bool, choice) -> None:
    """Write ``listing.files[state.done:]`` (``results``: their checks) in batches, updating
    ``state``. One thread commits up to :data:`COMMITS_IN_FLIGHT` batches behind the checks, so
    each commit's ``fdatasync`` (~0.25 s per 256 JPEGs) does not stall them."""
    files = listing.files
    bar = tqdm(total=len(files), initial=state.done, unit="img", dynamic_ncols=True,
               desc=os.path.basename(writer.output.rstrip("/")), disable=not progress or None)
    with ThreadPoolExecutor(max_workers=1) as committer:
        committing = deque()
        while state.done < len(files):
            batch = files[state.done:state.done + batch_size]
            puts = _batch_puts(batch, islice(results, len(batch)), state, strict, choice,
                               len(files))
            state.done += len(batch)
            while len(committing) >= COMMITS_IN_FLIGHT:
                bar.update(committing.popleft().result())
            # Records, skips, checksums and resume state commit together: all of a batch or none.
            committing.append(committer.submit(
                _commit_after, committing[-1] if committing else None, writer,
                puts + [(PROGRESS_KEY, state.encode())], len(batch)))
        while committing:
            bar.update(committing.popleft().result())
    bar.close()


def _finish(listing: Listing, state: ResumeState, writer: Writer, output: str, choice) -> None:
    """The report, then the last transaction: the metadata (none means unfinished: never
    opened) and checksums, the resume state deleted."""
    write_report(output, listing, state.records, (msgpack.unpackb(entry, raw=False)
                                                  for entry in writer.read_prefix(_SKIPS)))
    raw = {} if choice is None else {"version": RAW_VERSION, "raw": choice.state()}
    meta = Metadata(state.records, tuple(listing.classes), shuffle_seed=listing.shuffle_seed,
                    names=tuple(listing.names) if listing.names is not None else None,
                    cap=state.settings["cap"], **raw)
    writer.commit([(META_KEY, encode_meta(meta)),
                   (CHECKSUMS_KEY, b"".join(writer.read_prefix(_CRCS)))],
                  delete_prefix=PROGRESS_KEY)


def _batch_puts(sources: list, results, state: ResumeState, strict: bool, choice,
                files: int) -> list:
    """One batch's ``(key, value)`` pairs (records, skips, checksums) from its checks, advancing
    ``state`` and ``choice``. Raises :class:`ConversionError` for a non-image under ``strict``."""
    puts, crcs, first_record = [], [], state.records
    for done, (src, result) in enumerate(zip(sources, results), state.done + 1):
        data = stored("folder2lmdb.py", src, result, strict, choice, done, files)
        if data is None:  # not an image: the reason
            puts.append((_SKIPS + record_key(state.skipped), msgpack.packb(
                [os.fsencode(src.rel), result], use_bin_type=True)))
            state.skipped += 1
            continue
        value = encode_record(data, src.label)
        puts.append((record_key(state.records), value))
        crcs.append(record_checksum(value))
        state.records += 1
        state.bytes += len(data)
        state.reencoded += result.reencoded is not None
    if crcs:
        puts.append((_CRCS + record_key(first_record), encode_checksums(crcs)))
    if choice is not None:
        state.raw = choice.state()
    return puts


def _commit_after(previous, writer: Writer, puts: list, files: int) -> int:
    """In the committing thread, after ``previous``: ``writer.commit(puts)``, unless the
    transaction before failed (a later one would record unwritten files as done); ``files``."""
    if previous is not None and previous.exception() is not None:
        raise ConversionError("an earlier transaction failed")
    writer.commit(puts)
    return files
