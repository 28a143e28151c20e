"""What both converters share: their error, summary, verification result, resume fingerprint and
``OUTPUT/skipped.tsv``."""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field

import msgpack

from decode.acceptance import MAX_PIXELS
from formats.images import REENCODE_QUALITY, RULES_VERSION
from formats.sources import Listing
from formats.sources import DatasetError, open_dataset

REPORT_NAME = "skipped.tsv"  # inside the output (beside data.mdb, or beside the shards)
_MiB = 1 << 20


class ConversionError(Exception):
    """The conversion cannot start or continue (bad source, output, disk, --strict): one line."""


@dataclass
class Summary:
    """A conversion's ``images`` (records), ``bytes`` and ``seconds``, of them ``reencoded``,
    ``skipped`` (listed in ``report``), ``resumed_at`` (files done before)."""

    images: int
    bytes: int
    seconds: float
    output: str
    reencoded: int = 0
    skipped: int = 0
    report: str = ""
    resumed_at: int = 0
    raw: str = ""  # what a raw-pixel share bought (formats.raw_share.RawChoice.line)

    @property
    def images_per_sec(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else float("inf")

    def line(self) -> str:
        resumed = f", resumed after {self.resumed_at} files" if self.resumed_at else ""
        return (f"wrote {self.images} images ({self.bytes / _MiB:.1f} MiB) to {self.output} "
                f"in {self.seconds:.1f} s ({self.images_per_sec:.0f} images/s{resumed}); "
                f"re-encoded {self.reencoded}, skipped {self.skipped} (listed in {self.report})"
                + (f"; {self.raw}" if self.raw else ""))


@dataclass
class Verification:
    """``problems`` (the first ``max_problems``) of ``total`` over ``count`` records of
    ``classes``; ``checksums``: checked; ``dataset``: compared against, or None."""

    path: str
    count: int = 0
    classes: int = 0
    checksums: bool = False
    dataset: str | None = None
    problems: list[str] = field(default_factory=list)
    total: int = 0
    max_problems: int = 20

    def problem(self, text: str) -> None:
        self.total += 1
        if len(self.problems) < self.max_problems:
            self.problems.append(text)

    def what(self) -> str:
        """What was checked, for :meth:`line`."""
        return (f"{self.count} records, {self.classes} classes, "
                + ("checksums" if self.checksums else "no checksum record (corruption that "
                   "still decodes goes unnoticed)")
                + (f", source {self.dataset}" if self.dataset else ""))

    def line(self) -> str:
        if not self.total:
            return f"verified {self.path}: OK ({self.what()})"
        shown = f"; first {len(self.problems)} below" if self.total > len(self.problems) else ""
        return f"verified {self.path}: {self.total} problems ({self.what()}{shown})"


def refuse_other_cap(output: str, recorded: dict, wanted: dict) -> None:
    """Raise :class:`ConversionError` if the unfinished conversion at ``output`` has another cap
    than ``wanted``: a resume would mix two sizes."""
    if recorded == wanted:
        return
    from formats.cap import Cap

    raise ConversionError(
        f"{output}: an unfinished conversion with {Cap.from_record(recorded).describe()}, not "
        f"{Cap.from_record(wanted).describe()}; run it with those or pass --overwrite")


def fingerprint(listing: Listing, check: str = "full", cap=None, raw_budget=None,
                max_pixels: int = MAX_PIXELS) -> bytes:
    """SHA-256 of what decides a conversion's records: the rules and libraries, ``check``, the
    classes, each file's relative path, label, size and mtime (in an archive: the archive's, and
    the member's offset and size or row), and ``cap``, ``raw_budget`` and ``max_pixels`` where not
    the default. ~5 us per file. A resume needs the same."""
    from decode import decoder_name, image_library

    # the decoder in use, not why others were passed over: that text (an exception's) may change
    # from one run to the next while the records do not
    decoder = decoder_name().split(" (", 1)[0]
    settings = [RULES_VERSION, REENCODE_QUALITY, image_library(), decoder, listing.classes, check]
    if cap is not None and cap.record():
        settings.append(cap.record())
    if raw_budget is not None:
        settings.append({"raw_budget": raw_budget.text})
    if max_pixels != MAX_PIXELS:
        settings.append({"max_image_pixels": max_pixels})
    digest = hashlib.sha256(msgpack.packb(settings, use_bin_type=True))
    for src in listing.files:
        try:
            st = os.stat(src.path)
            size, mtime = st.st_size, st.st_mtime_ns
        except OSError:
            size, mtime = -1, -1
        entry = [os.fsencode(src.rel), src.label, size, mtime]
        digest.update(msgpack.packb(entry if src.offset < 0 else entry + [src.offset, src.size]))
    return digest.digest()


def open_source(prog: str, dataset: str, split: str | None, allow_partial: bool,
                progress: bool) -> Listing:
    """The :class:`Listing` of ``dataset``, its layout printed to stderr with ``progress``. Raises
    :class:`ConversionError`."""
    try:
        listing = open_dataset(dataset, split, allow_partial)
    except DatasetError as exc:
        raise ConversionError(str(exc)) from None
    if progress:
        print(f"{prog}: source: {listing.layout}", file=sys.stderr, flush=True)
    return listing


def stage_folder(output: str) -> str:
    """Where a conversion to ``output`` stages images readable only front to back."""
    return os.path.normpath(output) + ".staging"


def stage(listing: Listing, folder: str, progress: bool) -> None:
    """Stage ``listing``'s images if its layout needs it; raises :class:`ConversionError`."""
    if listing.stage is None:
        return
    try:
        listing.stage(listing.files, folder, progress)
    except DatasetError as exc:
        raise ConversionError(str(exc)) from None
    except OSError as exc:
        raise ConversionError(f"{folder}: cannot stage the images ({exc.strerror or exc}); "
                              "is the disk full?") from None


def unstage(folder: str) -> None:
    """Delete a staging folder."""
    shutil.rmtree(folder, ignore_errors=True)


def report_damaged(prog: str, src, warning: str) -> None:
    """Name on stderr an image kept although libjpeg warned while checking it."""
    from tqdm import tqdm

    tqdm.write(f"{prog}: warning: keeping damaged image {src.where()}: the decoder said "
               f"\"{warning}\"; its header passed the acceptance rule, so it is stored as is "
               "(the loaders keep it too)", file=sys.stderr)


def _tsv_field(text: str) -> str:
    # Tabs and newlines in a file name would break the line format: escape them (and "\").
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def write_report(report: str, entries: list[bytes]) -> None:
    """Write ``skipped.tsv`` atomically (``path\\treason`` lines; ``entries``:
    ``msgpack([os.fsencode(rel), reason])``). Raises :class:`ConversionError`."""
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


@contextmanager
def source_to_compare(dataset: str, split: str | None, beside: str, seed: int | None):
    """For ``--verify --dataset``: ``dataset``'s listing in ``seed``'s order, staged beside
    ``beside`` if needed (deleted after). Raises :class:`DatasetError`."""
    listing = open_dataset(dataset, split, allow_partial=True)
    if seed is not None:
        listing = listing.shuffled(seed)
    folder = None
    try:
        if listing.stage is not None:
            folder = tempfile.mkdtemp(prefix=".verify-staging-",
                                      dir=os.path.dirname(os.path.abspath(beside)))
            listing.stage(listing.files, folder, False)
        yield listing
    finally:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
