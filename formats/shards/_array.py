"""One conversion split over the tasks of a job array (``folder2shards.py --task I --tasks N``;
docs/slurm.md#converting-on-the-cluster).

The shuffled listing is cut into blocks of ``--max-per-shard`` files; block ``b`` becomes
``PREFIX-b.tar`` (one that outgrows ``--shard-size`` goes on in ``PREFIX-b-000001.tar``, ...), so
any ``N`` writes the same files. Task ``i`` of ``n`` takes blocks ``[i*K//n, (i+1)*K//n)`` of the
``K``. A block is finished once its shards are in place and ``PREFIX-b.done`` (their progress
entries) lists them: a task killed, requeued or rerun with another ``N`` redoes only unfinished
blocks. ``progress.json`` (settings and the raw share's choice) is made once by the first task
(``os.link`` lets one win); the task that finds every block done, or ``--finish``, writes it
anew with every shard, then ``skipped.tsv`` and ``index.json``, under ``index.json.lock``."""
from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from contextlib import suppress
from dataclasses import replace

from formats import raw_share
from formats.conversion import (REPORT_NAME, ConversionError, ResumeState, Summary,
                                stage_folder, staged)
from formats.sources import Listing, replace_synced, write_synced

from ._codec import INDEX_NAME, PROGRESS_NAME, in_place, refuse_foreign, shard_name, write_index

LOCK_NAME = "index.json.lock"  # held while the index is written


def task_blocks(blocks: int, task: int, tasks: int) -> range:
    """The blocks task ``task`` (0-based) of ``tasks`` converts: a contiguous run, all ``blocks``
    covered once by the tasks together."""
    return range(task * blocks // tasks, (task + 1) * blocks // tasks)


def _done_path(output: str, prefix: str, block: int) -> str:
    return os.path.join(output, f"{prefix}-{block:06d}.done")


def _load_done(output: str, prefix: str, block: int) -> dict | None:
    """Block ``block``'s record if it is finished: its shards there at their recorded sizes."""
    try:
        with open(_done_path(output, prefix, block)) as f:
            done = json.load(f)
        return done if all(in_place(output, s) for s in done["shards"]) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_array(listing: Listing, output: str, wanted: ResumeState, records,
              task: int | None, tasks: int | None, finish: bool, progress: bool,
              start_raw) -> Summary | str:
    """Convert task ``task`` (0-based) of ``tasks``'s blocks of ``listing`` into ``output`` and
    return what it wrote; the last task to finish writes the index. ``finish``: only write the
    index (every block must be done). ``records``: the shards' writer
    (:class:`~formats.shards._convert.Records`); ``start_raw()``: the raw share's choice, made
    once for the whole set by the task that creates ``progress.json`` (``os.link`` lets one win;
    the others must have the same source and settings). Raises :class:`ConversionError` for an
    output holding other files or another conversion, or a write error."""
    refuse_foreign(output)
    path = os.path.join(output, PROGRESS_NAME)
    try:
        os.makedirs(output, exist_ok=True)
        if PROGRESS_NAME not in os.listdir(output):
            choice = start_raw()
            tmp = f"{path}.{os.getpid()}.tmp"
            write_synced(tmp, replace(wanted, raw=choice.state() if choice else {}).encode())
            try:
                with suppress(FileExistsError):  # another task made it first: its state counts
                    os.link(tmp, path)
            finally:
                os.remove(tmp)
        state = ResumeState.load(path)
        wanted.refuse_other(output, state, "a resumed array needs the same source, flags and "
                            "version; or delete the folder")
        if not finish:
            return run_task(listing, output, state, task, tasks, records, progress)
        finish_index(listing, output, state)
    except OSError as exc:
        raise ConversionError(f"{output}: cannot write the shards ({exc.strerror or exc}); "
                              "is the disk full?") from None
    state = ResumeState.load(path)
    return (f"{output}: complete: {state.records} images in {len(state.shards)} shards, "
            f"skipped {state.skipped} (listed in {REPORT_NAME}); {INDEX_NAME} written")


def run_task(listing: Listing, output: str, state: ResumeState, task: int, tasks: int,
             records, progress: bool) -> Summary:
    """Convert task ``task``'s blocks of ``listing`` into ``output``, then write the index if every
    block is done; what this task wrote. Raises :class:`ConversionError`."""
    start = time.perf_counter()
    prefix, block = state.settings["prefix"], state.settings["max_per_shard"]
    files = listing.files
    mine = task_blocks(-(-len(files) // block), task, tasks)
    todo = [b for b in mine if _load_done(output, prefix, b) is None]
    pending = [s for b in todo for s in files[b * block:(b + 1) * block]]
    if progress:
        blocks = f"blocks {mine.start}-{mine.stop - 1}" if mine else "no block (N > shards)"
        print(f"folder2shards.py: task {task} of {tasks}: {blocks}, {len(mine) - len(todo)} "
              f"already done, {len(pending)} files to convert (-j {records.workers})",
              file=sys.stderr, flush=True)
    written = []
    with staged(replace(listing, files=pending), f"{stage_folder(output)}-{task}-of-{tasks}",
                progress):
        for b in todo:
            written += _write_block(records, listing, output, prefix, b, block, state.raw)
    wrote = replace(state, shards=written, resumed_at=(len(mine) - len(todo)) * block)
    wrote.tally()
    summary = Summary.of(wrote, start, output)
    summary.array = f"task {task} of {tasks} done; " + {
        "written": f"every block done: wrote {INDEX_NAME}",
        "there": f"every block done, {INDEX_NAME} written by another task",
        "": "other tasks' blocks still to do (the last task writes the index)",
    }[finish_index(listing, output, state, True)]
    return summary


def _write_block(records, listing: Listing, output: str, prefix: str, b: int,
                 block: int, raw_choice: dict | None) -> list[dict]:
    """Write block ``b``'s shards (``PREFIX-b.tar``, then ``PREFIX-b-p.tar``), then its ``.done``;
    its shards' entries. A killed run's ``.tmp`` files are written over or go with the index."""
    shards = []
    # the raw share: the set's one choice, its budget held by each block on its own
    choice = raw_share.RawChoice.from_state(raw_choice) if raw_choice else None
    first = b * block
    loose = records.write(
        listing.files[first:first + block], first, None,
        lambda: f"{prefix}-{b:06d}-{len(shards):06d}.tar" if shards else shard_name(prefix, b),
        lambda shard, done, raw: shards.append(shard.finish(done)), choice, first)
    done = _done_path(output, prefix, b)
    replace_synced(done, json.dumps({"shards": shards, "skipped": loose, "raw": choice.state()
                                     if choice else {}}, indent=1), f"{done}.{os.getpid()}.tmp")
    return shards


def finish_index(listing: Listing, output: str, state: ResumeState,
                 missing_ok: bool = False) -> str:
    """Write ``progress.json`` with every shard, ``skipped.tsv`` and ``index.json`` of ``output``
    if every block is done, each accounting for its files; what became of it: ``"written"``,
    ``"there"`` (by another task before) or ``""`` (blocks still to do, with ``missing_ok``).
    Raises :class:`ConversionError` if a block is not done (unless ``missing_ok``) or
    miscounted."""
    prefix, block = state.settings["prefix"], state.settings["max_per_shard"]
    files = listing.files
    with open(os.path.join(output, LOCK_NAME), "a") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX)  # one writer of the index at a time, also over NFS
        if os.path.exists(os.path.join(output, INDEX_NAME)):
            return "there"
        dones = []
        for b in range(-(-len(files) // block)):
            done = _load_done(output, prefix, b)
            if done is None:
                if missing_ok:
                    return ""
                raise ConversionError(f"{output}: block {b} ({shard_name(prefix, b)}) is not "
                                      "done yet: run the array's missing tasks first")
            count = sum(s["records"] + len(s["skipped"]) for s in done["shards"])
            if count + len(done["skipped"]) != len(files[b * block:(b + 1) * block]):
                raise ConversionError(f"{output}: block {b} accounts for {count} files, not "
                                      f"{len(files[b * block:(b + 1) * block])}")
            dones.append(done)
        final = replace(state, shards=[s for d in dones for s in d["shards"]])
        raw = dict(state.raw)
        for key in ("stored", "jpeg", "records", "saved_s", "extra") if raw else ():
            raw[key] = sum(d["raw"][key] for d in dones)
        final.tally()  # its raw: the set's choice, as the blocks had it
        final.save(os.path.join(output, PROGRESS_NAME))
        for name in os.listdir(output):  # killed tasks' leftovers: every block is done
            if name.endswith(".tmp"):
                os.remove(os.path.join(output, name))
        write_index(output, listing, final, [x for d in dones for x in [
            y for s in d["shards"] for y in s["skipped"]] + d["skipped"]], raw)
    return "written"
