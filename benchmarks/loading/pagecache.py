"""Random vs block-shuffled LMDB read order, and the same records as WebDataset shards
(``shards``: ``loaders.readers.shards`` in its stream order), on data larger than the page cache.

For each case (:data:`CASES`) the page cache is dropped and a child process in a cgroup-v1
memory group limited to its imports plus ``--limit-mib`` (page cache included) reads
``--epochs`` epochs of raw records. Per epoch: records/s, record MB/s, MB read from disk
(``/proc/self/io``) and major page faults. Needs root for drop_caches and the cgroup; without
the cgroup it runs unlimited (then the database must exceed the free page cache).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks import runner

CGROUP_ROOT = "/sys/fs/cgroup/memory"
CASES = {  # name -> (order, readahead)
    "random": ("random", False),
    "random+ra": ("random", True),
    "block": ("block", False),
    "block+ra": ("block", True),
    "shards": ("shards", False),  # the same records as WebDataset shards, StreamTrainOrder
}


def build_db(path: str, gib: float, sample: str) -> int:
    """Write an LMDB of about ``gib`` GiB at ``path`` from the JPEGs under ``sample/train``
    (cycled; labels from their folders). Returns the record count."""
    import lmdb

    from formats.sources import list_sources
    from formats.lmdb import META_KEY, Metadata, encode_meta, encode_record, record_key

    listing = list_sources(os.path.join(sample, "train"))
    classes = listing.classes
    files = [(open(src.path, "rb").read(), src.label) for src in listing.files]
    mean = sum(len(data) for data, _ in files) / len(files)
    count = int(gib * (1 << 30) / mean)
    env = lmdb.open(path, map_size=int(gib * (1 << 30) * 1.5) + (64 << 20), readahead=False,
                    meminit=False, sync=False, metasync=False)
    for first in range(0, count, 256):
        with env.begin(write=True) as txn:
            for i in range(first, min(count, first + 256)):
                data, label = files[i % len(files)]
                txn.put(record_key(i), encode_record(data, label), append=True)
    with env.begin(write=True) as txn:
        txn.put(META_KEY, encode_meta(Metadata(count=count, classes=tuple(classes))))
    env.sync(True)
    env.close()
    return count


def build_shards(db: str, out: str, shard_mib: int = 256) -> int:
    """Write the LMDB ``db``'s records, in record order, as WebDataset shards of about
    ``shard_mib`` MiB in ``out``; returns the shard count."""
    from formats.shards import ShardIndex, ShardWriter, idx_name, shard_name, write_idx
    from loaders.readers.lmdb_records import LMDBReader

    dataset, shards, writer, spans = LMDBReader(db), [], None, []
    os.makedirs(out, exist_ok=True)

    def finish():
        writer.close()
        write_idx(os.path.join(out, idx_name(writer.name)), spans)
        shards.append({"name": writer.name, "records": len(spans),
                       "bytes": os.path.getsize(writer.path)})

    for i in range(len(dataset)):
        if writer is None or writer.tell() > shard_mib << 20:
            if writer is not None:
                finish()
            name = shard_name("train", len(shards))
            writer, spans = ShardWriter(os.path.join(out, name)), []
            writer.name = name
        data, label = dataset.read(i)
        spans.append(writer.write(f"r/{i:09d}", data, label))
    finish()
    ShardIndex(list(dataset.classes), shards).write(out)
    dataset.env().close()  # a mapped file's pages survive drop_caches: unmap it
    return len(shards)


def drop_caches() -> bool:
    """Flush dirty pages and drop the page cache; False if not permitted (not root)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def make_cgroup(limit_mib: int) -> str | None:
    """A fresh cgroup-v1 memory group limited to ``limit_mib`` MiB, or None if unavailable."""
    path = os.path.join(CGROUP_ROOT, f"bench_pagecache_{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
        _write(path, "memory.limit_in_bytes", limit_mib << 20)
        return path
    except OSError as exc:
        print(f"cgroup unavailable ({exc}); running without a memory limit", file=sys.stderr)
        return None


def remove_cgroup(path: str | None) -> None:
    """Remove the group :func:`make_cgroup` made (nothing for None)."""
    if path:
        for _ in range(50):  # the child may take a moment to leave after it exits
            try:
                os.rmdir(path)
                return
            except OSError:
                time.sleep(0.1)


def run_case(args, name: str, cgroup: str | None) -> dict:
    """Case ``name`` in a fresh child process (this module's ``--child``) after dropping the
    page cache, inside ``cgroup`` when there is one; returns its JSON line. Raises
    RuntimeError with the child's stderr if it fails."""
    order, readahead = CASES[name]
    dropped = drop_caches()
    cmd = runner.module_command(
        "benchmarks.loading.pagecache", "--child", "--sample", args.sample, "--db", args.db,
        "--order", order, "--epochs", str(args.epochs),
        "--epoch-records", str(args.epoch_records), "--block-size", str(args.block_size),
        "--buffer-blocks", str(args.buffer_blocks))
    cmd += ["--readahead"] if readahead else []
    cmd += ["--cgroup", cgroup, "--limit-mib", str(args.limit_mib)] if cgroup else []
    cmd += ["--decode"] if args.decode else []
    cmd += ["--shards", args.db.rstrip("/") + "-shards"]

    def enter_cgroup():  # runs in the child before exec: everything it maps is charged there
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    if cgroup:  # no limit until the child has imported torch; it then sets its own
        _write(cgroup, "memory.limit_in_bytes", -1)
        _write(cgroup, "memory.max_usage_in_bytes", 0)
    out = subprocess.run(cmd, capture_output=True, text=True, check=False,
                         env=runner.module_env(), preexec_fn=enter_cgroup if cgroup else None)
    if out.returncode != 0:
        raise RuntimeError(f"{name}: child failed:\n{out.stderr}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result.update(case=name, caches_dropped=dropped)
    if cgroup:
        with open(os.path.join(cgroup, "memory.max_usage_in_bytes")) as f:
            result["cgroup_peak_mib"] = round(int(f.read()) / (1 << 20))
    return result


def _write(cgroup: str, name: str, value: int) -> None:
    with open(os.path.join(cgroup, name), "w") as f:
        f.write(str(value))


def child(args) -> None:
    """Read the epochs in this process and print one JSON line."""
    from loaders.orders import BlockOrder, RandomOrder
    from loaders.orders.streams import StreamTrainOrder
    from loaders.readers.lmdb_records import LMDBReader
    from loaders.readers.shards import SHUFFLE_BUFFER, ShardReader, resolve_split

    if args.order == "shards":  # read by offset (pread), one worker's piece, sample buffer
        dataset = ShardReader(*resolve_split(args.shards))
        order = StreamTrainOrder([s["records"] for s in dataset.index.shards], 1, 1, seed=0,
                                 buffer=SHUFFLE_BUFFER)
    else:
        dataset = LMDBReader(args.db, readahead=args.readahead)
    n = len(dataset)
    dataset.read(0)
    base_mib = None
    if args.cgroup:
        # the limit is what is left for the database on top of the imports' ~0.5 GiB
        with open(os.path.join(args.cgroup, "memory.usage_in_bytes")) as f:
            base = int(f.read())
        _write(args.cgroup, "memory.limit_in_bytes", base + (args.limit_mib << 20))
        base_mib = round(base / (1 << 20))
    if args.order == "block":
        order = BlockOrder(n, args.block_size, args.buffer_blocks, seed=0)
    elif args.order != "shards":
        order = RandomOrder(n, seed=0)  # DistributedSampler's permutation, as the loaders
    decode = None
    if args.decode:
        from decode.libraries import decode_jpeg as decode  # the loaders' whole-image decoder
    epochs = []
    for epoch in range(args.epochs):
        indices = list(order.order(epoch))[:args.epoch_records]
        io0, faults0 = _read_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_majflt
        start, nbytes = time.perf_counter(), 0
        for i in indices:
            data, _ = dataset.read(i)
            nbytes += len(data)
            if decode:
                decode(data)
        seconds = time.perf_counter() - start
        epochs.append({
            "epoch": epoch, "records": len(indices), "seconds": round(seconds, 3),
            "records_per_sec": round(len(indices) / seconds, 1),
            "record_mb_per_sec": round(nbytes / seconds / 1e6, 1),
            "disk_read_mb": round((_read_bytes() - io0) / 1e6, 1),
            "record_mb": round(nbytes / 1e6, 1),
            "major_faults": resource.getrusage(resource.RUSAGE_SELF).ru_majflt - faults0,
        })
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"order": args.order, "readahead": args.readahead, "records_in_db": n,
                      "max_rss_mib": round(rss_mib), "base_mib": base_mib, "epochs": epochs}))


def _read_bytes() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def print_table(results: list[dict]) -> None:
    """One line per case and epoch, as docs/performance.md quotes them."""
    print(f"{'case':<10} {'epoch':>5} {'records':>7} {'rec/s':>8} {'rec MB/s':>9} "
          f"{'disk MB':>8} {'rec MB':>7} {'maj faults':>10}")
    for r in results:
        for e in r["epochs"]:
            print(f"{r['case']:<10} {e['epoch'] + 1:>5} {e['records']:>7} "
                  f"{e['records_per_sec']:>8.1f} {e['record_mb_per_sec']:>9.1f} "
                  f"{e['disk_read_mb']:>8.1f} {e['record_mb']:>7.1f} {e['major_faults']:>10}")


def main(argv=None) -> int:
    """Command line; ``--child`` and the hidden flags are a case's child."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.loading.pagecache",
                                description=__doc__.split("\n")[0])
    p.add_argument("--db", help="LMDB to reuse (built there, and kept, if missing)")
    p.add_argument("--db-gib", type=float, default=2.0, help="size of the database to build")
    runner.add_data_option(p, "ImageNet-layout folder whose train/ JPEGs fill the database",
                           flag="--sample")
    p.add_argument("--limit-mib", type=int, default=512,
                   help="cgroup memory limit of the reader on top of its usage after imports")
    p.add_argument("--cases", default="random,random+ra,block,block+ra,shards",
                   help=f"comma-separated subset of {','.join(CASES)}")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--epoch-records", type=int, default=3000,
                   help="records read per epoch (a prefix of the epoch's order)")
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--buffer-blocks", type=int, default=8)
    p.add_argument("--decode", action="store_true", help="also decode each JPEG (torchvision)")
    runner.add_out_option(p, "write the results here", flag="--json")
    p.add_argument("--keep", action="store_true", help="keep the database built under /tmp")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--order", help=argparse.SUPPRESS)
    p.add_argument("--readahead", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cgroup", help=argparse.SUPPRESS)
    p.add_argument("--shards", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return 0

    tmp = None
    if args.db is None:
        tmp = tempfile.mkdtemp(prefix="bench_pagecache_", dir="/tmp")
        args.db = os.path.join(tmp, "db")
    if not os.path.isfile(os.path.join(args.db, "data.mdb")):
        start = time.perf_counter()
        os.makedirs(args.db, exist_ok=True)
        count = build_db(args.db, args.db_gib, args.sample)
        print(f"built {args.db}: {count} records in {time.perf_counter() - start:.0f} s")
    if "shards" in args.cases and not os.path.isdir(args.db.rstrip("/") + "-shards"):
        print(f"built {build_shards(args.db, args.db.rstrip('/') + '-shards')} shards "
              "of the same records")
    db_mib = os.path.getsize(os.path.join(args.db, "data.mdb")) / (1 << 20)
    read_ahead_kb = _device_read_ahead_kb(args.db)
    cgroup = make_cgroup(args.limit_mib)
    print(f"database {db_mib:.0f} MiB; reader limited to "
          f"{f'{args.limit_mib} MiB (cgroup v1, page cache included)' if cgroup else 'nothing'}; "
          "page cache dropped before each case")
    results = []
    try:
        for name in args.cases.split(","):
            results.append(run_case(args, name, cgroup))
            print(f"  {name}: done", flush=True)
    finally:
        remove_cgroup(cgroup)
        if tmp and not args.keep:
            shutil.rmtree(tmp)
    print_table(results)
    report = {"db_mib": round(db_mib), "limit_mib": args.limit_mib if cgroup else None,
              "epoch_records": args.epoch_records, "block_size": args.block_size,
              "buffer_blocks": args.buffer_blocks, "decode": args.decode,
              "read_ahead_kb": read_ahead_kb, "results": results}
    if args.json:
        runner.write_json(args.json, report)
    return 0


def _device_read_ahead_kb(path: str) -> int | None:
    # the block device's readahead window: with readahead on, a fault reads this much around it
    try:
        dev = os.stat(path).st_dev
        sysfs = os.path.realpath(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
        for candidate in (sysfs, os.path.dirname(sysfs)):
            ra = os.path.join(candidate, "queue", "read_ahead_kb")
            if os.path.isfile(ra):
                return int(open(ra).read())
    except OSError:
        pass
    return None


if __name__ == "__main__":
    sys.exit(main())
