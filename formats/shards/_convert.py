"""Writing WebDataset shards (:mod:`formats.shards`) from a listing of image files.

A shard ends before its file would exceed ``shard_size`` bytes or at ``max_per_shard`` records, and
is finished once its tar is synced, its ``.idx`` written and ``progress.json`` lists it. Boundaries
depend only on the records, so a rerun keeps the finished shards and writes the rest again: the
output equals an uninterrupted run's."""
from __future__ import annotations

import json
import os
import re
import sys
import tarfile
import time
from contextlib import closing
from dataclasses import dataclass, field

import msgpack

from decode.acceptance import MAX_PIXELS
from formats.conversion import (REPORT_NAME, ConversionError, Summary, fingerprint, open_source,
                                report_damaged,
                                refuse_other_cap, stage, stage_folder, unstage, write_report)
from formats import raw_share
from formats.images import CHECKS, RULES_VERSION, check_files
from formats.sources import Listing

from ._codec import (IMAGE_EXT, INDEX_NAME, RAW_EXT, ShardIndex, ShardWriter, idx_name,
                     shard_name, source_keys, write_idx)

PROGRESS_NAME = "progress.json"
_OURS = re.compile(r"(.+-\d{6}\.(tar|idx)|index\.json|progress\.json|skipped\.tsv)(\.tmp)?")


def _member_bytes(size: int) -> int:
    """Bytes a tar member of ``size`` data bytes takes: header plus data padded to 512."""
    return tarfile.BLOCKSIZE * (1 + -(-size // tarfile.BLOCKSIZE))


def _closed_size(offset: int) -> int:
    """Bytes of a tar closed at ``offset``: two zero blocks, padded to tarfile's 10 KiB record."""
    return -(-(offset + 2 * tarfile.BLOCKSIZE) // tarfile.RECORDSIZE) * tarfile.RECORDSIZE


@dataclass
class ConversionProgress:
    """``progress.json``, kept for ``--verify`` and resuming: ``settings`` and the finished
    ``shards``, each ``{name, records, bytes (tar), sha256, done (source files through it), images
    (image bytes), reencoded, skipped ([[rel, reason], ...]), raw (totals, if any)}``."""

    settings: dict
    shards: list[dict] = field(default_factory=list)

    @property
    def done(self) -> int:
        return self.shards[-1]["done"] if self.shards else 0

    def total(self, key: str) -> int:
        return sum(len(s[key]) if key == "skipped" else s[key] for s in self.shards)

    def save(self, folder: str) -> None:
        """Write ``folder/progress.json`` atomically and synced. Raises ``OSError``."""
        path = os.path.join(folder, PROGRESS_NAME)
        with open(path + ".tmp", "w") as f:
            json.dump({"settings": self.settings, "shards": self.shards}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)

    @classmethod
    def load(cls, folder: str) -> "ConversionProgress | None":
        """The progress in ``folder``; None if absent or unreadable."""
        try:
            with open(os.path.join(folder, PROGRESS_NAME)) as f:
                data = json.load(f)
            return cls(dict(data["settings"]), list(data["shards"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None


@dataclass
class ShardSummary(Summary):
    """:class:`~formats.conversion.Summary` plus the ``shards`` written."""

    shards: int = 0

    def line(self) -> str:
        return f"{super().line()}; {self.shards} shards"


def _prepare_output(output: str, settings: dict, overwrite: bool) -> ConversionProgress:
    """Make ``output`` ready; its progress: the finished shards of an unfinished conversion with
    these ``settings``, or a new one. Raises :class:`ConversionError` for a file, other files or
    (without ``overwrite``) another conversion; ``OSError``."""
    if os.path.exists(output) and not os.path.isdir(output):
        raise ConversionError(f"{output}: exists and is not a directory; choose another -o")
    names = sorted(os.listdir(output)) if os.path.isdir(output) else []
    foreign = [n for n in names if not _OURS.fullmatch(n)]
    if foreign:
        raise ConversionError(f"{output}: holds files other than shards ({foreign[0]}); "
                              "choose another -o")
    progress = ConversionProgress.load(output) if names and not overwrite else None
    if names and not overwrite:
        if INDEX_NAME in names:
            raise ConversionError(f"{output}: already holds a complete conversion "
                                  "(pass --overwrite to replace it)")
        if progress is not None:
            refuse_other_cap(output, progress.settings.get("cap", {}), settings.get("cap", {}))
        if progress is None or progress.settings != settings:
            raise ConversionError(f"{output}: holds an unfinished conversion of other files or "
                                  "settings (pass --overwrite to start over)")
        keep = 0
        for shard in progress.shards:  # finished: tar of the recorded size, then its .idx
            tar = os.path.join(output, shard["name"])
            if not (os.path.isfile(tar) and os.path.getsize(tar) == shard["bytes"]
                    and os.path.isfile(idx_name(tar))):
                break
            keep += 1
        del progress.shards[keep:]
    progress = progress or ConversionProgress(settings)
    kept = {n for s in progress.shards for n in (s["name"], idx_name(s["name"]))}
    for name in names:
        if name not in kept and name != PROGRESS_NAME:
            os.remove(os.path.join(output, name))
    os.makedirs(output, exist_ok=True)
    progress.save(output)
    return progress


class _OpenShard:
    """The shard being written: its tar writer, record spans and progress entry fields."""

    def __init__(self, output: str, name: str, skipped: list):
        self.name, self.path = name, os.path.join(output, name)
        self.writer, self.spans, self.skipped = ShardWriter(self.path), [], skipped
        self.images = self.reencoded = 0

    def fits(self, size: int, label: int, max_bytes: int, max_records: int | None) -> bool:
        """Whether a record of ``size`` image bytes may join (an empty shard takes any)."""
        if not self.spans:
            return True
        if max_records and len(self.spans) >= max_records:
            return False
        grown = self.writer.tell() + _member_bytes(size) + _member_bytes(len(str(label)))
        return _closed_size(grown) <= max_bytes

    def add(self, key: str, checked, label: int, data: bytes, ext: str) -> None:
        """Append ``data`` (``checked.data``, or its raw record with ``ext`` ``ppm``)."""
        self.spans.append(self.writer.write(key, data, label, ext))
        self.images += len(data)
        self.reencoded += checked.reencoded is not None

    def finish(self, done: int) -> dict:
        """Close and sync the tar, write its ``.idx``, and return its progress entry (``done``:
        source files consumed through it). Raises ``OSError``."""
        self.writer.close(sync=True)
        write_idx(idx_name(self.path), self.spans)
        return {"name": self.name, "records": len(self.spans), "bytes": self.writer.tell(),
                "sha256": self.writer.sha256(), "done": done, "images": self.images,
                "reencoded": self.reencoded, "skipped": self.skipped}


def _commit(shard: _OpenShard, done: int, progress: ConversionProgress, output: str,
            raw: dict | None = None) -> None:
    entry = shard.finish(done)
    if raw is not None:  # the raw share's totals through this shard (resumed from there)
        entry["raw"] = raw
    progress.shards.append(entry)
    progress.save(output)


def _check_outside(listing: Listing, dataset: str, output: str) -> None:
    """Refuse an ``output`` inside the folder the listing reads (it would become a class)."""
    source, target = os.path.realpath(listing.root), os.path.realpath(output)
    if listing.stage is None and os.path.isdir(source) \
            and os.path.commonpath([source, target]) == source:
        raise ConversionError(f"{output}: inside the dataset folder {dataset}; choose another -o")


def convert(dataset: str, output: str, prefix: str | None = None, shard_size: int = 1 << 30,
            max_per_shard: int | None = None, shuffle_seed: int = 0, workers: int = 8,
            strict: bool = False, overwrite: bool = False, progress: bool = True,
            check: str = "full", split: str | None = None,
            allow_partial: bool = False, cap=None, raw_budget=None,
            max_pixels: int = MAX_PIXELS) -> ShardSummary:
    """Convert the image folder ``dataset`` (or ``split`` of the download in it) into shards in
    ``output`` and return its :class:`ShardSummary`.

    ``prefix`` names the shards (default ``split``, else ``dataset``'s base name); ``shard_size``
    (bytes) and ``max_per_shard`` (records) bound each; ``shuffle_seed`` fixes the order. An
    unfinished conversion of the same files and settings resumes after its finished shards. The
    other arguments as in :func:`formats.lmdb.convert`. Raises :class:`ConversionError` for bad
    settings, a bad source, an output that is a file, holds other files or (without ``overwrite``)
    another conversion, or cannot be written."""
    start = time.perf_counter()
    if shard_size <= 0 or (max_per_shard is not None and max_per_shard <= 0):
        raise ConversionError("--shard-size and --max-per-shard must be positive")
    if check not in CHECKS:
        raise ConversionError(f"check must be one of {', '.join(CHECKS)}, not {check!r}")
    prefix = prefix or split or os.path.basename(os.path.normpath(dataset))
    if not prefix or "/" in prefix or any(c.isspace() for c in prefix):
        raise ConversionError(f"--prefix {prefix!r}: a shard name prefix has no '/' or spaces")
    listing = open_source("folder2shards.py", dataset, split, allow_partial,
                          progress).shuffled(shuffle_seed)
    _check_outside(listing, dataset, output)
    for name in listing.empty_classes:
        print(f"folder2shards.py: warning: class folder {name!r} is empty; its label is kept",
              file=sys.stderr)
    cap_fields = cap.record() if cap is not None else {}
    settings = _settings(listing, check, cap, raw_budget, prefix, shuffle_seed, shard_size,
                         max_per_shard, max_pixels)
    try:
        state = _prepare_output(output, settings, overwrite)
    except OSError as exc:
        raise ConversionError(f"{output}: cannot create the output ({exc.strerror or exc})") \
            from None
    resumed_at = state.done
    stage(listing, stage_folder(output), progress)
    resumed_raw = state.shards[-1].get("raw") if state.shards else None
    choice = raw_share.start(raw_budget, listing, check, cap, resumed_raw)
    try:
        _write_shards(listing, state, output, workers, strict, progress, check, cap, choice,
                      max_pixels)
        write_report(os.path.join(output, REPORT_NAME), [
            msgpack.packb([os.fsencode(rel), why], use_bin_type=True)
            for s in state.shards for rel, why in s["skipped"]])
        entries = [{k: s[k] for k in ("name", "records", "bytes")} for s in state.shards]
        ShardIndex(listing.classes, entries, shuffle_seed, RULES_VERSION, names=listing.names,
                   cap=cap_fields, raw=choice.state() if choice else {}).write(output)  # last
    except OSError as exc:
        raise ConversionError(f"{output}: cannot write the shards ({exc.strerror or exc}); "
                              "is the disk full?") from None
    unstage(stage_folder(output))
    return ShardSummary(state.total("records"), state.total("images"),
                        time.perf_counter() - start, output, state.total("reencoded"),
                        state.total("skipped"), os.path.join(output, REPORT_NAME), resumed_at,
                        raw=choice.line(state.total("records")) if choice else "",
                        shards=len(state.shards))


def _settings(listing: Listing, check: str, cap, raw_budget, prefix: str, seed: int,
              shard_size: int, max_per_shard: int | None, max_pixels: int = MAX_PIXELS) -> dict:
    """``progress.json``'s settings: what a resume must share with its run."""
    settings = {"fingerprint": fingerprint(listing, check, cap, raw_budget, max_pixels).hex(),
                "prefix": prefix, "seed": seed, "shard_size": shard_size,
                "max_per_shard": max_per_shard, "rules": RULES_VERSION}
    cap_fields = cap.record() if cap is not None else {}
    if cap_fields:
        settings["cap"] = cap_fields
    if raw_budget is not None:
        settings["raw_budget"] = raw_budget.text
    return settings


def _write_shards(listing: Listing, state: ConversionProgress, output: str, workers: int,
                  strict: bool, progress: bool, check: str = "full", cap=None,
                  choice=None, max_pixels: int = MAX_PIXELS) -> None:
    """Check and write ``listing.files[state.done:]`` as shards, committing each to
    ``progress.json``. Raises :class:`ConversionError` (``strict``, or no image)."""
    from tqdm import tqdm

    files, settings = listing.files, state.settings
    keys = source_keys(listing.classes, files)
    bar = tqdm(total=len(files), initial=state.done, unit="img", dynamic_ncols=True,
               desc=os.path.basename(output.rstrip("/")), disable=not progress or None)
    shard, skipped = None, []
    pending = files[state.done:]
    post = raw_share.with_candidate(choice) if choice is not None else None
    with closing(check_files(pending, workers, check, ahead=max(32, 16 * workers),
                             cap=cap, post=post, max_pixels=max_pixels)) as results:
        for index, result in enumerate(results, state.done):
            src = files[index]
            bar.update(1)
            if isinstance(result, str):  # not an image: the reason
                if strict:
                    raise ConversionError(f"{src.where()}: {result} (--strict)")
                (shard.skipped if shard else skipped).append([src.rel, result])
                continue
            if result.warning:
                report_damaged("folder2shards.py", src, result.warning)
            before = choice.state() if choice is not None else None
            data, ext = _stored(choice, result, index + 1, len(files))
            if shard and not shard.fits(len(data), src.label, settings["shard_size"],
                                        settings["max_per_shard"]):
                _commit(shard, index, state, output, before)
                shard = None
            if shard is None:
                name = shard_name(settings["prefix"], len(state.shards))
                shard, skipped = _OpenShard(output, name, skipped), []
            shard.add(keys[src.rel], result, src.label, data, ext)
    if shard is not None:
        _commit(shard, len(files), state, output, choice.state() if choice else None)
    bar.close()
    if not state.shards:
        raise ConversionError(f"{listing.root}: none of its {len(files)} files is an image")


def _stored(choice, checked, files_done: int, files: int) -> tuple[bytes, str]:
    """``(bytes, extension)``: the raw record (``ppm``) if ``choice`` takes it, else JPEG."""
    if choice is not None and choice.take(len(checked.data), checked.raw and len(checked.raw),
                                          checked.pixels, files_done, files):
        return checked.raw, RAW_EXT
    return checked.data, IMAGE_EXT


def shard_digests(folder: str) -> dict[str, str] | None:
    """``{shard name: SHA-256 hex}`` from ``folder/progress.json``, or None."""
    state = ConversionProgress.load(folder)
    return {s["name"]: s["sha256"] for s in state.shards} if state else None
