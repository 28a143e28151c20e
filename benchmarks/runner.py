"""What the benchmarks share: their options, interleaved rounds and medians, the fresh
processes they time, and their table and JSON output.

Rounds are interleaved because on a shared machine a pipeline's speed drifts by up to ~12%
from minute to minute (docs/performance.md): each round times every row once and a row's
figure is its median over the rounds, so drift reaches every row alike.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
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
    """The required image folder (``--data``; ``--sample`` where larger data is built from it)."""
    parser.add_argument(flag, required=True, help=help_text)


def add_rounds_option(parser: argparse.ArgumentParser, default: int,
                      help_text: str = "interleaved rounds; the median is reported") -> None:
    """``--rounds N``: how many interleaved rounds (:func:`interleave`) to time."""
    parser.add_argument("--rounds", type=int, default=default,
                        help=f"{help_text} (default: {default})")


def add_out_option(parser: argparse.ArgumentParser, help_text: str,
                   default: str | None = None, flag: str = "--out") -> None:
    """Where the JSON report goes: a folder with a default, else an optional JSON file."""
    parser.add_argument(flag, default=default, help=help_text)


def interleave(names: Iterable, measure: Callable, rounds: int, *, alternate: bool = False,
               on_result: Callable | None = None,
               on_round: Callable | None = None) -> dict[object, list]:
    """``{name: [measure(name) of each round]}``: ``rounds`` rounds, each measuring every name
    once in order (``alternate``: reversed on odd rounds, so no row always runs first).
    ``on_result(round, name, result)`` follows each measurement, ``on_round(round, results)``
    each round (``round`` from 0). Exceptions of ``measure`` propagate."""
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
    """The median (the mean of the two middle values for an even count)."""
    return statistics.median(values)


def median_high(values: Iterable):
    """The upper of the two middle values for an even count: always a round's own result (a
    tuple compares by its first item)."""
    return statistics.median_high(values)


def module_command(module: str, *args: str) -> list[str]:
    """``python -m MODULE ARGS`` with this interpreter; run it with ``env=module_env()`` (paths
    on the caller's command line keep their meaning) or ``cwd=REPO``."""
    return [sys.executable, "-m", module, *args]


def module_env() -> dict[str, str]:
    """This process's environment with the repository first on ``PYTHONPATH``."""
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
    """``data/split``, or ``data/train`` for a missing ``val/`` (a benchmark times reading).
    Raises ``FileNotFoundError`` without ``data/train``."""
    train = os.path.join(data, "train")
    if not os.path.isdir(train):
        raise FileNotFoundError(f"{data}: no train/ folder (an ImageNet-layout folder holds "
                                "train/ and optionally val/ class folders)")
    folder = os.path.join(data, split)
    return folder if split == "train" or os.path.isdir(folder) else train


def steady_copies(images: int, batch_size: int, warmup: int, batches: int,
                  at_least: int = 1) -> int:
    """Copies of ``images`` distinct images (at least ``at_least``) for one epoch to outlast the
    ``warmup`` and ``batches`` batches of ``batch_size`` and the prefetch (10% more): a pass's
    start (workers forked, the iterator's set-up) comes once per ImageNet epoch of thousands of
    batches, so a pass boundary among 100 timed batches would weigh it about 200 times."""
    return max(at_least, math.ceil(1.1 * (warmup + batches) * batch_size / max(1, images)))


def replicate(src: str, dst: str, copies: int, keep: Callable[[str], bool] | None = None) -> str:
    """``dst/{train,val}/<class>/`` with ``copies`` symlinks (``NAME_K.EXT``) per image of
    ``src`` (:func:`split_folder`), so that an epoch of a small sample outlasts the timed
    batches; ``keep(abspath)`` filters files, while every class folder is made. Returns ``dst``."""
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
    """Read every file under ``root`` once, so that no timed pipeline pays the first disk read."""
    for folder, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                while f.read(1 << 20):
                    pass


@contextlib.contextmanager
def scratch(prefix: str, dir: str | None = None) -> Iterator[str]:
    """A new temporary folder (under ``dir``), removed with its contents however the block ends."""
    path = tempfile.mkdtemp(prefix=prefix, dir=dir)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def markdown_table(header: list[str], rows: Iterable[list[str]]) -> str:
    """A Markdown table of formatted cells, as the docs quote it."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def write_json(path: str, report: dict, indent: int = 1) -> None:
    """Write ``report`` to the file ``path`` as JSON."""
    with open(path, "w") as f:
        json.dump(report, f, indent=indent)


def error(prog: str, message: object) -> int:
    """Print ``PROG: error: MESSAGE`` on stderr; returns 1, the exit status of a failed run."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 1
