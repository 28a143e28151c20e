"""FFCV 1.0.2 beside ``main.py --benchmark-data`` on the same stored bytes, interleaved, in one run.

``--data``'s train images are stored as ``lmdb`` (the original JPEGs), ``lmdb-512``
(``--max-side 512 --quality 90``, FFCV's cap), ``beton-512`` (exactly ``lmdb-512``'s bytes),
``beton-example`` (FFCV's ImageNet example's writer: half the images raw pixels),
``lmdb-512-raw-B`` (``--raw-budget``, docs/raw-share.md) and ``lmdb-512-reencoded[-raw-B]``
(``--reencode-all``: lossy like FFCV's example store). Each interleaved round times every crop
size and store in a fresh process (ours: ``main.py --lmdb --benchmark-data``; FFCV's: ``side.py
time``). Prints median images/s with spreads, the ratios, each store's disk and raw share, and
writes ``OUT/report.json`` (``OUT/<bucket>/`` per bucket with ``--buckets``).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

from benchmarks import runner
from benchmarks.ffcv.table import STORES, print_table
from benchmarks.runner import REPO

PROG = "benchmarks.ffcv"  # python -m benchmarks.ffcv
# FFCV's side runs by path with the side environment's Python: it imports nothing of ours
SIDE = os.path.join(REPO, "benchmarks", "ffcv", "side.py")
RAW_BUDGETS = ("1.5x", "2.7x")
REENCODED_BUDGETS = ("jpeg", "2.7x")  # "jpeg": no raw share
# longer side in pixels: (lowest excluded, highest included), three size buckets
BUCKETS = {"le256": (0, 256), "256-512": (256, 512), "gt512": (512, 1 << 30)}


def raw_store(budget: str) -> str:
    """The row name of the raw-share store at ``budget``, e.g. ``lmdb-512-raw-2.7x``."""
    return f"lmdb-512-raw-{budget}"


def reencoded_store(budget: str) -> str:
    """The row name of a ``--reencode-all`` store: ``lmdb-512-reencoded`` (``budget``
    ``"jpeg"``: JPEG only) or e.g. ``lmdb-512-reencoded-raw-2.7x``."""
    return "lmdb-512-reencoded" + ("" if budget == "jpeg" else f"-raw-{budget}")


def stores(args) -> tuple[str, ...]:
    """Every store timed: :data:`STORES`, one raw-share store per ``--raw-budgets`` and one
    ``--reencode-all`` store per ``--reencoded-budgets``."""
    return (STORES + tuple(raw_store(b) for b in args.raw_budgets)
            + tuple(reencoded_store(b) for b in args.reencoded_budgets))


def _disk(path: str) -> int:
    """Bytes on disk (allocated blocks) of a file, or of every file under a folder."""
    if os.path.isfile(path):
        return os.stat(path).st_blocks * 512
    return sum(os.stat(os.path.join(d, f)).st_blocks * 512
               for d, _, fs in os.walk(path) for f in fs)


def _lmdb_images(db: str) -> tuple[int, int]:
    """``(records, image bytes)`` of an LMDB written by folder2lmdb.py."""
    from formats.lmdb import decode_record, open_readonly, read_meta, record_key

    meta = read_meta(db)
    with open_readonly(db).begin() as txn:
        total = sum(len(decode_record(txn.get(record_key(i)))[0]) for i in range(meta.count))
    return meta.count, total


def _export(db: str, folder: str) -> str:
    """Each record of ``db`` as ``folder/<index>.jpg`` (its stored bytes), and a
    ``label<TAB>path`` list of them for ``side.py write``; returns the list's path."""
    from formats.lmdb import decode_record, open_readonly, read_meta, record_key

    os.makedirs(folder, exist_ok=True)
    lines = []
    with open_readonly(db).begin() as txn:
        for i in range(read_meta(db).count):
            data, label = decode_record(txn.get(record_key(i)))
            path = os.path.join(folder, f"{i}.jpg")
            with open(path, "wb") as f:
                f.write(data)
            lines.append(f"{label}\t{path}\n")
    listing = folder + ".tsv"
    with open(listing, "w") as f:
        f.writelines(lines)
    return listing


def _listing(root: str, out: str) -> str:
    """``label<TAB>path`` of every file of an image folder, ImageFolder's order and labels."""
    from formats.sources import list_sources

    with open(out, "w") as f:
        f.writelines(f"{s.label}\t{s.path}\n" for s in list_sources(root).files)
    return out


def longer_side_over(side: int, up_to: int | None = None):
    """A :func:`benchmarks.runner.replicate` filter: True for an image whose longer side (from
    its header) exceeds ``side`` px and, with ``up_to``, is at most that; a file that is not an
    image is left out with one stderr line."""
    from PIL import Image

    def keep(path: str) -> bool:
        try:
            with Image.open(path) as image:
                longer = max(image.size)
        except OSError as exc:
            print(f"{PROG}: skipping {path}: {exc}", file=sys.stderr)
            return False
        return longer > side and (up_to is None or longer <= up_to)

    return keep


def _filter(args):
    """The replicate filter of ``--bucket`` or ``--larger-than`` (None: every image)."""
    if args.bucket and args.bucket != "all":
        return longer_side_over(*BUCKETS[args.bucket])
    return longer_side_over(args.larger_than) if args.larger_than else None


def _raw_choice(db: str) -> dict:
    """What a raw-share LMDB's metadata says was chosen (formats.raw_share.RawChoice.state)."""
    from formats.lmdb import read_meta

    return read_meta(db).raw


def prepare(args, tmp: str) -> dict[str, str]:
    """Write the stores under ``tmp``; returns ``{store: path}``."""
    import folder2lmdb
    from formats.cap import Cap
    from formats.raw_share import parse_budget

    data = runner.replicate(args.data, os.path.join(tmp, "jpeg"), args.repeat, _filter(args))
    found = sum(len(files) for _, _, files in os.walk(os.path.join(data, "train")))
    which = f"--bucket {args.bucket}" if args.bucket else f"--larger-than {args.larger_than}"
    if not found:
        raise RuntimeError(f"no training image of {args.data} to time ({which})")
    if found < args.min_images * args.repeat:
        raise RuntimeError(f"{found // args.repeat} training images of {args.data} ({which}), "
                           f"fewer than --min-images {args.min_images}")
    args.effective_repeat = runner.steady_copies(found // args.repeat, args.batch_size,
                                                 args.warmup, args.batches, args.repeat)
    if args.effective_repeat != args.repeat:
        data = runner.replicate(args.data, os.path.join(tmp, f"jpeg-x{args.effective_repeat}"),
                                args.effective_repeat, _filter(args))
    paths = {"lmdb": os.path.join(tmp, "lmdb"), "lmdb-512": os.path.join(tmp, "lmdb-512"),
             "beton-512": os.path.join(tmp, "same-512.beton"),
             "beton-example": os.path.join(tmp, "example.beton")}
    lmdbs = [("lmdb", None, None), ("lmdb-512", Cap(512, 90), None)]
    for budget in args.raw_budgets:
        lmdbs.append((raw_store(budget), Cap(512, 90), parse_budget(budget)))
    for budget in args.reencoded_budgets:
        lmdbs.append((reencoded_store(budget), Cap(512, 90, every=True),
                      None if budget == "jpeg" else parse_budget(budget)))
    for store, _, _ in lmdbs[2:]:
        paths[store] = os.path.join(tmp, store)
    for store, cap, raw in lmdbs:
        for split in ("train", "val"):
            folder2lmdb.convert(os.path.join(data, split), os.path.join(paths[store], split),
                                progress=False, shuffle_seed=0, cap=cap, workers=args.workers,
                                raw_budget=raw)
    capped = _export(os.path.join(paths["lmdb-512"], "train"), os.path.join(tmp, "capped"))
    originals = _listing(os.path.join(data, "train"), os.path.join(tmp, "originals.tsv"))
    for store, listing, mode in (("beton-512", capped, "same-bytes"),
                                 ("beton-example", originals, "example")):
        subprocess.run([args.ffcv_python, SIDE, "write", "--list", listing, "--out",
                        paths[store], "--mode", mode, "-j", str(args.workers)], check=True,
                       cwd=REPO)
    for path in paths.values():
        runner.warm_page_cache(path if os.path.isdir(path) else os.path.dirname(path))
    return paths


def commands(args, paths: dict[str, str], size: int) -> dict[str, list[str]]:
    """Each store's timing command at crop ``size`` (with ``--base``, also the LMDBs through
    that checkout's ``main.py``, e.g. the code before a change)."""
    timing = ["-b", str(args.batch_size), "-j", str(args.workers)]
    ours = [sys.executable, os.path.join(REPO, "main.py"), *timing, "--train-crop-size",
            str(size), "--train-batches", str(args.batches), "--benchmark-warmup",
            str(args.warmup), "--seed", "0", "--benchmark-data", "--lmdb"]
    ffcv = [args.ffcv_python, SIDE, "time", *timing, "--size", str(size), "--batches",
            str(args.batches), "--warmup", str(args.warmup), "--beton"]
    cmds = {store: [*(ffcv if store.startswith("beton") else ours), paths[store]]
            for store in paths}
    if args.base:
        base = [ours[0], os.path.join(os.path.abspath(args.base), "main.py"), *ours[2:]]
        cmds.update({"lmdb@base": [*base, paths["lmdb"]],
                     "lmdb-512@base": [*base, paths["lmdb-512"]]})
    return cmds


def measure(args, paths: dict[str, str]) -> dict:
    """``{size: {store: [images/s per round]}}``, rounds interleaved over sizes and stores."""
    timed = set(getattr(args, "stores", None) or ()) or None
    cmds = {(size, store): cmd for size in args.sizes
            for store, cmd in commands(args, paths, size).items()
            if timed is None or store.split("@")[0] in timed}

    def speed(key: tuple[int, str]) -> float:
        size, store = key
        return runner.run_json_process(f"{store} {size}px", cmds[key],
                                       args.timeout)["images_per_sec"]

    def progress(round_: int, key: tuple[int, str], images_per_sec: float) -> None:
        print(f"round {round_ + 1}: {key[0]} px {key[1]:>14} {images_per_sec:8.1f} images/s",
              flush=True)

    runs = runner.interleave(cmds, speed, args.rounds, on_result=progress)
    return {size: {store: runs[(size, store)] for s, store in cmds if s == size}
            for size in args.sizes}


def report(args, paths: dict[str, str], runs: dict, tmp: str) -> dict:
    """Medians, ratios, disk per store and the commands (temporary paths as names)."""
    from engine.settings import node_cores  # torch's import: only once the rounds are done

    med = {size: {s: runner.median_high(v) for s, v in by.items()} for size, by in runs.items()}
    # a round runs each store once, back to back: their ratio sees the same machine load
    per_round = {size: [ours / ffcv for ours, ffcv in zip(by.get("lmdb-512", []),
                                                           by.get("beton-512", []))]
                 for size, by in runs.items()}
    count = _lmdb_images(os.path.join(paths["lmdb"], "train"))[0]
    disk = {store: _disk(os.path.join(path, "train") if store.startswith("lmdb") else path)
            for store, path in paths.items()}
    images = {store: _lmdb_images(os.path.join(paths[store], "train"))[1]
              for store in paths if store.startswith("lmdb")}
    raw = {store: _raw_choice(os.path.join(paths[store], "train"))
           for store in paths if "-raw-" in store}
    # per round, each store against FFCV's example store timed in the same round
    vs_example = {size: {store: [ours / ffcv for ours, ffcv in zip(v, by.get("beton-example",
                                                                              []))]
                         for store, v in by.items() if store.startswith("lmdb")}
                  for size, by in runs.items()}
    shown = {store: " ".join(a.replace(tmp, "TMP").replace(REPO + os.sep, "") for a in cmd[1:])
             for store, cmd in commands(args, paths, 224).items()}
    repeat = getattr(args, "effective_repeat", args.repeat)
    return {"images": count, "repeat": repeat, "rounds": args.rounds, "runs": runs,
            "image_set": {"data": os.path.abspath(getattr(args, "data", "?")),
                          "bucket": getattr(args, "bucket", None) or "all",
                          "larger_than": getattr(args, "larger_than", None),
                          "repeat": repeat},
            "median": med, "same_bytes_ratio_per_round": per_round,
            "vs_example_per_round": vs_example, "disk_bytes": disk,
            "image_bytes": images, "raw": raw, "commands_224": shown,
            "config": {"batch_size": args.batch_size, "workers": args.workers,
                       "batches": args.batches, "warmup": args.warmup,
                       "cpu_count": node_cores()}}


def main(argv=None) -> int:
    """Command line: 0 when the report is written, 1 with one ``error:`` line otherwise."""
    parser = argparse.ArgumentParser(prog=f"python -m {PROG}",
                                     description=__doc__.splitlines()[0])
    runner.add_data_option(parser, "ImageNet-layout folder (train/<wnid>/*.JPEG)")
    parser.add_argument("--ffcv-python", default=os.path.join(REPO, ".ffcv", "bin", "python"))
    runner.add_out_option(parser, "report.json goes here",
                          default=os.path.join("bench-output", "ffcv"))
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--larger-than", type=int, metavar="PX",
                        help="only the images whose longer side exceeds PX (those a cap changes)")
    parser.add_argument("--bucket", choices=["all", *BUCKETS],
                        help="only the images of one bucket of longer side: le256 (<= 256 px), "
                             "256-512, gt512 (> 512 px)")
    parser.add_argument("--buckets", action="store_true",
                        help="run the comparison for each bucket, then for all images")
    parser.add_argument("--min-images", type=int, default=1,
                        help="a bucket with fewer source images is reported, not timed")
    parser.add_argument("--stores", nargs="+", metavar="STORE",
                        help="time only these stores (default: all; each table needs lmdb, "
                             "lmdb-512, beton-512 and beton-example)")
    parser.add_argument("--raw-budgets", nargs="*", default=list(RAW_BUDGETS), metavar="B",
                        help="raw-share stores to time, by --raw-budget (default: 1.5x 2.7x)")
    parser.add_argument("--reencoded-budgets", nargs="*", default=list(REENCODED_BUDGETS),
                        metavar="B", help="--reencode-all stores to time: jpeg (JPEG only) or a "
                                          "--raw-budget (default: jpeg 2.7x)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[160, 192, 224])
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("-j", "--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20)
    runner.add_rounds_option(parser, 3)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--base", metavar="DIR",
                        help="also time the LMDBs through DIR/main.py (a checkout of other code)")
    args = parser.parse_args(argv)
    if not os.access(args.ffcv_python, os.X_OK):
        return runner.error(PROG, f"{args.ffcv_python}: no FFCV environment "
                            "(make bench-ffcv creates it)")
    for split in ("train", "val"):
        if not os.path.isdir(os.path.join(args.data, split)):
            return runner.error(PROG, f"{os.path.join(args.data, split)}: no such "
                                "folder (--data holds train/ and val/ class folders)")
    buckets = [*BUCKETS, "all"] if args.buckets else [args.bucket]
    for bucket in buckets:
        args.bucket = bucket
        out = os.path.join(args.out, bucket) if args.buckets else args.out
        try:
            rep = _run(args)
        except RuntimeError as exc:
            if not args.buckets:
                return runner.error(PROG, exc)
            print(f"\nbucket {bucket}: not timed ({exc})", flush=True)
            continue
        os.makedirs(out, exist_ok=True)
        runner.write_json(os.path.join(out, "report.json"), rep, indent=2)
        print_table(rep)
        print(f"\nwrote {out}/report.json")
    return 0


def _run(args) -> dict:
    """One comparison: the stores written, timed and reported. Raises RuntimeError."""
    from formats.conversion import ConversionError

    try:
        with runner.scratch("bench-ffcv-") as tmp:
            paths = prepare(args, tmp)
            return report(args, paths, measure(args, paths), tmp)
    except (ConversionError, subprocess.CalledProcessError) as exc:
        raise RuntimeError(str(exc)) from None
