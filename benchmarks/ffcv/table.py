"""The tables ``benchmarks/ffcv/compare.py`` prints from its report, as docs/ffcv-and-decode.md
and docs/raw-share.md quote them: medians over the interleaved rounds, each with its spread."""
from __future__ import annotations

from benchmarks import runner

# The four stores every comparison times (compare.stores adds the raw-share ones).
STORES = ("lmdb", "lmdb-512", "beton-512", "beton-example")


def spread(values: list[float], fmt: str = "{:.0f}") -> str:
    """``median [lowest-highest]`` of the rounds' values, e.g. ``1484 [1402-1530]``."""
    med = runner.median_high(values)
    if len(values) < 2:
        return fmt.format(med)
    return f"{fmt.format(med)} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def image_set(rep: dict) -> str:
    """The line naming the images timed: folder, bucket, copies, count, rounds."""
    its = rep.get("image_set", {})
    which = its.get("bucket", "all")
    which = "all images" if which == "all" else f"bucket {which} (longer side)"
    if its.get("larger_than"):
        which += f", longer side > {its['larger_than']} px"
    cfg = rep["config"]
    return (f"{rep['images']} train images ({rep['repeat']} x the {which} of "
            f"{its.get('data', '?')}), -b {cfg['batch_size']} -j {cfg['workers']}, "
            f"{cfg['cpu_count']} cores; median [lowest-highest] of {rep['rounds']} interleaved "
            "rounds, images/s")


def print_table(rep: dict) -> None:
    """Speeds and ratios per crop size (same bytes; then the raw-share stores against FFCV's
    example store; then ``--base`` against now, if timed), and the disk each store takes."""
    print(f"\n{image_set(rep)}\n")
    timed = set(next(iter(rep["runs"].values())))
    if set(STORES) <= timed:
        _same_bytes(rep)
    raw_stores = [s for s in timed if s.startswith("lmdb-512-")]  # raw or re-encoded
    if raw_stores and {"beton-example", "lmdb-512"} <= timed:
        _raw_table(rep, sorted(raw_stores))
    if any("lmdb@base" in m for m in rep["median"].values()):
        rows = [[f"{size} px", f"{m['lmdb@base']:.0f}", f"{m['lmdb']:.0f}",
                 f"{m['lmdb'] / m['lmdb@base']:.2f}x", f"{m['lmdb-512@base']:.0f}",
                 f"{m['lmdb-512']:.0f}", f"{m['lmdb-512'] / m['lmdb-512@base']:.2f}x"]
                for size, m in rep["median"].items()]
        print("\n" + runner.markdown_table(
            ["crop", "lmdb, base", "lmdb, now", "now/base", "lmdb-512, base", "lmdb-512, now",
             "now/base"], rows))
    print("\n" + runner.markdown_table(
        ["store", "disk (train)", "per 1,000 images", "vs lmdb-512", "raw images",
         "expected decode time saved"], _disk_rows(rep)))


def _same_bytes(rep: dict) -> None:
    """Ours against FFCV on the same bytes, and the capped store against the originals."""
    rows = []
    for size, runs in rep["runs"].items():
        m = rep["median"][size]
        rows.append([f"{size} px", spread(runs["beton-512"]), spread(runs["lmdb-512"]),
                     f"{m['lmdb-512'] / m['beton-512']:.2f}x",
                     spread(rep["same_bytes_ratio_per_round"][size], "{:.2f}x"),
                     spread(runs["lmdb"]), f"{m['lmdb-512'] / m['lmdb']:.2f}x",
                     spread(runs["beton-example"])])
    print(runner.markdown_table(
        ["crop", "FFCV, beton-512", "ours, lmdb-512 (same bytes)", "vs FFCV",
         "vs FFCV per round", "ours, lmdb (originals)", "lmdb-512 vs lmdb",
         "FFCV, beton-example (half raw)"], rows))


def _raw_table(rep: dict, raw_stores: list[str]) -> None:
    """The raw-share and ``--reencode-all`` stores (and lmdb-512) against FFCV's example store,
    per round."""
    rows = []
    for size, runs in rep["runs"].items():
        per_round = rep["vs_example_per_round"][size]
        rows.append([f"{size} px", spread(runs["beton-example"]), spread(runs["lmdb-512"]),
                     spread(per_round["lmdb-512"], "{:.2f}x")]
                    + [c for s in raw_stores
                       for c in (spread(runs[s]), spread(per_round[s], "{:.2f}x"))])
    print("\n" + runner.markdown_table(
        ["crop", "FFCV, beton-example", "ours, lmdb-512", "vs example (per round)"]
        + [c for s in raw_stores for c in (f"ours, {s}", "vs example (per round)")], rows))


def _disk_rows(rep: dict) -> list[list[str]]:
    n, disk, raw = rep["images"], rep["disk_bytes"], rep.get("raw", {})
    jpeg = disk.get("lmdb-512") or 1
    rows = []
    for store, size in disk.items():
        choice = raw.get(store)
        rows.append([store, f"{size / 2**20:.1f} MiB", f"{size / n * 1000 / 2**20:.1f} MiB",
                     f"{size / jpeg:.2f}x",
                     f"{choice['records']} ({choice['records'] / n:.0%})" if choice else "",
                     f"{choice['saved_s']:.2f} s per epoch" if choice else ""])
    rows += [[f"{store}, image bytes only", f"{size / 2**20:.1f} MiB",
              f"{size / n * 1000 / 2**20:.1f} MiB", "", "", ""]
             for store, size in rep["image_bytes"].items()]
    return rows
