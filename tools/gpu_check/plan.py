"""The check's one row list in priority order (:data:`TABLE`), what each row runs and its
expected seconds on a GPU host, by which a time budget decides what fits. Groups: 0 set-up,
1 decode probes, 2 synthetic denominators, 3 ``--decode-device cuda``, 4 the CPU loaders at
every core and one less, 5 DALI, 6 extras (GPU tests, NCCL, ``--compile``, DALI's memory),
7 sweeps, other loaders, ResNet-18; a bundle's step 1 runs 1-4."""
import glob
import os
import pathlib
import re
from dataclasses import dataclass
from fnmatch import fnmatch

from .rows import measure, probes
from .rows.measure import GPU, GPU_HOST, jobs, steady_sizes, workers_count
from .runner import REPO

# Measured on one H100 host (16 cores): ResNet-50 and ResNet-18 on synthetic data (224 and 160
# px), the CPU loaders with 8 workers (every loader's floor); assumed: one CPU decode thread
# (~2 ms per image), a process's start, its CUDA context and cuDNN's tuning (a loader alone
# tunes nothing).
RATES = {("resnet50", False): 4909.0, ("resnet50", True): 7987.0,
         ("resnet18", False): 14776.0, ("resnet18", True): 14776.0}
LOADER_RATE, ONE_THREAD_RATE = 2900.0, 500.0
PROCESS_START, CUDA_START, CUDA_START_ALONE = 5.0, 10.0, 3.0
PAIR_STEPS = 10  # timed batches of each one-worker row of a GPU/CPU pair: a ratio, not a figure
# Each one-worker pair: the CPU row, then the GPU row it judges: decoding on the GPU must beat
# the CPU by GPU_OVER_CPU (not judged dry, where the CPU decodes both times)
GPU_OVER_CPU = 1.5
PAIRS = {"loader-dali-cpu-j1": ("loader-dali-mixed-j1", "GPU decode only {ratio:.2f}x the CPU "
                                "decode with one thread: did nvJPEG decode?"),
         "loader-gpudecode-cpu-j1": ("loader-gpudecode-cuda-j1", "batch decode only "
                                     "{ratio:.2f}x the CPU loaders with one worker: did the GPU "
                                     "decode?")}
PX = ("", "-160px")  # a 224 px row and a 160 px one
GD, DL = "gpudecode-lmdb", "dali-lmdb"
# Every row in priority order: name, group, kind, loader, -j, options. ``{x}`` in a name,
# loader, -j, bound and extra flags stands for each of ``each``; ``pytest-*`` for each
# GPU-marked test file. A name says its model (resnet18), 160 px and ``--compile``; a ``plain``
# row names its box (s), its expected seconds on one H100 host and what it runs.
TABLE = [
    ("gpu-decode-probe", 1, "plain", None, None, {"plain": (120, 12, probes.probe)}),
    ("gpu-decode-hardware", 1, "plain", None, None, {"plain": (60, 5, probes.hardware)}),
    ("train-resnet50-synthetic{x}", 2, "train", "synthetic", "all", {"each": PX}),
    ("loader-gpudecode-j4{x}", 3, "alone", GD, "4", {"each": PX}),
    ("train-resnet50-gpudecode-lmdb{x}", 3, "train", GD, "4",
     {"each": PX, "bound": "loader-gpudecode-j4{x}"}),
    ("loader-lmdb-j{x}", 4, "alone", "lmdb", "{x}", {"each": ("all", "less")}),
    ("train-resnet50-lmdb-j{x}", 4, "train", "lmdb", "{x}",
     {"each": ("all", "less"), "bound": "loader-lmdb-j{x}"}),
    ("dali-gpu-decode", 5, "plain", DL, None, {"plain": (60, 10, probes.dali_probe)}),
    ("loader-dali-mixed-j1", 5, "alone", DL, "1", {}),
    ("loader-dali-cpu-j1", 5, "alone", DL, "1", {"extra": ("--dali-cpu",)}),
    ("loader-dali-lmdb", 5, "alone", DL, "all", {}),
    ("train-resnet50-dali-lmdb", 5, "train", DL, "all", {"bound": "loader-dali-lmdb"}),
    ("loader-dali-lmdb-160px", 5, "alone", DL, "all", {}),
    ("train-resnet50-dali-lmdb-160px", 5, "train", DL, "all",
     {"bound": "loader-dali-lmdb-160px"}),
    ("pytest-*", 6, "plain", None, None, {"plain": (600, 120, measure.pytest_piece)}),
    ("distributed", 6, "plain", None, None, {"plain": (240, 40, measure.nccl_row)}),
    ("train-resnet50-{x}-compile", 6, "train", "{x}", "all", {"each": ("synthetic", "best")}),
    ("dali-memory", 6, "plain", DL, None, {"plain": (300, 60, measure.memory_row)}),
    ("loader-gpudecode-cuda-j1", 7, "alone", GD, "1", {}),
    ("loader-gpudecode-cpu-j1", 7, "alone", "lmdb", "1", {}),
    ("loader-gpudecode-hw{x}", 7, "alone", GD, "4", {"each": ("0.0", "0.65", "0.9", "1.0"),
     "extra": ("--hw-decoder-load", "{x}"), "gpu_only": True}),
    ("loader-gpudecode-j{x}", 7, "alone", GD, "{x}", {"each": ("2", "8", "15"),
                                                      "gpu_only": True}),
    ("loader-lmdb-cpu-j8", 7, "alone", "lmdb", "8", {"gpu_only": True}),
    ("train-resnet50-gpudecode-lmdb-jall{x}", 7, "train", GD, "all",
     {"each": PX, "bound": "loader-gpudecode-j4{x}", "gpu_only": True}),
    ("loader-folder", 7, "alone", "folder", "all", {}),
    ("loader-folder-jless", 7, "alone", "folder", "less", {}),
    ("loader-dali", 7, "alone", "dali", "all", {}),
    ("train-resnet50-{x}", 7, "train", "{x}", "all", {"each": ("folder", "dali"),
                                                     "bound": "loader-{x}"}),
    ("loader-dali-hw{x}", 7, "alone", DL, "all", {"each": ("0.65", "0.9", "1.0"),
     "extra": ("--dali-hw-decoder-load", "{x}"), "gpu_only": True}),
    ("loader-dali-j{x}", 7, "alone", DL, "{x}", {"each": ("2", "4", "8", "15"),
                                                 "gpu_only": True}),
    ("train-resnet50-best-160px", 7, "train", "best", "all", {}),
    ("train-resnet18-synthetic{x}", 7, "train", "synthetic", "all", {"each": PX}),
    ("train-resnet18-gpudecode-lmdb{x}", 7, "train", GD, "4",
     {"each": PX, "bound": "loader-gpudecode-j4{x}"}),
    ("train-resnet18-folder", 7, "train", "folder", "all", {"bound": "loader-folder"}),
    ("train-resnet18-lmdb-jall", 7, "train", "lmdb", "all", {"bound": "loader-lmdb-jall"}),
    ("train-resnet18-dali", 7, "train", "dali", "all", {"bound": "loader-dali"}),
    ("train-resnet18-dali-lmdb{x}", 7, "train", DL, "all",
     {"each": PX, "bound": "loader-dali-lmdb{x}"}),
    ("train-resnet18-{x}-compile", 7, "train", "{x}", "all", {"each": ("synthetic", "best")}),
]


@dataclass(frozen=True)
class Row:
    """One row. ``kind``: ``train`` (a main.py training epoch from ``loader``), ``alone`` (the
    loader alone, ``--benchmark-data``) or ``plain`` (``plain``: box, seconds, its function).
    ``workers``: ``all`` (``-j``), ``less`` (every core but one) or a number; ``bound``: the
    loader-alone row capping a training row's share; ``gpu_only``: a sweep a dry run leaves out."""

    name: str
    group: int
    kind: str
    loader: str | None
    workers: str | None
    bound: str | None = None
    extra: tuple = ()
    gpu_only: bool = False
    plain: tuple = ()

    model = property(lambda self: "resnet18" if "-resnet18-" in self.name else "resnet50")
    res = property(lambda self: self.name.endswith("-160px"))
    compiled = property(lambda self: self.name.endswith("-compile"))
    dali = property(lambda self: (self.loader or "").startswith("dali"))
    timed = property(lambda self: PAIR_STEPS if self.name in PAIRS or self.name in [
        gpu for gpu, _ in PAIRS.values()] else None)
    cuda_start = property(lambda self: CUDA_START_ALONE if self.kind == "alone" else CUDA_START)

    box = property(lambda self: self.plain[0] if self.plain else 420 if self.compiled else 150
                   if self.kind == "train" and self.loader != "synthetic" else 120)  # s at most

    def gpu_batch_seconds(self) -> float:
        """Seconds of this row's batches on one H100 host: at :data:`RATES`, else the slower
        of it and the loaders' (one thread's for a pair's CPU row)."""
        workers = workers_count(jobs(self.workers, GPU, GPU_HOST), GPU_HOST)
        batches = sum(steady_sizes(GPU, self.loader, workers, self.kind == "alone", self.timed))
        rate = RATES[self.model, self.res]
        if self.name in PAIRS:
            rate = ONE_THREAD_RATE
        elif self.kind == "alone" or self.loader != "synthetic":
            rate = min(rate, LOADER_RATE)
        return batches * GPU.batch / rate

    @property
    def expect(self) -> float:
        """Seconds this row should take on one H100 host: its process and CUDA start, then its
        batches (a cold ``torch.compile``: 150 s for ResNet-50, 100 for ResNet-18)."""
        if self.kind == "plain":
            return self.plain[1]
        if self.compiled:
            return 150.0 if self.model == "resnet50" else 100.0
        return PROCESS_START + self.cuda_start + self.gpu_batch_seconds()


def all_rows() -> list[Row]:
    """Every row of :data:`TABLE` in priority order (the set-up apart)."""
    rows, marked = [], re.compile(r"^\s*(pytestmark\s*=\s*pytest\.mark\.gpu|@pytest\.mark\.gpu)",
                                  re.M)
    for name, group, kind, loader, workers, opts in TABLE:
        if name == "pytest-*":  # each test file with gpu-marked tests
            rows += [Row("pytest-" + os.path.splitext(os.path.basename(p))[0], group, kind,
                         None, None, extra=(os.path.relpath(p, REPO),), plain=opts["plain"])
                     for p in sorted(glob.glob(os.path.join(REPO, "tests", "**", "test_*.py"),
                                               recursive=True))
                     if marked.search(pathlib.Path(p).read_text(errors="replace"))]
            continue
        for x in opts.get("each", ("",)):
            sub = lambda text: text and text.replace("{x}", x)  # noqa: E731
            rows.append(Row(sub(name), group, kind, sub(loader), sub(workers), sub(opts.get(
                "bound")), tuple(map(sub, opts.get("extra", ()))), opts.get("gpu_only", False),
                            opts.get("plain", ())))
    return rows


def select(patterns: list[str] | None, dry_run: bool) -> tuple[list[Row], list[Row]]:
    """The rows whose names match one of ``patterns`` (``fnmatch``; None: all), in order, less
    the sweeps a dry run leaves out: those of a bundle's step 1 (groups 1-4, nothing of DALI),
    and of its last step. Raises ``ValueError`` naming a pattern that matches none."""
    rows = all_rows()
    for pattern in patterns or ():
        if not any(fnmatch(r.name, pattern) for r in rows):
            raise ValueError(f"--rows {pattern}: no row matches (the rows: "
                             f"{', '.join(r.name for r in rows)})")
    rows = [r for r in rows if (patterns is None or any(fnmatch(r.name, p) for p in patterns))
            and not (dry_run and r.gpu_only)]
    return [r for r in rows if r.group <= 4], [r for r in rows if r.group > 4]


def gpu_seconds(row: Row | None, record: dict, dry_run: bool) -> float:
    """Seconds a record (``row`` None: set-up) takes on one H100 host: ``seconds``; dry, its
    ``cpu_seconds`` (wall seconds wait for shared cores) plus a main.py row's CUDA start and
    batches, or the set-up's ``bytes`` at 200 MB/s (data) or 10 MB/s (pip)."""
    if not dry_run:
        return float(record.get("seconds") or 0.0)
    work = float(record.get("cpu_seconds") if record.get("cpu_seconds") is not None
                 else record.get("seconds") or 0.0)
    if row is not None and row.kind != "plain" and record.get("status") != "skipped":
        return work + row.cuda_start + row.gpu_batch_seconds()
    rate = 200e6 if record.get("name") == "data" else 10e6
    return work + float(record.get("bytes") or 0) / rate
