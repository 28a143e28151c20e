#!/usr/bin/env python
"""Convert an ImageNet-layout image folder (``root/<wnid>/<image>.JPEG``) to one LMDB.

    python folder2lmdb.py --dataset /imagenet/train -o /lmdb/train [--strict] [--shuffle-seed 0]
                          [--check {full,header}]
    python folder2lmdb.py --verify /lmdb/train [--dataset /imagenet/train]

(the interface of PyTorch-LMDB's converter). Each image is stored with its ImageFolder label:
baseline JPEGs byte for byte, other images re-encoded to JPEG, non-images skipped and listed in
``OUTPUT/skipped.tsv`` (rules in ``loaders/_image_check.py``; record format in
``loaders/_lmdb_codec.py``, shared with the reader). The LMDB map grows as needed, files are
checked by several threads, and the metadata record is written last, so an interrupted
conversion is never read as complete; running the same command again resumes it. Every
baseline JPEG is decoded completely once (``--check full``, the default) or, with
``--check header``, only when its markers do not end in EOI (faster, misses damage inside the
compressed data; ``_image_check`` describes both). Records
follow ImageFolder's order (sorted by class) unless ``--shuffle-seed`` fixes a pseudo-random
one, which block order (``main.py --lmdb-order block``) needs to mix classes within a batch.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
import warnings
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from itertools import islice

import lmdb
import msgpack

from loaders._image_check import (CHECKS, REENCODE_QUALITY, RULES_VERSION, DatasetError,
                                  Listing, check_files, list_sources)
from loaders._lmdb_codec import (CHECKSUMS_KEY, META_KEY, PROGRESS_KEY, PROGRESS_PREFIX,
                                 Metadata, encode_checksums, encode_meta, encode_record,
                                 record_checksum, record_key)
from loaders._lmdb_verify import verify
from loaders._lmdb_writer import ConversionError, ResumeState, _prepare_output, _Writer
from loaders._malloc import retain_freed_memory

# PyTorch-LMDB's import path: `from folder2lmdb import ImageFolderLMDB` in users' scripts.
from loaders.imagefolder_lmdb import ImageFolderLMDB  # noqa: F401

_MiB = 1 << 20
REPORT_NAME = "skipped.tsv"  # inside the LMDB directory, beside data.mdb
# Batches whose transactions may wait for the disk while the next ones are checked: rides out
# an fdatasync that stalls for a while (a disk shared with other writers) at ~30 MB a batch.
COMMITS_IN_FLIGHT = 3


def fingerprint(listing: Listing, check: str = "full") -> bytes:
    """SHA-256 of what decides a conversion's records: classes, each file's relative path,
    label, size and mtime (ns), and the image rules, ``check`` and library (``_image_check``).
    About 5 us per file (one ``os.stat``), 6 s for ImageNet's 1.28 M files."""
    from loaders._decoders import decoder_name
    from loaders._transforms import image_library

    digest = hashlib.sha256(msgpack.packb(
        [RULES_VERSION, REENCODE_QUALITY, image_library(), decoder_name(),
         listing.classes, check], use_bin_type=True))
    for src in listing.files:
        try:
            st = os.stat(src.path)
            size, mtime = st.st_size, st.st_mtime_ns
        except OSError:
            size, mtime = -1, -1
        digest.update(msgpack.packb([os.fsencode(src.rel), src.label, size, mtime]))
    return digest.digest()


def _skip_key(n: int) -> bytes:
    return PROGRESS_PREFIX + b"/skip/" + record_key(n)


def _crc_key(first_record: int) -> bytes:
    return PROGRESS_PREFIX + b"/crc/" + record_key(first_record)


@dataclass
class Summary:
    """What a conversion wrote: ``images`` records of ``bytes`` image bytes in ``seconds``,
    ``reencoded`` of them re-encoded, ``skipped`` files not images (listed in ``report``)."""

    images: int
    bytes: int
    seconds: float
    output: str
    reencoded: int = 0
    skipped: int = 0
    report: str = ""
    resumed_at: int = 0

    @property
    def images_per_sec(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else float("inf")

    def line(self) -> str:
        resumed = f", resumed after {self.resumed_at} files" if self.resumed_at else ""
        return (f"wrote {self.images} images ({self.bytes / _MiB:.1f} MiB) to {self.output} "
                f"in {self.seconds:.1f} s ({self.images_per_sec:.0f} images/s{resumed}); "
                f"re-encoded {self.reencoded}, skipped {self.skipped} (listed in {self.report})")


def convert(dataset: str, output: str, workers: int = 8, overwrite: bool = False,
            map_size: int = 1 << 30, batch_size: int = 256, progress: bool = True,
            strict: bool = False, shuffle_seed: int | None = None,
            check: str = "full") -> Summary:
    """Convert the image folder ``dataset`` into the LMDB directory ``output``.

    ``workers`` threads read and check the files (``_image_check.check_image`` under
    ``check``, ``"full"`` or ``"header"``: see ``_image_check``'s docstring); every
    ``batch_size`` source files are committed in one transaction together with the resume
    state; ``map_size`` (bytes) is only the initial map size, doubled whenever it is full.
    Files that are not images are skipped and listed in ``output/skipped.tsv`` (tab-separated
    relative path and reason); with ``strict`` the first one is an error instead. An unfinished
    conversion of the same files and settings at ``output`` is resumed where it stopped,
    anything else unfinished replaced. Records are written in ImageFolder's order, or with
    ``shuffle_seed`` in the order of :meth:`~loaders._image_check.Listing.shuffled` (stored in
    the metadata, so ``--verify`` recomputes it). Raises :class:`ConversionError` for a bad
    source or ``check``, an existing complete output (unless ``overwrite``), an unwritable
    output or a full disk.
    """
    start = time.perf_counter()
    if check not in CHECKS:
        raise ConversionError(f"check must be one of {', '.join(CHECKS)}, not {check!r}")
    try:
        listing = list_sources(dataset)
    except DatasetError as exc:
        raise ConversionError(str(exc)) from None
    if shuffle_seed is not None:
        listing = listing.shuffled(shuffle_seed)  # the fingerprint below covers the order
    for name in listing.empty_classes:
        print(f"folder2lmdb.py: warning: class folder {name!r} is empty; its label is kept",
              file=sys.stderr)
    fp = fingerprint(listing, check)
    try:
        state = _prepare_output(output, overwrite, fp)
        writer = _Writer(output, map_size)
    except OSError as exc:
        raise ConversionError(f"{output}: cannot create the database ({exc.strerror or exc})") \
            from None
    except lmdb.Error as exc:
        raise ConversionError(f"{output}: cannot create the database ({exc})") from None
    try:
        if state is None:
            state = ResumeState(fp)
            writer.commit([(PROGRESS_KEY, state.encode())])  # the first transaction
        else:
            state.resumed_at = state.done
        _convert_files(listing, state, writer, output, workers, batch_size, progress, strict,
                       check)
    finally:
        writer.close()
    return Summary(state.records, state.bytes, time.perf_counter() - start, output,
                   state.reencoded, state.skipped, os.path.join(output, REPORT_NAME),
                   state.resumed_at)


def _convert_files(listing: Listing, state: ResumeState, writer: "_Writer", output: str,
                   workers: int, batch_size: int, progress: bool, strict: bool,
                   check: str = "full") -> None:
    """Write the records of ``listing.files[state.done:]``, then the report and the last
    transaction; ``state`` is updated in place.

    Three stages overlap: ``workers`` threads check files up to two batches ahead
    (:func:`~loaders._image_check.check_files`) while this thread collects the current batch
    and one more thread commits the previous ones, in order, up to :data:`COMMITS_IN_FLIGHT`
    behind. Each commit ends in an ``fdatasync`` of the batch (about 0.25 s for 256 ImageNet
    JPEGs on this machine's disk); made in this thread, it stalled the checking threads and
    took 2/3 of the wall time."""
    from tqdm import tqdm

    files = listing.files
    bar = tqdm(total=len(files), initial=state.done, unit="img", dynamic_ncols=True,
               desc=os.path.basename(output.rstrip("/")), disable=not progress or None)
    paths = [src.path for src in files[state.done:]]
    with closing(check_files(paths, workers, check, ahead=2 * batch_size)) as results, \
            ThreadPoolExecutor(max_workers=1) as committer:
        committing = deque()
        while state.done < len(files):
            batch = files[state.done:state.done + batch_size]
            puts = _batch_puts(batch, islice(results, len(batch)), state, strict)
            state.done += len(batch)
            while len(committing) >= COMMITS_IN_FLIGHT:
                _committed(committing.popleft(), bar)
            # Records, skips, checksums and resume state commit together: all of a batch or none.
            committing.append(committer.submit(
                _commit_after, committing[-1] if committing else None, writer,
                puts + [(PROGRESS_KEY, state.encode())]))
            committing[-1].files = len(batch)
        while committing:
            _committed(committing.popleft(), bar)
    bar.close()
    if state.records == 0:
        raise ConversionError(f"{listing.root}: none of its {len(files)} files is an image")
    _write_report(os.path.join(output, REPORT_NAME),
                  writer.read_prefix(PROGRESS_PREFIX + b"/skip/"))
    checksums = b"".join(writer.read_prefix(PROGRESS_PREFIX + b"/crc/"))
    # Last transaction: metadata (none means unfinished: never opened), checksums, no resume state.
    meta = Metadata(state.records, tuple(listing.classes), shuffle_seed=listing.shuffle_seed)
    writer.commit([(META_KEY, encode_meta(meta)),
                   (CHECKSUMS_KEY, checksums)], delete_prefix=PROGRESS_PREFIX)


def _batch_puts(sources: list, results: Iterable, state: ResumeState, strict: bool) -> list:
    """The ``(key, value)`` pairs of one batch: its records, skip entries and checksums, in
    source order, from each source's ``check_file`` result; ``state``'s counters (not ``done``)
    are advanced. Raises :class:`ConversionError` for the first non-image with ``strict``."""
    puts, crcs, first_record = [], [], state.records
    for src, result in zip(sources, results):
        if isinstance(result, str):  # not an image: the reason
            if strict:
                raise ConversionError(f"{src.path}: {result} (--strict)")
            puts.append((_skip_key(state.skipped), msgpack.packb(
                [os.fsencode(src.rel), result], use_bin_type=True)))
            state.skipped += 1
            continue
        value = encode_record(result.data, src.label)
        puts.append((record_key(state.records), value))
        crcs.append(record_checksum(value))
        state.records += 1
        state.bytes += len(result.data)
        state.reencoded += result.reencoded is not None
    if crcs:
        puts.append((_crc_key(first_record), encode_checksums(crcs)))
    return puts


def _commit_after(previous: Future | None, writer: "_Writer", puts: list) -> None:
    """``writer.commit(puts)`` unless the transaction before failed (then a later one would
    record files as done whose records were never written). Runs in the committing thread,
    after ``previous``."""
    if previous is not None and previous.exception() is not None:
        raise ConversionError("an earlier transaction failed")
    writer.commit(puts)


def _committed(commit: Future, bar) -> None:
    """Wait for a batch's transaction (re-raising its error) and count its files as done."""
    commit.result()
    bar.update(commit.files)


def _tsv_field(text: str) -> str:
    # Tabs and newlines in a file name would break the line format: escape them (and "\").
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def _write_report(report: str, entries: list[bytes]) -> None:
    """``path<TAB>reason`` per skipped file (dataset-relative path), written atomically."""
    lines = ["path\treason\n"]
    for entry in entries:
        rel, reason = msgpack.unpackb(entry, raw=False)
        lines.append(f"{_tsv_field(os.fsdecode(rel))}\t{_tsv_field(reason)}\n")
    try:
        with open(report + ".tmp", "w", encoding="utf-8", errors="surrogateescape") as f:
            f.writelines(lines)
        os.replace(report + ".tmp", report)
    except OSError as exc:
        raise ConversionError(f"{report}: cannot write the report ({exc.strerror})") from None


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Convert an image folder to an LMDB for main.py --lmdb, or check one.")
    parser.add_argument("-d", "--dataset",
                        help="folder of class subfolders, e.g. /imagenet/train (with --verify: "
                             "also compare every record with it)")
    parser.add_argument("-o", "--output", help="LMDB directory to create (or resume)")
    parser.add_argument("--verify", metavar="DB", help="check the database DB instead")
    parser.add_argument("--strict", action="store_true",
                        help="fail on the first file that is not an image instead of skipping it")
    parser.add_argument("--check", choices=CHECKS, default="full",
                        help="full (default): decode every image completely, so damaged ones are "
                             "skipped; header: decode a baseline JPEG only if it does not end in "
                             "EOI (faster; misses damage inside the compressed data)")
    parser.add_argument("-j", "--workers", type=int, default=8,
                        help="threads reading and checking image files (default: 8)")
    parser.add_argument("--batch-size", type=int, default=256,
                        help="source files per LMDB transaction (default: 256)")
    parser.add_argument("--map-size", type=int, default=1 << 30,
                        help="initial LMDB map_size in bytes; doubles when full (default: 1 GiB)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing complete database at --output")
    parser.add_argument("--shuffle-seed", type=int, metavar="N",
                        help="write the records in a pseudo-random order fixed by N instead of "
                             "sorted by class (for training with --lmdb-order block)")
    return parser


def run_cli(prog: str, parser: argparse.ArgumentParser, argv, verified: str, verify_run,
            convert_run, errors: tuple) -> int:
    """The command line of a converter (this one and ``folder2shards.py``): parse ``argv``,
    then ``verify_run(args)`` (a result with ``line()``, ``problems`` and ``total``) with
    ``--verify``, else ``convert_run(args)`` (a summary with ``line()``). Returns the exit
    status: 0 success, 1 for an error in ``errors`` (one ``PROG: error:`` line) or, with
    ``--verify``, 1 if a problem was found (one line each, on stderr). ``verified`` names what
    ``--verify`` checks, for the message refusing ``-o`` beside it."""
    args = parser.parse_args(argv)
    # As main.py: decode buffers and records come from a heap that keeps freed memory, rather
    # than fresh mmap()s faulted in page by page (halves the converter's system CPU time).
    retain_freed_memory()
    # PIL warns once per file it cannot identify; such files are either decoded by
    # loaders._decoders or listed in the report, so the warning is noise on the console.
    warnings.filterwarnings("ignore", message="image file could not be identified")
    if args.verify and args.output:
        parser.error(f"--verify checks {verified}: give no -o/--output")
    if not args.verify and not (args.dataset and args.output):
        parser.error("the following arguments are required: -d/--dataset, -o/--output")
    try:
        if args.verify:
            result = verify_run(args)
            print(result.line())
            for text in result.problems:
                print(f"{prog}: {text}", file=sys.stderr)
            return 1 if result.total else 0
        summary = convert_run(args)
    except errors as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    print(summary.line())
    return 0


def main(argv=None) -> int:
    """CLI entry point; returns the exit status (see :func:`run_cli`)."""
    return run_cli(
        "folder2lmdb.py", get_args_parser(), argv, "an existing database",
        lambda args: verify(args.verify, args.dataset, workers=args.workers),
        lambda args: convert(args.dataset, args.output, workers=args.workers,
                             overwrite=args.overwrite, map_size=args.map_size,
                             batch_size=max(1, args.batch_size), strict=args.strict,
                             shuffle_seed=args.shuffle_seed, check=args.check),
        (ConversionError, DatasetError, OSError, lmdb.Error))


if __name__ == "__main__":
    sys.exit(main())
