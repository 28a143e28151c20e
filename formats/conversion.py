"""What both converters share: their error, summary, verification result, resume state, staging
and ``OUTPUT/skipped.tsv``."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import msgpack
from tqdm import tqdm

from decode import decoder_name, image_library
from decode.acceptance import MAX_PIXELS
from decode.raw import is_raw
from formats.cap import Cap
from formats.images import CHECKS, REENCODE_QUALITY, RULES_VERSION
from formats.raw_share import raw_record
from formats.sources import DatasetError, Listing, open_dataset, replace_synced

REPORT_NAME = "skipped.tsv"  # inside the output (beside data.mdb, or beside the shards)
_MiB = 1 << 20


class ConversionError(Exception):
    """The conversion cannot start or continue (bad source, output, disk, --strict): one line."""


@dataclass
class Summary:
    """A conversion's ``images`` (records), ``bytes``, ``seconds``, ``reencoded``, ``skipped``
    (listed in ``report``), ``resumed_at`` (files done before); ``raw``: what a raw share bought;
    ``shards`` written; ``array``: a job array's task's state."""

    images: int
    bytes: int
    seconds: float
    output: str
    reencoded: int = 0
    skipped: int = 0
    report: str = ""
    resumed_at: int = 0
    raw: str = ""
    shards: int = 0
    array: str = ""

    @classmethod
    def of(cls, state: "ResumeState", start: float, output: str, choice=None) -> "Summary":
        """What ``state`` holds, converted since ``start`` (``time.perf_counter()``)."""
        return cls(state.records, state.bytes, time.perf_counter() - start, output,
                   state.reencoded, state.skipped, os.path.join(output, REPORT_NAME),
                   state.resumed_at, choice.line(state.records) if choice else "",
                   len(state.shards))

    def line(self) -> str:
        resumed = f", resumed after {self.resumed_at} files" if self.resumed_at else ""
        rate = self.images / self.seconds if self.seconds > 0 else float("inf")
        return (f"wrote {self.images} images ({self.bytes / _MiB:.1f} MiB) to {self.output} "
                f"in {self.seconds:.1f} s ({rate:.0f} images/s{resumed}); "
                f"re-encoded {self.reencoded}, skipped {self.skipped} (listed in {self.report})"
                + "".join(f"; {part}" for part in (self.raw, self.shards and
                                                   f"{self.shards} shards", self.array) if part))


@dataclass
class Verification:
    """``problems`` (the first ``max_problems``) of ``total`` over ``count`` records of
    ``classes`` (in ``shards`` shards; None: an LMDB); ``checksums`` checked; ``dataset``:
    compared against, or None."""

    path: str
    count: int = 0
    classes: int = 0
    checksums: bool = False
    dataset: str | None = None
    problems: list[str] = field(default_factory=list)
    total: int = 0
    max_problems: int = 20
    shards: int | None = None

    def problem(self, text: str) -> None:
        self.total += 1
        if len(self.problems) < self.max_problems:
            self.problems.append(text)

    def line(self) -> str:
        shards = self.shards is not None
        where = f" in {self.shards} shards" if shards else ""
        sums = (("SHA-256 of each shard" if self.checksums else "no shard digests "
                 "(progress.json): changed image bytes can go unnoticed") if shards else
                "checksums" if self.checksums else
                "no checksum record (corruption that still decodes goes unnoticed)")
        what = (f"{self.count} records{where}, {self.classes} classes, {sums}"
                + (f", source {self.dataset}" if self.dataset else ""))
        if not self.total:
            return f"verified {self.path}: OK ({what})"
        shown = f"; first {len(self.problems)} below" if self.total > len(self.problems) else ""
        return f"verified {self.path}: {self.total} problems ({what}{shown})"


RESUME_VERSION = 1  # the layout of ResumeState's JSON; another one is refused, not guessed at
# how a setting reads in a refusal where it is not its flag's name (--check, --shard-size...)
_SETTING_NAMES = {"max_pixels": "--max-image-pixels", "array": "--tasks", "decoder": "decoder",
                  "rules": "image rules version", "quality": "re-encoding quality",
                  "library": "image library"}


@dataclass
class ResumeState:
    """A conversion's resume state, one JSON object committed with every batch of an LMDB, saved
    as ``progress.json`` after every shard: the listing's ``files`` (count), ``listing`` (hex
    SHA-256) and ``settings`` (:func:`fingerprint`); ``done`` source files (through the last
    batch or shard of ``shards``), of them ``records`` (``bytes`` of images, ``reencoded``) and
    ``skipped``; ``raw``: :meth:`~formats.raw_share.RawChoice.state`. ``resumed_at``: ``done``
    at this run's start (not stored)."""

    files: int
    listing: str
    settings: dict
    done: int = 0
    records: int = 0
    bytes: int = 0
    reencoded: int = 0
    skipped: int = 0
    raw: dict = field(default_factory=dict)
    shards: list = field(default_factory=list)
    resumed_at: int = field(default=0, compare=False)

    def encode(self) -> bytes:
        fields = {k: v for k, v in asdict(self).items() if k != "resumed_at"}
        return json.dumps({"version": RESUME_VERSION, **fields}, indent=1).encode()

    @classmethod
    def decode(cls, data: bytes | None) -> "ResumeState | None":
        """Inverse of :meth:`encode`; None for no, damaged or an older converter's ``data``."""
        try:
            fields = json.loads(data)
            return cls(**fields) if fields.pop("version") == RESUME_VERSION else None
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    @classmethod
    def load(cls, path: str) -> "ResumeState | None":
        """The state saved at ``path``; None as :meth:`decode` or if there is none. Raises
        ``OSError``."""
        try:
            with open(path, "rb") as f:
                return cls.decode(f.read())
        except FileNotFoundError:
            return None

    def save(self, path: str) -> None:
        replace_synced(path, self.encode())

    def tally(self) -> None:
        """``done`` and the counts from the finished ``shards``' entries."""
        self.done = self.shards[-1]["done"] if self.shards else 0
        self.records = sum(s["records"] for s in self.shards)
        self.bytes = sum(s["images"] for s in self.shards)
        self.reencoded = sum(s["reencoded"] for s in self.shards)
        self.skipped = sum(len(s["skipped"]) for s in self.shards)

    def refuse_other(self, output: str, recorded: "ResumeState | None",
                     remedy: str = "pass --overwrite to start over") -> None:
        """Raise :class:`ConversionError` naming what differs between this run and the unfinished
        conversion at ``output`` (``recorded``; None: missing or unreadable): resuming would mix
        two conversions, starting over unasked would throw work away."""
        if recorded is None:
            why = "whose resume state is missing or unreadable (an older converter's?)"
        elif recorded.settings != self.settings:
            then, now = recorded.settings, self.settings
            why = "with other settings (" + "; ".join(
                f"{_setting(k, then.get(k))} then, {_setting(k, now.get(k))} now"
                for k in sorted(then.keys() | now.keys()) if then.get(k) != now.get(k)) + ")"
        elif recorded.listing != self.listing:
            counts = (f"{recorded.files:,} files then, {self.files:,} now"
                      if recorded.files != self.files else
                      f"{self.files:,} files, other names, labels, sizes or dates")
            why = f"of other files (the listing differs: {counts})"
        else:
            return
        raise ConversionError(f"{output}: holds an unfinished conversion {why}; {remedy}")


def _setting(key: str, value) -> str:
    """A setting as a refusal names it, e.g. ``"--check header"``, ``"no --raw-budget"``."""
    if key == "cap":
        return Cap.from_record(value or {}).describe()
    name = _SETTING_NAMES.get(key, "--" + key.replace("_", "-"))
    return f"no {name}" if value in (None, False) else name if value is True else f"{name} {value}"


def fingerprint(listing: Listing, check: str = "full", cap=None, raw_budget=None,
                max_pixels: int = MAX_PIXELS, **more) -> ResumeState:
    """A new :class:`ResumeState` of ``listing``: ``listing``, the SHA-256 of the classes and each
    file's path, label, size and mtime (in an archive: the archive's, and the member's offset and
    size or row) in order, ~5 us per file; ``settings``: the rules, libraries, the arguments and
    ``more`` (a converter's own). A resume needs both the same."""
    # the decoder in use, not why others were passed over: that text (an exception's) may change
    # from one run to the next while the records do not
    settings = {"rules": RULES_VERSION, "quality": REENCODE_QUALITY, "library": image_library(),
                "decoder": decoder_name().split(" (", 1)[0], "check": check,
                "cap": cap.record() if cap is not None else {},
                "raw_budget": raw_budget.text if raw_budget is not None else None,
                "max_pixels": max_pixels, **more}
    digest = hashlib.sha256(msgpack.packb(listing.classes, use_bin_type=True))
    for src in listing.files:
        try:
            st = os.stat(src.path)
            size, mtime = st.st_size, st.st_mtime_ns
        except OSError:
            size, mtime = -1, -1
        entry = [os.fsencode(src.rel), src.label, size, mtime]
        digest.update(msgpack.packb(entry if src.offset < 0 else entry + [src.offset, src.size]))
    return ResumeState(len(listing.files), digest.hexdigest(), settings)


def open_source(prog: str, dataset: str, split: str | None, allow_partial: bool,
                progress: bool, check: str, seed: int | None) -> Listing:
    """The :class:`Listing` of ``dataset`` in ``seed``'s order, its layout (with ``progress``) and
    empty classes named on stderr. Raises :class:`ConversionError`, also for a bad ``check``."""
    if check not in CHECKS:
        raise ConversionError(f"check must be one of {', '.join(CHECKS)}, not {check!r}")
    try:
        listing = open_dataset(dataset, split, allow_partial)
    except DatasetError as exc:
        raise ConversionError(str(exc)) from None
    if progress:
        print(f"{prog}: source: {listing.layout}", file=sys.stderr, flush=True)
    for name in listing.empty_classes:
        print(f"{prog}: warning: class folder {name!r} is empty; its label is kept",
              file=sys.stderr)
    return listing.shuffled(seed) if seed is not None else listing


def stage_folder(output: str) -> str:
    """Where a conversion to ``output`` stages images readable only front to back."""
    return os.path.normpath(output) + ".staging"


@contextmanager
def staged(listing: Listing, folder: str, progress: bool):
    """Stage ``listing``'s images in ``folder`` if its layout needs it; the folder is deleted once
    the block succeeds (a rerun after a failure reuses it). Raises :class:`ConversionError`."""
    try:
        if listing.stage is not None:
            listing.stage(listing.files, folder, progress)
    except DatasetError as exc:
        raise ConversionError(str(exc)) from None
    except OSError as exc:
        raise ConversionError(f"{folder}: cannot stage the images ({exc.strerror or exc}); "
                              "is the disk full?") from None
    yield
    shutil.rmtree(folder, ignore_errors=True)


def stored(prog: str, src, result, strict: bool, choice, done: int, files: int) -> bytes | None:
    """What a converter stores of ``src``: its checked JPEG (``result``, a
    :class:`~formats.images.Checked`), or its raw record where ``choice`` (a
    :class:`~formats.raw_share.RawChoice` or None) takes it after ``done`` of ``files`` source
    files; None for a file skipped (``result``: why, a str). A damaged image kept is named on
    stderr. Raises :class:`ConversionError` for a skip under ``strict``."""
    if isinstance(result, str):
        if strict:
            raise ConversionError(f"{src.where()}: {result} (--strict)")
        return None
    if result.warning:
        tqdm.write(f"{prog}: warning: keeping damaged image {src.where()}: the decoder said "
                   f"\"{result.warning}\"; its header passed the acceptance rule, so it is "
                   "stored as is (the loaders keep it too)", file=sys.stderr)
    raw = choice is not None and choice.take(len(result.data), result.raw and len(result.raw),
                                             result.pixels, done, files)
    return result.raw if raw else result.data


def write_report(output: str, listing: Listing, records: int, skips) -> None:
    """Write ``output/skipped.tsv`` atomically: ``path\\treason`` lines of ``skips``, ``(rel,
    reason)`` pairs (``rel``: str or bytes), tabs, newlines and backslashes escaped. Raises
    :class:`ConversionError`, also if none of ``listing``'s files became one of the ``records``."""
    if not records:
        raise ConversionError(f"{listing.root}: none of its {len(listing.files)} files is an "
                              "image")

    def field(text: str) -> str:
        return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")

    report = os.path.join(output, REPORT_NAME)
    try:
        replace_synced(report, "path\treason\n" + "".join(
            f"{field(os.fsdecode(rel))}\t{field(reason)}\n" for rel, reason in skips))
    except OSError as exc:
        raise ConversionError(f"{report}: cannot write the report ({exc.strerror})") from None


@contextmanager
def source_to_compare(result: Verification, split: str | None, seed: int | None, classes):
    """``--verify --dataset``: ``result.dataset``'s listing in ``seed``'s order, its classes
    checked against the store's ``classes``, staged beside ``result.path`` if needed (deleted
    after); None without a dataset. Raises :class:`DatasetError`."""
    listing = open_dataset(result.dataset, split, allow_partial=True) if result.dataset else None
    if listing and listing.classes != list(classes):
        result.problem(f"classes differ from the class folders of {result.dataset}")
    if seed is not None and listing:
        listing = listing.shuffled(seed)
    if not listing or listing.stage is None:
        yield listing
        return
    with tempfile.TemporaryDirectory(prefix=".verify-staging-", ignore_cleanup_errors=True,
                                     dir=os.path.dirname(os.path.abspath(result.path))) as folder:
        listing.stage(listing.files, folder, False)
        yield listing


def differs(image: bytes, checked) -> str | None:
    """How a stored ``image`` differs from what its source converts to now (``checked``), or
    None."""
    if is_raw(image):  # a raw share's record: the pixels the JPEG decodes to
        return None if image == raw_record(checked.data)[0] else \
            "raw pixels differ from the source's decoded image"
    if image == checked.data:
        return None
    return "image bytes differ from " + (f"the re-encoded source ({checked.reencoded})"
                                         if checked.reencoded else "the source")
