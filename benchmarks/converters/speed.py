"""How fast does folder2lmdb.py convert, against decoding alone, and how much memory does it take?

Target: the converter at >= 75% of decode-only's images/s (:func:`speed`, on ``--data``
replicated ``--copies`` times). :func:`memory` gives the peak RSS per record and extrapolated
to ImageNet's 1,281,167 records.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks import runner
from benchmarks.runner import REPO

IMAGENET_TRAIN = 1_281_167
_MiB = 1 << 20
# Run from the repository's root: converts argv[1] to argv[2] with folder2lmdb.py's CLI, then
# prints its peak RSS in bytes (VmHWM; not ru_maxrss, which Linux carries across exec).
_CHILD = """
import sys
import folder2lmdb
status = folder2lmdb.main(["-d", sys.argv[1], "-o", sys.argv[2]] + sys.argv[3:])
with open("/proc/self/status") as f:
    kib = [int(line.split()[1]) for line in f if line.startswith("VmHWM:")][0]
print("PEAK_RSS", kib * 1024)
sys.exit(status)
"""


def replicate(source: str, target: str, copies: int) -> int:
    """Fill ``target`` with ``copies`` symlinks (``name_K.ext``) to every file of ``source``'s
    class folders; returns the number of links. Raises ``DatasetError`` for a bad folder."""
    from formats.sources import list_sources

    listing = list_sources(source)
    for name in listing.classes:
        os.makedirs(os.path.join(target, name), exist_ok=True)
    for src in listing.files:
        stem, ext = os.path.splitext(src.rel)
        for k in range(copies):
            os.symlink(os.path.realpath(src.path), os.path.join(target, f"{stem}_{k}{ext}"))
    return len(listing.files) * copies


def decode_only(files: list[str], workers: int, luma: bool = False) -> float:
    """Seconds to read and decode ``files`` (``decode.libraries.decode_jpeg``, RGB; ``luma``:
    ``decode_jpeg_luma``) in ``workers`` threads."""
    from decode.libraries import decode_jpeg, decode_jpeg_luma

    decode = decode_jpeg_luma if luma else decode_jpeg

    def one(path: str) -> None:
        with open(path, "rb") as f:
            decode(f.read())

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for _ in pool.map(one, files):
            pass
    return time.perf_counter() - start


def convert_once(data: str, output: str, check: str) -> tuple[int, float]:
    """``folder2lmdb.convert`` with its defaults under ``check``: (records, seconds)."""
    import folder2lmdb

    summary = folder2lmdb.convert(data, output, overwrite=True, progress=False, check=check)
    return summary.images, summary.seconds


def speed(opts: argparse.Namespace, data: str, out_root: str) -> dict:
    """Interleaved rounds of ``decode-only`` (the loaders' RGB decode in as many threads as the
    converter uses), ``decode-only, luma`` (``--check full``'s decode: the most the converter
    could do) and ``folder2lmdb.convert``'s own time for each of ``--checks``; medians in
    images/s, per core and as a share of decode-only."""
    from engine.settings import node_cores

    import inspect

    import folder2lmdb
    from formats.sources import list_sources

    files = [src.path for src in list_sources(data).files]
    workers = inspect.signature(folder2lmdb.convert).parameters["workers"].default
    checks = {f"convert --check {c}": c for c in opts.checks}

    def rate(name: str) -> float:
        if name in checks:
            images, seconds = convert_once(data, os.path.join(out_root, "lmdb"), checks[name])
            return images / seconds
        return len(files) / decode_only(files, workers, luma=name.endswith("luma"))

    def progress(round_: int, rates: dict[str, list[float]]) -> None:
        print(f"round {round_ + 1}/{opts.rounds}: " + ", ".join(
            f"{name} {values[-1]:.0f}" for name, values in rates.items()) + " images/s",
            flush=True)

    rates = runner.interleave(["decode-only", "decode-only, luma", *checks], rate, opts.rounds,
                              on_round=progress)
    decode = runner.median(rates["decode-only"])
    results = [{"name": name, "images_per_sec": runner.median(values),
                "per_core": runner.median(values) / node_cores(),
                "share_of_decode_only": runner.median(values) / decode, "rounds": values}
               for name, values in rates.items()]
    return {"files": len(files), "workers": workers, "cores": node_cores(), "results": results}


def write_tiny_folder(root: str, count: int, classes: int = 1000) -> None:
    """``count`` copies of one tiny JPEG in ``classes`` folders ``n%08d``, named like ImageNet's
    files; file ``i`` in class ``i * classes // count``."""
    from benchmarks.loading.memory import tiny_jpeg

    jpeg = tiny_jpeg()
    for c in range(classes):
        os.makedirs(os.path.join(root, "n%08d" % c), exist_ok=True)
    for i in range(count):
        wnid = "n%08d" % (i * classes // count)
        with open(os.path.join(root, wnid, f"{wnid}_{i}.JPEG"), "wb") as f:
            f.write(jpeg)


def peak_rss(data: str, output: str, extra: list[str]) -> int:
    """Peak RSS in bytes of a fresh ``folder2lmdb.py -d data -o output`` process.
    Raises RuntimeError with its last error line if it fails."""
    done = subprocess.run([sys.executable, "-c", _CHILD, data, output, *extra],
                          capture_output=True, text=True, cwd=REPO)
    lines = [line for line in done.stdout.splitlines() if line.startswith("PEAK_RSS")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"folder2lmdb.py failed on {data}: {tail}")
    return int(lines[-1].split()[1])


def memory(opts: argparse.Namespace) -> dict:
    """Peak RSS of a fresh ``folder2lmdb.py`` converting each of ``--memory-records`` tiny
    images on a tmpfs (what grows is the listing and checksum list); growth per record."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    runs = []
    for count in opts.memory_records:
        with runner.scratch("bench_convert_", dir=shm) as root:
            start = time.perf_counter()
            write_tiny_folder(os.path.join(root, "train"), count)
            written = time.perf_counter() - start
            start = time.perf_counter()
            peak = peak_rss(os.path.join(root, "train"), os.path.join(root, "lmdb"), [])
            runs.append({"records": count, "peak_rss": peak, "tmpfs": shm is not None,
                         "write_seconds": written, "convert_seconds": time.perf_counter() - start})
        print(f"memory: {count} tiny images: peak RSS {peak / _MiB:.0f} MiB "
              f"(converted in {runs[-1]['convert_seconds']:.0f} s)", flush=True)
    report = {"runs": runs}
    if len(runs) >= 2 and runs[-1]["records"] > runs[0]["records"]:
        slope = ((runs[-1]["peak_rss"] - runs[0]["peak_rss"])
                 / (runs[-1]["records"] - runs[0]["records"]))
        report["bytes_per_record"] = slope
        report["peak_rss_imagenet"] = (runs[-1]["peak_rss"]
                                       + slope * (IMAGENET_TRAIN - runs[-1]["records"]))
        report["extrapolated"] = runs[-1]["records"] != IMAGENET_TRAIN
    return report


def print_report(report: dict) -> None:
    """The speed table and the memory lines, as docs/performance.md quotes them."""
    s = report["speed"]
    print(f"\n{s['files']} files, {s['workers']} threads, {s['cores']} cores; medians of "
          f"{report['rounds']} interleaved rounds")
    print(f"{'':24} {'images/s':>9} {'per core':>9} {'of decode-only':>15}")
    for r in s["results"]:
        print(f"{r['name']:24} {r['images_per_sec']:9.0f} {r['per_core']:9.0f} "
              f"{100 * r['share_of_decode_only']:14.0f}%")
    m = report.get("memory")
    if m and "bytes_per_record" in m:
        how = "extrapolated linearly" if m["extrapolated"] else "measured"
        print(f"memory: {m['bytes_per_record']:.0f} bytes of peak RSS per record; "
              f"{IMAGENET_TRAIN} records: {m['peak_rss_imagenet'] / _MiB:.0f} MiB peak RSS "
              f"({how})")


def get_args_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.converters.speed",
                                     description=__doc__.splitlines()[0])
    runner.add_data_option(parser, "folder of class folders, e.g. an ImageNet train/")
    parser.add_argument("--copies", type=int, default=8,
                        help="symlinks per file, so a round lasts seconds (default: 8)")
    runner.add_rounds_option(parser, 5)
    parser.add_argument("--checks", nargs="+", default=["full", "header"],
                        choices=["full", "header"], help="converter --check modes to time")
    parser.add_argument("--memory-records", type=int, nargs="*", default=[10_000, 200_000],
                        help="tiny-image counts for the memory figure (none: skip it)")
    parser.add_argument("--tmp", default=None, help="folder for the replicated data and the "
                        "LMDB (default: the system's temporary folder)")
    runner.add_out_option(parser, "also write the figures to this JSON file")
    return parser


def main_cli(argv=None) -> int:
    """Run the benchmark; 0 on success, 1 with one ``error:`` line on bad input."""
    opts = get_args_parser().parse_args(argv)
    if opts.rounds < 1 or opts.copies < 1:
        return runner.error("benchmarks.converters.speed",
                            "--rounds and --copies must be at least 1")
    from decode import retain_freed_memory
    from formats.sources import DatasetError

    retain_freed_memory()  # as folder2lmdb.py's command line does (folder2lmdb.run_cli)
    try:
        with runner.scratch("bench_convert_", dir=opts.tmp) as work:
            data = os.path.join(work, "data")
            replicate(opts.data, data, opts.copies)
            report = {"rounds": opts.rounds, "speed": speed(opts, data, work)}
            if opts.memory_records:
                report["memory"] = memory(opts)
    except (DatasetError, RuntimeError, OSError) as exc:
        return runner.error("benchmarks.converters.speed", exc)
    print_report(report)
    if opts.out:
        runner.write_json(opts.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main_cli())
