"""Writing WebDataset shards (:mod:`formats.shards`) from a listing of image files, in one process
(:func:`convert`) or as a job array's task (:mod:`._array`, which shares :class:`Records`). A
shard ends before its file would exceed ``shard_size`` bytes or at ``max_per_shard`` records, and
is finished once its tar is synced, its ``.idx`` written and ``progress.json`` lists it.
Boundaries depend only on the records, so a rerun keeps the finished shards and writes the rest
again: the output equals an uninterrupted run's."""
from __future__ import annotations

import os
import tarfile
import time
from contextlib import closing
from dataclasses import dataclass

from decode.acceptance import MAX_PIXELS
from formats import raw_share
from formats.conversion import (ConversionError, ResumeState, Summary, fingerprint,
                                open_source, stage_folder, staged, stored)
from formats.images import check_files

from ._array import run_array
from ._codec import (IMAGE_EXT, INDEX_NAME, PROGRESS_NAME, RAW_EXT, ShardWriter, idx_name,
                     in_place, refuse_foreign, shard_name, source_keys, write_idx, write_index)


class _OpenShard:
    """The shard being written: its tar writer, record spans and progress entry fields."""

    def __init__(self, output: str, name: str, skipped: list):
        self.name, self.path = name, os.path.join(output, name)
        # under a temporary name until complete: no reader sees half a shard as a shard
        self.writer, self.spans, self.skipped = ShardWriter(self.path + ".tmp"), [], skipped
        self.reencoded = 0

    def fits(self, size: int, label: int, max_bytes: int, max_records: int | None) -> bool:
        """Whether a record of ``size`` image bytes may join (an empty shard takes any)."""
        if not self.spans:
            return True
        if max_records and len(self.spans) >= max_records:
            return False
        block, record = tarfile.BLOCKSIZE, tarfile.RECORDSIZE
        # each member: a header, its data padded to 512; then two zero blocks, padded to 10 KiB
        grown = self.writer.tell() + sum(block * (1 + -(-n // block)) for n in (size,
                                                                               len(str(label))))
        return -(-(grown + 2 * block) // record) * record <= max_bytes

    def finish(self, done: int) -> dict:
        """Close and sync the tar, write its ``.idx``; its progress entry ``{name, records, bytes,
        sha256, done (source files through it), images (bytes), reencoded, skipped}``."""
        self.writer.close(sync=True)
        write_idx(idx_name(self.path), self.spans)
        os.replace(self.path + ".tmp", self.path)
        return {"name": self.name, "records": len(self.spans), "bytes": self.writer.tell(),
                "sha256": self.writer.sha256(), "done": done,
                "images": sum(span.image_size for span in self.spans),
                "reencoded": self.reencoded, "skipped": self.skipped}


@dataclass
class Records:
    """What every shard of one conversion shares: ``output``, record ``keys``, the byte limit, how
    files are checked; ``total``: the listing's files (the raw share's pro rata); ``bar``."""

    output: str
    keys: dict
    shard_size: int
    workers: int
    strict: bool
    check: str = "full"
    cap: object = None
    max_pixels: int = MAX_PIXELS
    total: int = 0
    bar: object = None

    def write(self, files: list, first: int, max_records: int | None, name_of, commit,
              choice=None, budget_from: int = 0) -> list:
        """Check ``files`` (source ``first`` on) and write their records as shards named
        ``name_of()``, each ended at ``max_records`` or the byte limit and passed to
        ``commit(shard, done, raw)`` (``done``: source files through it; ``raw``: the raw share's
        totals through it, its budget pro rata of the files from source ``budget_from`` on).
        Returns the skips no shard took (``[[rel, reason]]``: files without one image). Raises
        :class:`ConversionError` (``strict``)."""
        shard, skipped = None, []
        post = raw_share.with_candidate(choice) if choice is not None else None
        with closing(check_files(files, self.workers, self.check,
                                 ahead=max(32, 16 * self.workers), cap=self.cap, post=post,
                                 max_pixels=self.max_pixels)) as results:
            for index, result in enumerate(results, first):
                src = files[index - first]
                if self.bar is not None:
                    self.bar.update(1)
                before = choice.state() if choice is not None else None
                data = stored("folder2shards.py", src, result, self.strict, choice,
                              index + 1 - budget_from, self.total)
                if data is None:  # not an image: the reason
                    (shard.skipped if shard else skipped).append([src.rel, result])
                    continue
                ext = RAW_EXT if data is result.raw else IMAGE_EXT
                if shard and not shard.fits(len(data), src.label, self.shard_size, max_records):
                    commit(shard, index, before)
                    shard = None
                if shard is None:
                    shard, skipped = _OpenShard(self.output, name_of(), skipped), []
                shard.spans.append(shard.writer.write(self.keys[src.rel], data, src.label, ext))
                shard.reencoded += result.reencoded is not None
        if shard is not None:
            commit(shard, first + len(files), choice.state() if choice else None)
        return skipped


def _prepare_output(output: str, wanted: ResumeState, overwrite: bool) -> ResumeState:
    """Make ``output`` ready; its state: the finished shards of an unfinished conversion with
    ``wanted``'s source and settings, or ``wanted``. Raises :class:`ConversionError` for a file,
    other files or (without ``overwrite``) another conversion; ``OSError``."""
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


def convert(dataset: str, output: str, prefix: str | None = None, shard_size: int = 1 << 30,
            max_per_shard: int | None = None, shuffle_seed: int = 0, workers: int = 8,
            strict: bool = False, overwrite: bool = False, progress: bool = True,
            check: str = "full", split: str | None = None,
            allow_partial: bool = False, cap=None, raw_budget=None,
            max_pixels: int = MAX_PIXELS, task: int | None = None, tasks: int | None = None,
            finish: bool = False) -> Summary | str:
    """Convert the image folder ``dataset`` (or ``split`` of the download in it) into shards in
    ``output`` and return its :class:`~formats.conversion.Summary`.

    ``prefix`` names the shards (default ``split``, else ``dataset``'s base name); ``shard_size``
    (bytes) and ``max_per_shard`` (records) bound each; ``shuffle_seed`` fixes the order. An
    unfinished conversion of the same files and settings resumes after its finished shards;
    another is refused, naming what differs (``overwrite``: start over). ``task`` (0-based) of
    ``tasks``, or ``finish``: a job array's (:mod:`._array`; a one-process run does not resume
    it, nor the reverse). The other arguments as in :func:`formats.lmdb.convert`. Raises
    :class:`ConversionError` for bad settings, a bad source, an output that is a file, holds
    other files or (without ``overwrite``) another conversion, or cannot be written."""
    from tqdm import tqdm

    start, array = time.perf_counter(), tasks is not None or finish
    if (task is None) != (tasks is None):
        raise ConversionError("--task I and --tasks N go together")
    if array:
        _check_array(overwrite, max_per_shard, task, tasks, finish)
    if shard_size <= 0 or (max_per_shard is not None and max_per_shard <= 0):
        raise ConversionError("--shard-size and --max-per-shard must be positive")
    prefix = prefix or split or os.path.basename(os.path.normpath(dataset))
    if not prefix or "/" in prefix or any(c.isspace() for c in prefix):
        raise ConversionError(f"--prefix {prefix!r}: a shard name prefix has no '/' or spaces")
    listing = open_source("folder2shards.py", dataset, split, allow_partial, progress, check,
                          shuffle_seed)
    source, target = os.path.realpath(listing.root), os.path.realpath(output)
    if listing.stage is None and os.path.isdir(source) \
            and os.path.commonpath([source, target]) == source:  # it would become a class
        raise ConversionError(f"{output}: inside the dataset folder {dataset}; choose another -o")
    wanted = fingerprint(listing, check, cap, raw_budget, max_pixels, prefix=prefix,
                         shuffle_seed=shuffle_seed, shard_size=shard_size,
                         max_per_shard=max_per_shard, array=array)
    records = Records(output, source_keys(listing.classes, listing.files), shard_size, workers,
                      strict, check, cap, max_pixels, len(listing.files))
    if array:
        return run_array(listing, output, wanted, records, task, tasks, finish, progress,
                         lambda: raw_share.start(raw_budget, listing, check, cap, None, workers))
    try:
        state = _prepare_output(output, wanted, overwrite)
    except OSError as exc:
        raise ConversionError(f"{output}: cannot create the output ({exc.strerror or exc})") \
            from None
    state.resumed_at = state.done
    with staged(listing, stage_folder(output), progress):
        choice = raw_share.start(raw_budget, listing, check, cap, state.raw, workers)
        records.bar = tqdm(total=records.total, initial=state.done, unit="img", dynamic_ncols=True,
                           desc=os.path.basename(output.rstrip("/")), disable=not progress or None)
        try:
            records.write(listing.files[state.done:], state.done, max_per_shard,
                          lambda: shard_name(prefix, len(state.shards)),
                          lambda shard, done, raw: _commit(shard, done, state, output, raw),
                          choice)
            records.bar.close()
            write_index(output, listing, state, [x for s in state.shards for x in s["skipped"]],
                        choice.state() if choice else {})
        except OSError as exc:
            raise ConversionError(f"{output}: cannot write the shards ({exc.strerror or exc}); "
                                  "is the disk full?") from None
    return Summary.of(state, start, output, choice)


def _check_array(overwrite: bool, max_per_shard: int | None, task: int | None,
                 tasks: int | None, finish: bool) -> None:
    """Raise :class:`ConversionError` for settings a job array's task cannot take."""
    if overwrite:
        raise ConversionError("--overwrite is not split over tasks: delete the folder first")
    if not max_per_shard:
        raise ConversionError("--tasks and --finish need --max-per-shard: a job array cuts its "
                              "shards by record count (docs/slurm.md)")
    if not finish and not (tasks and 0 <= task < tasks):
        raise ConversionError(f"--task {task} of --tasks {tasks}: 0 <= task < tasks")


def shard_digests(folder: str) -> dict[str, str] | None:
    """``{shard name: SHA-256 hex}`` from ``folder/progress.json``, or None."""
    try:
        return {s["name"]: s["sha256"] for s in ResumeState.load(
            os.path.join(folder, PROGRESS_NAME)).shards}
    except (OSError, AttributeError, KeyError, TypeError):  # none, unreadable, or not ours
        return None
