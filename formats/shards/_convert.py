"""Writing WebDataset shards (:mod:`formats.shards`) from a listing of image files.

A shard ends before its file would exceed ``shard_size`` bytes or at ``max_per_shard`` records, and
is finished once its tar is synced, its ``.idx`` written and ``progress.json`` lists it. Boundaries
depend only on the records, so a rerun keeps the finished shards and writes the rest again: the
output equals an uninterrupted run's."""
from __future__ import annotations

import json
import os
import time

from decode.acceptance import MAX_PIXELS
from formats.conversion import (ConversionError, ResumeState, Summary, fingerprint, open_source,
                                stage, stage_folder, unstage, write_report)
from formats import raw_share
from formats.images import RULES_VERSION
from formats.sources import Listing

from ._codec import INDEX_NAME, ShardIndex, idx_name, shard_name, source_keys
from ._writing import PROGRESS_NAME, Records, in_place, refuse_foreign


def _prepare_output(output: str, wanted: ResumeState, overwrite: bool) -> ResumeState:
    """Make ``output`` ready; its state: the finished shards of an unfinished conversion of the
    same source and settings (``wanted``'s), or ``wanted``. Raises :class:`ConversionError` for a
    file, other files or (without ``overwrite``: start over) another conversion; ``OSError``."""
    names = refuse_foreign(output)
    path, state = os.path.join(output, PROGRESS_NAME), wanted
    if names and not overwrite:
        if INDEX_NAME in names:
            raise ConversionError(f"{output}: already holds a complete conversion "
                                  "(pass --overwrite to replace it)")
        state = ResumeState.load(path)
        wanted.refuse_other(output, state)
        kept = [in_place(output, shard) for shard in state.shards] + [False]
        del state.shards[kept.index(False):]
        state.tally()
        state.raw = state.shards[-1].get("raw", {}) if state.shards else {}
    kept = {n for s in state.shards for n in (s["name"], idx_name(s["name"]))}
    for name in names:
        if name not in kept and name != PROGRESS_NAME:
            os.remove(os.path.join(output, name))
    os.makedirs(output, exist_ok=True)
    state.save(path)
    return state


def _commit(shard, done: int, state: ResumeState, output: str, raw: dict | None) -> None:
    entry = shard.finish(done)
    if raw is not None:  # the raw share's totals through this shard (resumed from there)
        entry["raw"] = state.raw = raw
    state.shards.append(entry)
    state.tally()
    state.save(os.path.join(output, PROGRESS_NAME))


def open_shard_source(dataset: str, output: str, prefix: str | None, split: str | None,
                      seed: int, shard_size: int, max_per_shard: int | None, workers: int,
                      strict: bool, check: str, allow_partial: bool, progress: bool, cap,
                      raw_budget, max_pixels: int, array: bool = False
                      ) -> tuple[Listing, ResumeState, Records]:
    """The shuffled listing of ``dataset``, the new :class:`~formats.conversion.ResumeState` of
    its conversion (``array``: a job array's, which a one-process run does not resume, nor it
    one's) and its :class:`Records`, the settings checked. Raises :class:`ConversionError`."""
    if shard_size <= 0 or (max_per_shard is not None and max_per_shard <= 0):
        raise ConversionError("--shard-size and --max-per-shard must be positive")
    prefix = prefix or split or os.path.basename(os.path.normpath(dataset))
    if not prefix or "/" in prefix or any(c.isspace() for c in prefix):
        raise ConversionError(f"--prefix {prefix!r}: a shard name prefix has no '/' or spaces")
    listing = open_source("folder2shards.py", dataset, split, allow_partial, progress, check,
                          seed)
    source, target = os.path.realpath(listing.root), os.path.realpath(output)
    if listing.stage is None and os.path.isdir(source) \
            and os.path.commonpath([source, target]) == source:  # it would become a class
        raise ConversionError(f"{output}: inside the dataset folder {dataset}; choose another -o")
    wanted = fingerprint(listing, check, cap, raw_budget, max_pixels, prefix=prefix,
                         shuffle_seed=seed, shard_size=shard_size, max_per_shard=max_per_shard,
                         array=array)
    return listing, wanted, Records(output, source_keys(listing.classes, listing.files),
                                    shard_size, workers, strict, check, cap, max_pixels,
                                    len(listing.files))


def convert(dataset: str, output: str, prefix: str | None = None, shard_size: int = 1 << 30,
            max_per_shard: int | None = None, shuffle_seed: int = 0, workers: int = 8,
            strict: bool = False, overwrite: bool = False, progress: bool = True,
            check: str = "full", split: str | None = None,
            allow_partial: bool = False, cap=None, raw_budget=None,
            max_pixels: int = MAX_PIXELS) -> Summary:
    """Convert the image folder ``dataset`` (or ``split`` of the download in it) into shards in
    ``output`` and return its :class:`~formats.conversion.Summary`.

    ``prefix`` names the shards (default ``split``, else ``dataset``'s base name); ``shard_size``
    (bytes) and ``max_per_shard`` (records) bound each; ``shuffle_seed`` fixes the order. An
    unfinished conversion of the same files and settings resumes after its finished shards;
    another is refused, naming what differs (``overwrite``: start over). The other arguments as
    in :func:`formats.lmdb.convert`. Raises :class:`ConversionError` for bad settings, a bad
    source, an output that is a file, holds other files or (without ``overwrite``) another
    conversion, or cannot be written. (A job array's task: :func:`convert_task`.)"""
    from tqdm import tqdm

    start = time.perf_counter()
    listing, wanted, records = open_shard_source(
        dataset, output, prefix, split, shuffle_seed, shard_size, max_per_shard, workers, strict,
        check, allow_partial, progress, cap, raw_budget, max_pixels)
    try:
        state = _prepare_output(output, wanted, overwrite)
    except OSError as exc:
        raise ConversionError(f"{output}: cannot create the output ({exc.strerror or exc})") \
            from None
    state.resumed_at = state.done
    stage(listing, stage_folder(output), progress)
    choice = raw_share.start(raw_budget, listing, check, cap, state.raw or None)
    files, prefix = listing.files, state.settings["prefix"]
    records.bar = tqdm(total=len(files), initial=state.done, unit="img", dynamic_ncols=True,
                       desc=os.path.basename(output.rstrip("/")), disable=not progress or None)
    try:
        records.write(files[state.done:], state.done, max_per_shard,
                      lambda: shard_name(prefix, len(state.shards)),
                      lambda shard, done, raw: _commit(shard, done, state, output, raw), choice)
        records.bar.close()
        write_index(output, listing, state, [x for s in state.shards for x in s["skipped"]],
                    choice.state() if choice else {})
    except OSError as exc:
        raise ConversionError(f"{output}: cannot write the shards ({exc.strerror or exc}); "
                              "is the disk full?") from None
    unstage(stage_folder(output))
    return Summary.of(state, start, output, choice)


def write_index(output: str, listing: Listing, state: ResumeState, skips: list,
                raw: dict) -> None:
    """``skipped.tsv`` (``skips``, in source order), then ``index.json`` of ``state``'s shards,
    last. Raises :class:`ConversionError` if there is no shard, ``OSError``."""
    if not state.shards:
        raise ConversionError(f"{listing.root}: none of its {len(listing.files)} files is an "
                              "image")
    write_report(output, skips)
    entries = [{k: s[k] for k in ("name", "records", "bytes")} for s in state.shards]
    ShardIndex(listing.classes, entries, state.settings["shuffle_seed"], RULES_VERSION,
               names=listing.names, cap=state.settings["cap"], raw=raw).write(output)


def shard_digests(folder: str) -> dict[str, str] | None:
    """``{shard name: SHA-256 hex}`` from ``folder/progress.json`` (also an older converter's),
    or None."""
    try:
        with open(os.path.join(folder, PROGRESS_NAME)) as f:
            return {s["name"]: s["sha256"] for s in json.load(f)["shards"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None
