"""What the benchmarks share: their options, interleaved rounds and medians, the fresh
processes they time, and their table and JSON output.

Every benchmark runs from the repository's root as ``python -m benchmarks.NAME`` (the list:
benchmarks/README.md); none edits ``sys.path``. A benchmark that times something in a fresh
process starts it with :func:`module_command` and :func:`module_env`, which find this
checkout from any working directory, so paths given on its command line keep meaning what
they meant to the caller.

Why rounds are interleaved: on a shared machine the speed of one pipeline drifts by up to about
12% from minute to minute (docs/performance.md), so each round times every row once, one
after the other, and a row's figure is its median over the rounds; drift then reaches every
row alike instead of whichever ran last.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def add_data_option(parser: argparse.ArgumentParser, help_text: str,
                    flag: str = "--data") -> None:
    """The required image folder every benchmark reads (``--data``; ``--sample`` where a
    benchmark builds larger data from it)."""
    parser.add_argument(flag, required=True, help=help_text)


def add_rounds_option(parser: argparse.ArgumentParser, default: int,
                      help_text: str = "interleaved rounds; the median is reported") -> None:
    """``--rounds N``: how many interleaved rounds (:func:`interleave`) to time."""
    parser.add_argument("--rounds", type=int, default=default,
                        help=f"{help_text} (default: {default})")


def add_out_option(parser: argparse.ArgumentParser, help_text: str,
                   default: str | None = None, flag: str = "--out") -> None:
    """Where the JSON report goes: a folder with a default (``OUT/report.json`` and the
    benchmark's other files), or, without one, an optional JSON file."""
    parser.add_argument(flag, default=default, help=help_text)


def interleave(names: Iterable, measure: Callable, rounds: int, *, alternate: bool = False,
               on_result: Callable | None = None,
               on_round: Callable | None = None) -> dict[object, list]:
    """``{name: [measure(name) of each round]}``: ``rounds`` rounds, each measuring every name
    once, in the given order (``alternate``: reversed on odd rounds, A B C, C B A, ..., so that
    no row always runs first or right after the same one).

    ``on_result(round, name, result)`` is called after each measurement and
    ``on_round(round, results)`` after each round (``round`` counts from 0), for progress
    lines. Exceptions of ``measure`` propagate."""
    names = list(names)
    results: dict[object, list] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in reversed(names) if alternate and round_ % 2 else names:
            result = measure(name)
            results[name].append(result)
            if on_result:
                on_result(round_, name, result)
        if on_round:
            on_round(round_, results)
    return results


def median(values: Iterable[float]) -> float:
    """The median of the rounds (the mean of the two middle values for an even count)."""
    return statistics.median(values)


def median_high(values: Iterable):
    """The upper of the two middle values for an even count, else the middle one: always a
    round's own result (a tuple compares by its first item). The benchmarks that report it
    have done so since their first figures, which it keeps reproducible."""
    return statistics.median_high(values)


def module_command(module: str, *args: str) -> list[str]:
    """``python -m MODULE ARGS`` with this interpreter: a benchmark's fresh process (of itself
    or another module of this checkout); run it with ``env=module_env()`` or ``cwd=REPO``."""
    return [sys.executable, "-m", module, *args]


def module_env() -> dict[str, str]:
    """This process's environment with the repository first on ``PYTHONPATH``, so that
    :func:`module_command` finds this checkout's modules from any working directory."""
    old = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": REPO + (os.pathsep + old if old else "")}


def run_json_process(name: str, cmd: list[str], timeout: float) -> dict:
    """Run ``cmd`` from the repository's root and return the last line of its stdout that is
    a JSON object (``main.py --benchmark-data`` prints ``images``, ``seconds`` and
    ``images_per_sec``). Raises RuntimeError naming ``name`` and the last stderr line when it
    fails, prints no such line or runs past ``timeout`` seconds."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{name}: no result within {timeout:.0f} s") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{name}: exit status {done.returncode}: {why}")
    return json.loads(lines[-1])


def split_folder(data: str, split: str) -> str:
    """``data/split``; where ``data`` has a ``train/`` but no ``val/``, ``data/train`` for
    ``val`` too: a benchmark times reading, and what needs a validation split (``main.py``'s
    two roots, a converted val store) reads the training images. Raises ``FileNotFoundError``
    (one line) without ``data/train``."""
    train = os.path.join(data, "train")
    if not os.path.isdir(train):
        raise FileNotFoundError(f"{data}: no train/ folder (an ImageNet-layout folder holds "
                                "train/ and optionally val/ class folders)")
    folder = os.path.join(data, split)
    return folder if split == "train" or os.path.isdir(folder) else train


def replicate(src: str, dst: str, copies: int, keep: Callable[[str], bool] | None = None) -> str:
    """``dst/{train,val}/<class>/`` with ``copies`` symlinks per image of ``src/{train,val}``
    (``NAME_K.EXT``), so that one epoch of a small sample outlasts the timed batches (worker
    start-up excluded); ``src`` without ``val/`` lends its ``train/`` (:func:`split_folder`).
    With ``keep`` (a function of a file's absolute path), only the files it accepts; every
    class folder is made either way, so both splits list the same classes. Returns ``dst``."""
    for split in ("train", "val"):
        source = split_folder(src, split)
        for wnid in sorted(os.listdir(source)):
            folder = os.path.join(source, wnid)
            if not os.path.isdir(folder):
                continue
            os.makedirs(os.path.join(dst, split, wnid), exist_ok=True)
            for name in os.listdir(folder):
                path = os.path.abspath(os.path.join(folder, name))
                if keep is not None and not keep(path):
                    continue
                stem, ext = os.path.splitext(name)
                for k in range(copies):
                    os.symlink(path, os.path.join(dst, split, wnid, f"{stem}_{k}{ext}"))
    return dst


def warm_page_cache(root: str) -> None:
    """Read every file under ``root`` once, so that every timed pipeline finds it in the page
    cache (none pays for the first read from disk)."""
    for folder, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                while f.read(1 << 20):
                    pass


@contextlib.contextmanager
def scratch(prefix: str, dir: str | None = None) -> Iterator[str]:
    """A new temporary folder (under ``dir``, else the system's), removed with everything in
    it when the block ends, however it ends."""
    path = tempfile.mkdtemp(prefix=prefix, dir=dir)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def markdown_table(header: list[str], rows: Iterable[list[str]]) -> str:
    """A Markdown table (``| a | b |`` lines under a ``|---|---|`` rule), as the docs quote
    the benchmarks' output; cells are already formatted."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def write_json(path: str, report: dict, indent: int = 1) -> None:
    """Write ``report`` to the file ``path`` as JSON."""
    with open(path, "w") as f:
        json.dump(report, f, indent=indent)


def error(prog: str, message: object) -> int:
    """Print ``PROG: error: MESSAGE`` as one line on stderr; returns 1, the exit status of a
    benchmark that could not run."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 1
