"""Does a DataLoader worker's memory grow with the number of LMDB records?

Target: the worst worker's memory on 1.28 M records minus on 10 k records stays under
``--limit-mb`` (50 MB), judged on ``rss_excl_mdb`` and ``anon`` (memory the process owns).

For each of ``--records`` (:func:`write_lmdb`) and ``--samplers`` (torch's
``DistributedSampler``, or ``RandomOrder`` whose permutation is a tensor, not a list of Python
ints), a fresh process runs :func:`measure` after :func:`set_page_cache`. Prints
PASS/FAIL, with the ``rss`` difference beside it.
"""
from __future__ import annotations

import argparse
import glob
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks import runner

_MiB = 1 << 20
NUM_CLASSES = 1000
# Fields of /proc/PID/smaps summed per process (kB in the file).
_FIELDS = {"Rss": "rss", "Pss": "pss", "Private_Clean": "uss", "Private_Dirty": "uss",
           "Anonymous": "anon"}


def tiny_jpeg() -> bytes:
    """A valid 8x8 RGB JPEG of under 300 bytes (optimised Huffman tables), decodable by the
    loaders' libjpeg-turbo path."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (120, 30, 200)).save(buffer, "JPEG", quality=75, optimize=True)
    return buffer.getvalue()


def write_lmdb(path: str, count: int, num_classes: int = NUM_CLASSES,
               txn_records: int = 200_000) -> int:
    """Write ``count`` :func:`tiny_jpeg` records at ``path`` in ``folder2lmdb.py``'s format;
    returns ``data.mdb``'s size in bytes. Record ``i`` has label ``i * num_classes // count``
    (ImageFolder order), classes are ``n%08d``. Written with py-lmdb's appending puts in
    ``txn_records``-record transactions, far faster than ``folder2lmdb`` on a million records."""
    import lmdb

    from formats.lmdb import META_KEY, Metadata, encode_meta, encode_record, record_key

    jpeg = tiny_jpeg()
    # One record (key, msgpack value, node header) takes under 400 bytes of a page.
    env = lmdb.open(path, map_size=count * 1024 + (64 << 20), subdir=True, meminit=False,
                    map_async=True, writemap=False)
    try:
        for first in range(0, count, txn_records):
            last = min(count, first + txn_records)
            with env.begin(write=True) as txn:
                txn.cursor().putmulti(
                    ((record_key(i), encode_record(jpeg, i * num_classes // count))
                     for i in range(first, last)), append=True)
        classes = tuple("n%08d" % c for c in range(num_classes))
        # Written last, as folder2lmdb.py does: a database without it is never opened.
        with env.begin(write=True) as txn:
            txn.put(META_KEY, encode_meta(Metadata(count=count, classes=classes)))
        env.sync(True)
    finally:
        env.close()
    return os.path.getsize(os.path.join(path, "data.mdb"))


def proc_memory(pid: int) -> dict[str, int]:
    """Memory of process ``pid`` in bytes from ``/proc/PID/smaps``: ``rss``, ``pss``, ``uss``
    (private pages), ``anon`` (heap, objects, tensors; after ``fork()`` with pages still
    shared), ``mdb`` (RSS of ``data.mdb``'s map: clean page-cache pages shared with every
    reader, not owned) and ``rss_excl_mdb``. Raises ``OSError`` if the process is gone."""
    totals = dict.fromkeys(("rss", "pss", "uss", "anon", "mdb"), 0)
    in_mdb = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if " " not in name and name in _FIELDS:
                kib = int(rest.split()[0])
                totals[_FIELDS[name]] += kib
                if in_mdb and name == "Rss":
                    totals["mdb"] += kib
            elif not line[0].isupper():
                # A mapping header: "start-end perms offset dev inode [path]".
                in_mdb = line.rstrip().endswith("/data.mdb")
    out = {k: v * 1024 for k, v in totals.items()}
    out["rss_excl_mdb"] = out["rss"] - out["mdb"]
    return out


def child_pids() -> set[int]:
    """PIDs of this process's children (over all of its threads)."""
    pids: set[int] = set()
    for path in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        try:
            with open(path) as f:
                pids.update(int(p) for p in f.read().split())
        except OSError:
            pass  # the thread ended while we listed
    return pids


def measure(db: str, batches: int, warmup: int, sample_every: int, batch_size: int,
            workers: int, sampler: str = "stock") -> dict:
    """Iterate ``batches`` training batches of the LMDB loader over ``db`` in this process,
    sampling the main process's and the workers' memory. Returns ``{"records", "batches",
    "main": {"before", "samples"}, "workers": {pid: [sample, ...]}}``, each sample
    :func:`proc_memory`'s dict plus ``"step"``; epochs cycle (each starts new workers).
    ``sampler="stock"`` patches torch's ``DistributedSampler`` in for
    :meth:`loaders.orders.RandomOrder.order`. Raises RuntimeError without workers."""
    import torch

    import loaders
    import loaders.orders.random

    if sampler == "stock":
        from torch.utils.data import DistributedSampler

        def stock(order, epoch):  # measurement only: the same indices, as a list
            sampler = DistributedSampler(range(order.num_samples), order.world_size, order.rank,
                                         seed=order.seed, drop_last=True)
            sampler.set_epoch(epoch)
            return iter(sampler)

        loaders.orders.random.RandomOrder.order = stock
    settings = loaders.LoaderSettings(
        backend="lmdb", train_path=db, val_path=db, batch_size=batch_size, workers=workers,
        seed=0, lmdb=True, train_crop_size=32, val_resize_size=32, val_crop_size=32,
        train_batches=None, val_batches=None, max_bad_share=0.01, channels_last=False,
        dtype=torch.float32, lmdb_order="random", lmdb_block_size=256, lmdb_buffer_blocks=8,
        lmdb_readahead="auto", dali_cpu=False, dali_hw_decoder_load=None)  # main.py's defaults
    others = child_pids()  # children that are not DataLoader workers (none expected)
    train, _ = loaders.build_loaders(settings, loaders.DistInfo())
    result = {"records": len(train.reader), "batches": batches, "sampler": sampler,
              "main": {"before": proc_memory(os.getpid()), "samples": []}, "workers": {}}

    def sample(step: int) -> None:
        result["main"]["samples"].append({"step": step, **proc_memory(os.getpid())})
        for pid in sorted(child_pids() - others):
            try:
                mem = proc_memory(pid)
            except OSError:
                continue  # a worker that just exited
            result["workers"].setdefault(str(pid), []).append({"step": step, **mem})

    step, epoch = 0, 0
    while step < batches:
        train.set_epoch(epoch)
        batch_iter = iter(train)
        for _images, _labels in batch_iter:
            if step >= warmup and ((step - warmup) % sample_every == 0 or step == batches - 1):
                sample(step)
            step += 1
            if step == batches:
                break
        batch_iter.close()  # shuts the workers down before the next epoch starts new ones
        epoch += 1
    result["epochs"] = epoch
    if not result["workers"]:
        raise RuntimeError("no DataLoader worker process was found (is -j 0?)")
    return result


def summarise(run: dict) -> dict:
    """Per-run figures in bytes: worst worker's peak and end values, main process before/end."""
    end_step = max(s["step"] for samples in run["workers"].values() for s in samples)
    workers = run["workers"].values()
    summary = {"records": run["records"], "sampler": run["sampler"]}
    for key in ("rss", "rss_excl_mdb", "anon", "uss", "pss", "mdb"):
        summary[f"worker_{key}_peak"] = max(s[key] for samples in workers for s in samples)
        summary[f"worker_{key}_end"] = max(s[key] for samples in workers for s in samples
                                           if s["step"] == end_step)
    main_samples = run["main"]["samples"]
    summary["main_rss_before"] = run["main"]["before"]["rss"]
    summary["main_rss_end"] = main_samples[-1]["rss"]
    summary["main_rss_peak"] = max(s["rss"] for s in main_samples)
    # Growth while iterating: where the sampler's per-epoch index list shows.
    summary["main_rss_growth"] = summary["main_rss_end"] - summary["main_rss_before"]
    return summary


def set_page_cache(db: str, state: str) -> None:
    """Put ``db``'s ``data.mdb`` in the page cache (``"warm"``: read it all) or take it out
    (``"cold"``: ``POSIX_FADV_DONTNEED``). Worker RSS depends on it: the kernel's fault-around
    maps up to 16 cached neighbouring pages at each fault (``MADV_RANDOM`` does not stop it), so
    a warm database shows several times more ``data.mdb`` RSS for the same reads."""
    path = os.path.join(db, "data.mdb")
    if state == "warm":
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass
    else:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def measure_in_subprocess(db: str, opts: argparse.Namespace, sampler: str) -> dict:
    """:func:`measure` in a fresh interpreter, so one run leaves nothing in the next."""
    cmd = runner.module_command(
        "benchmarks.loading.memory", "--measure-db", db, "--batches", str(opts.batches),
        "--warmup", str(opts.warmup), "--sample-every", str(opts.sample_every),
        "-b", str(opts.batch_size), "-j", str(opts.workers), "--samplers", sampler)
    set_page_cache(db, getattr(opts, "cache", "warm"))
    done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True,
                          env=runner.module_env())
    return json.loads(done.stdout.strip().splitlines()[-1])


def _mib(n: float) -> str:
    return f"{n / _MiB:8.1f}"


def compare(summaries: list[dict], limit_bytes: float) -> dict:
    """Differences largest minus smallest database per sampler, checked against the limit."""
    verdicts = {}
    for sampler in sorted({s["sampler"] for s in summaries}):
        runs = sorted((s for s in summaries if s["sampler"] == sampler),
                      key=lambda s: s["records"])
        small, big = runs[0], runs[-1]
        diff = {key: big[key] - small[key] for key in (
            "worker_rss_peak", "worker_rss_end", "worker_mdb_end", "worker_rss_excl_mdb_peak",
            "worker_rss_excl_mdb_end", "worker_anon_peak", "worker_anon_end", "worker_uss_end",
            "main_rss_end", "main_rss_peak", "main_rss_growth")}
        checked = ("worker_rss_excl_mdb_peak", "worker_anon_peak")
        verdicts[sampler] = {"small": small["records"], "big": big["records"], "diff": diff,
                             "pass": all(diff[k] < limit_bytes for k in checked),
                             "checked": list(checked),
                             "rss_pass": diff["worker_rss_peak"] < limit_bytes}
    return verdicts


def print_table(summaries: list[dict], verdicts: dict, limit_bytes: float) -> None:
    """The table of docs/performance.md's *Memory per loader worker* (MiB, worst worker)."""
    print("MiB; w = worst DataLoader worker (peak; mdb at the end); mdb = RSS of data.mdb's "
          "map; excl = RSS minus mdb; main + = main RSS growth while iterating")
    head = (f"{'sampler':8} {'records':>9} | {'wRSS pk':>8} {'wRSS end':>8} {'w mdb':>8} "
            f"{'w excl':>8} {'w anon':>8} | {'main bef':>8} {'main end':>8} {'main +':>8}")
    print(head)
    print("-" * len(head))
    for s in summaries:
        print(f"{s['sampler']:8} {s['records']:>9} | {_mib(s['worker_rss_peak'])} "
              f"{_mib(s['worker_rss_end'])} {_mib(s['worker_mdb_end'])} "
              f"{_mib(s['worker_rss_excl_mdb_peak'])} {_mib(s['worker_anon_peak'])} "
              f"| {_mib(s['main_rss_before'])} {_mib(s['main_rss_end'])} "
              f"{_mib(s['main_rss_growth'])}")
    for sampler, v in verdicts.items():
        d = v["diff"]
        print(f"{sampler}: {v['big']} minus {v['small']} records, per worker: RSS "
              f"{_mib(d['worker_rss_peak']).strip()} (of which data.mdb "
              f"{_mib(d['worker_mdb_end']).strip()}), RSS excl. data.mdb "
              f"{_mib(d['worker_rss_excl_mdb_peak']).strip()}, anon "
              f"{_mib(d['worker_anon_peak']).strip()}; main process RSS growth "
              f"{_mib(d['main_rss_growth']).strip()}")
        limit = f"< {limit_bytes / 1e6:.0f} MB = {limit_bytes / _MiB:.1f} MiB"
        print(f"{sampler}: {'PASS' if v['pass'] else 'FAIL'} owned memory (worker RSS excl. "
              f"data.mdb and anon differences {limit}); "
              f"{'PASS' if v['rss_pass'] else 'FAIL'} raw RSS incl. data.mdb's map")


def get_args_parser() -> argparse.ArgumentParser:
    """The command line; ``--measure-db`` is the child's."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loading.memory",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, nargs="+", default=[10_000, 1_281_167],
                        help="database sizes (default: 10000 1281167)")
    parser.add_argument("--batches", type=int, default=300, help="batches iterated (300)")
    parser.add_argument("--warmup", type=int, default=20, help="batches before sampling (20)")
    parser.add_argument("--sample-every", type=int, default=10, help="batches between samples")
    parser.add_argument("-b", "--batch-size", type=int, default=32,
                        help="batch size (32: 300 batches stay within one epoch of 10 k)")
    parser.add_argument("-j", "--workers", type=int, default=2, help="DataLoader workers (2)")
    parser.add_argument("--samplers", nargs="+", choices=("stock", "lean"),
                        default=["stock", "lean"],
                        help="training sampler: torch's DistributedSampler and/or "
                             "RandomOrder's (what main.py uses)")
    parser.add_argument("--cache", choices=("warm", "cold"), default="warm",
                        help="data.mdb in the page cache before each run (warm: read it all, the "
                             "worst case for worker RSS) or evicted (cold)")
    parser.add_argument("--limit-mb", type=float, default=50.0,
                        help="allowed per-worker difference in MB of 10^6 bytes (50)")
    parser.add_argument("--tmp", default=None, help="where to write the databases (system temp)")
    parser.add_argument("--keep", action="store_true", help="keep the databases")
    runner.add_out_option(parser, "write the JSON report here")
    parser.add_argument("--measure-db", default=None, help=argparse.SUPPRESS)
    return parser


def main(argv=None) -> int:
    """CLI entry point; returns 0 if every sampler passes, 1 otherwise."""
    opts = get_args_parser().parse_args(argv)
    if opts.measure_db:  # the child of measure_in_subprocess
        print(json.dumps(measure(opts.measure_db, opts.batches, opts.warmup, opts.sample_every,
                                 opts.batch_size, opts.workers, opts.samplers[0])))
        return 0
    tmp = tempfile.mkdtemp(prefix="bench-memory-", dir=opts.tmp)
    runs, summaries, databases = [], [], {}
    try:
        for count in opts.records:
            path = os.path.join(tmp, f"db-{count}")
            start = time.perf_counter()
            size = write_lmdb(path, count)
            databases[count] = {"path": path, "data_mdb_bytes": size}
            print(f"wrote {count} records ({size / _MiB:.0f} MiB data.mdb) in "
                  f"{time.perf_counter() - start:.1f} s", flush=True)
        for sampler in opts.samplers:
            for count in opts.records:
                start = time.perf_counter()
                run = measure_in_subprocess(databases[count]["path"], opts, sampler)
                runs.append(run)
                summaries.append(summarise(run))
                print(f"measured {count} records, {sampler} sampler, in "
                      f"{time.perf_counter() - start:.1f} s", flush=True)
    finally:
        if opts.keep:
            print(f"databases kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    limit = opts.limit_mb * 1e6
    verdicts = compare(summaries, limit)
    print_table(summaries, verdicts, limit)
    if opts.out:
        from engine.settings import node_cores  # not before the children are measured

        report = {"settings": {k: v for k, v in vars(opts).items() if k != "measure_db"},
                  "cpu_count": node_cores(), "databases": databases,
                  "summaries": summaries, "verdicts": verdicts, "runs": runs}
        runner.write_json(opts.out, report)
        print(f"wrote {opts.out}")
    return 0 if all(v["pass"] for v in verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
