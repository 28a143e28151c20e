"""Writing WebDataset shards (:mod:`formats.shards`) from a listing of image files.

A shard ends before its file would exceed ``shard_size`` bytes or at ``max_per_shard`` records, and
is finished once its tar is synced, its ``.idx`` written and ``progress.json`` lists it. Boundaries
depend only on the records, so a rerun keeps the finished shards and writes the rest again: the
output equals an uninterrupted run's."""
from __future__ import annotations

import os
import sys
import time

import msgpack

from decode.acceptance import MAX_PIXELS
from formats.conversion import (REPORT_NAME, ConversionError, fingerprint, open_source,
                                refuse_other_cap, stage, stage_folder, unstage, write_report)
from formats import raw_share
from formats.images import CHECKS, RULES_VERSION
from formats.sources import Listing

from ._codec import INDEX_NAME, ShardIndex, idx_name, shard_name, source_keys
from ._writing import (PROGRESS_NAME, ConversionProgress, Records, ShardSummary,
                       refuse_foreign)


def _prepare_output(output: str, settings: dict, overwrite: bool) -> ConversionProgress:
    """Make ``output`` ready; its progress: the finished shards of an unfinished conversion with
    these ``settings``, or a new one. Raises :class:`ConversionError` for a file, other files or
    (without ``overwrite``) another conversion; ``OSError``."""
    names = refuse_foreign(output)
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


def _commit(shard, done: int, progress: ConversionProgress, output: str,
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


def open_shard_source(dataset: str, output: str, prefix: str | None, split: str | None,
                      seed: int, shard_size: int, max_per_shard: int | None, check: str,
                      allow_partial: bool, progress: bool) -> tuple[Listing, str]:
    """The shuffled listing of ``dataset`` and the shards' prefix, the settings checked. Raises
    :class:`ConversionError`."""
    if shard_size <= 0 or (max_per_shard is not None and max_per_shard <= 0):
        raise ConversionError("--shard-size and --max-per-shard must be positive")
    if check not in CHECKS:
        raise ConversionError(f"check must be one of {', '.join(CHECKS)}, not {check!r}")
    prefix = prefix or split or os.path.basename(os.path.normpath(dataset))
    if not prefix or "/" in prefix or any(c.isspace() for c in prefix):
        raise ConversionError(f"--prefix {prefix!r}: a shard name prefix has no '/' or spaces")
    listing = open_source("folder2shards.py", dataset, split, allow_partial,
                          progress).shuffled(seed)
    _check_outside(listing, dataset, output)
    for name in listing.empty_classes:
        print(f"folder2shards.py: warning: class folder {name!r} is empty; its label is kept",
              file=sys.stderr)
    return listing, prefix


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
    another conversion, or cannot be written. (A job array's task: :func:`convert_task`.)"""
    start = time.perf_counter()
    listing, prefix = open_shard_source(dataset, output, prefix, split, shuffle_seed, shard_size,
                                        max_per_shard, check, allow_partial, progress)
    cap_fields = cap.record() if cap is not None else {}
    settings = shard_settings(listing, check, cap, raw_budget, prefix, shuffle_seed, shard_size,
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


def shard_settings(listing: Listing, check: str, cap, raw_budget, prefix: str, seed: int,
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
    bar = tqdm(total=len(files), initial=state.done, unit="img", dynamic_ncols=True,
               desc=os.path.basename(output.rstrip("/")), disable=not progress or None)
    records = Records(output, source_keys(listing.classes, files), settings["shard_size"],
                      workers, strict, check, cap, max_pixels, len(files), bar)
    records.write(files[state.done:], state.done, settings["max_per_shard"],
                  lambda: shard_name(settings["prefix"], len(state.shards)),
                  lambda shard, done, raw: _commit(shard, done, state, output, raw), choice)
    bar.close()
    if not state.shards:
        raise ConversionError(f"{listing.root}: none of its {len(files)} files is an image")


def shard_digests(folder: str) -> dict[str, str] | None:
    """``{shard name: SHA-256 hex}`` from ``folder/progress.json``, or None."""
    state = ConversionProgress.load(folder)
    return {s["name"]: s["sha256"] for s in state.shards} if state else None
