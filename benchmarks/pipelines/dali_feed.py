"""DALI on the CPU through main.py's own code path: how long the training thread spends handing
records to DALI, images/s, and host memory across epochs.

Each round runs :func:`child` in a fresh process for this checkout and ``--base DIR`` (another,
interleaved) over an LMDB of ``--data`` replicated ``--repeat`` times. Prints the medians over
the rounds against the targets; ``--json FILE`` keeps every round.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

TARGET_FEED_MS = 2.0  # target: at most 2 ms per batch handing records to DALI
TARGET_RSS_GROWTH = 0.05  # target: host RSS over 5 epochs growing by less than 5%


def child(code: str, db: str, batch: int, workers: int, batches: int, warmup: int,
          epochs: int) -> dict:
    """One measurement in this process, with ``code`` (a checkout) first on ``sys.path``: the
    training loader of ``main.py --dali --dali-cpu --lmdb DB``, its images/s
    (``loaders.measure_throughput``), ms per batch in DALI's input setup
    (``Pipeline._iter_setup``) on the training thread (median: steady state; mean: with each
    pass's first, waiting calls) and VmRSS in MiB after each of ``epochs``."""
    sys.path.insert(0, code)
    os.chdir(code)
    import nvidia.dali.pipeline as dali_pipeline

    import loaders
    import main
    from engine.distributed.processes import Job, resolve_device
    from engine.settings import resolve_settings

    calls = []
    setup = dali_pipeline.Pipeline._iter_setup

    def timed(self):  # a measurement hook: DALI calls it on the thread that runs the pipeline
        started = time.perf_counter()
        try:
            return setup(self)
        finally:
            calls.append(time.perf_counter() - started)

    dali_pipeline.Pipeline._iter_setup = timed
    _retain_freed_memory()  # as main.py does before it builds the loaders
    args = main.parse_args(["--dali", "--dali-cpu", "--lmdb", db, "-b", str(batch), "-j",
                            str(workers), "--seed", "0"])
    job = Job(loaders.DistInfo(device=resolve_device(args.gpu, args.no_accel)))
    train, val = loaders.build_loaders(resolve_settings(args, job, None).loader, job.dist)
    stats = loaders.measure_throughput(train, batches, warmup)
    feed = sorted(1000 * c for c in calls)
    rss = []
    for epoch in range(epochs):
        train.set_epoch(epoch)
        for _ in train:
            pass
        rss.append(_rss_mib())
    train.close()
    val.close()
    return {"images_per_sec": stats["images_per_sec"], "feed_ms_median": feed[len(feed) // 2],
            "feed_ms_mean": sum(feed) / len(feed), "rss_mib": rss,
            "rss_growth": rss[-1] / rss[0] - 1}


def _retain_freed_memory() -> None:
    try:
        from decode import retain_freed_memory
    except ImportError:  # an older --base checkout keeps it in loaders
        from loaders import retain_freed_memory
    retain_freed_memory()


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def make_db(data: str, repeat: int, tmp: str) -> str:
    """An LMDB per split of ``data`` replicated ``repeat`` times (train) and once (val)."""
    import folder2lmdb
    from benchmarks import runner

    root, copies = os.path.join(tmp, "db"), runner.replicate(data, os.path.join(tmp, "copies"),
                                                            repeat)
    folder2lmdb.convert(os.path.join(copies, "train"), os.path.join(root, "train"),
                        shuffle_seed=0, progress=False, workers=2)
    folder2lmdb.convert(runner.split_folder(data, "val"), os.path.join(root, "val"),
                        progress=False, workers=2)
    return root


def measure(code: str, db: str, args) -> dict:
    """:func:`child` in a fresh process (this file run by path imports nothing of the checkout
    at module level, so ``code`` may be another version)."""
    spec = json.dumps([code, db, args.batch_size, args.workers, args.batches, args.warmup,
                       args.epochs])
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", spec],
                          capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{code}: exit status {done.returncode}: "
                           f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(results: dict) -> list[str]:
    """One line per code: medians over the rounds, and the targets."""
    from benchmarks import runner

    lines = []
    for code, rounds in results.items():
        speed = runner.median(r["images_per_sec"] for r in rounds)
        feed = runner.median(r["feed_ms_median"] for r in rounds)
        mean = runner.median(r["feed_ms_mean"] for r in rounds)
        growth = runner.median(r["rss_growth"] for r in rounds)
        lines.append(f"{code:>5}: {speed:7.0f} images/s; on the training thread per batch "
                     f"{feed:.2f} ms (median; target <= {TARGET_FEED_MS}), {mean:.2f} ms (mean, "
                     f"with each pass's first batches); RSS {growth:+.1%} from the first epoch "
                     f"to the last (target < {TARGET_RSS_GROWTH:.0%})")
    if "base" in results:
        ratio = runner.median(n["images_per_sec"] / b["images_per_sec"]
                              for n, b in zip(results["new"], results["base"]))
        lines.append(f"new vs base, images/s, median of the rounds' ratios: {ratio:.3f}")
    return lines


def get_args_parser() -> argparse.ArgumentParser:
    from benchmarks import runner

    p = argparse.ArgumentParser(prog="python -m benchmarks.pipelines.dali_feed",
                                description=__doc__.splitlines()[0])
    runner.add_data_option(p, "ImageNet-layout root with train/ and val/")
    p.add_argument("--base", help="a checkout of the code to compare with (interleaved)")
    p.add_argument("--repeat", type=int, default=16, help="copies of each training image")
    p.add_argument("-b", "--batch-size", type=int, default=256)
    p.add_argument("-j", "--workers", type=int, default=2)
    p.add_argument("--batches", type=int, default=12, help="timed batches")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--epochs", type=int, default=5, help="epochs for the memory figure")
    p.add_argument("--timeout", type=float, default=900)
    runner.add_rounds_option(p, 3)
    runner.add_out_option(p, "write every round here (JSON)", flag="--json")
    return p


def main_cli(argv=None) -> int:
    if argv is None and sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(*json.loads(sys.argv[2]))))
        return 0
    from benchmarks import runner

    args = get_args_parser().parse_args(argv)
    if not os.path.isdir(os.path.join(args.data, "train")):
        return runner.error("benchmarks.pipelines.dali_feed", f"{args.data}: no train/ folder")
    codes = {"new": runner.REPO, **({"base": os.path.abspath(args.base)} if args.base else {})}
    with runner.scratch("bench-dali-feed-") as tmp:
        db = make_db(args.data, args.repeat, tmp)
        results = runner.interleave(codes, lambda name: measure(codes[name], db, args),
                                    args.rounds, alternate=True)
    print("\n".join(report(results)))
    if args.json:
        runner.write_json(args.json, {"args": vars(args), "rounds": results})
    return 0


if __name__ == "__main__":
    sys.exit(main_cli())
