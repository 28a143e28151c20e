"""What measuring the stages costs (issue 49): ``main.py --benchmark-data`` images/s with the
per-stage clocks on and off (``IMAGENET_FAST_STAGES=0``), interleaved rounds on the real
sample, and how much of each worker's measured time per image the stages account for.

Usage::

    python -m benchmarks.bench_stage_cost --data ../shared/data/imagenet-sample --rounds 5

Each round runs both, in a fresh process each, order alternating (on, off / off, on), over
symlinked copies of the sample's training images (``--copies``, so that one epoch outlasts
the timed batches). Prints the rounds, the medians, the cost (1 - on/off) and per worker the
stages' sum over its measured wall time per image (``stages_worker_coverage``); ``--out FILE``
writes them as JSON. Target: cost <= 1%, coverage >= 95%.
"""
from __future__ import annotations

import argparse
import os
import sys

from benchmarks import runner

SETTINGS = ("on", "off")


def measure(data: str, args, setting: str) -> dict:
    """One ``--benchmark-data`` run of ``data`` with the stages ``setting`` (on/off)."""
    cmd = [sys.executable, "main.py", data, "--benchmark-data", "-b", str(args.batch_size),
           "-j", str(args.workers), "--train-batches", str(args.batches),
           "--benchmark-warmup", str(args.warmup), "--seed", "0", "--no-accel"]
    old = os.environ.get("IMAGENET_FAST_STAGES")
    os.environ["IMAGENET_FAST_STAGES"] = "1" if setting == "on" else "0"
    try:
        return runner.run_json_process(f"stages {setting}", cmd, timeout=900)
    finally:
        if old is None:
            del os.environ["IMAGENET_FAST_STAGES"]
        else:
            os.environ["IMAGENET_FAST_STAGES"] = old


def run(args) -> dict:
    """The rounds and their summary (see the module docstring)."""
    with runner.scratch("bench-stage-cost-") as tmp:
        data = runner.replicate(args.data, tmp, args.copies)
        runner.warm_page_cache(data)

        def progress(round_: int, setting: str, row: dict) -> None:
            print(f"round {round_ + 1} stages {setting}: {row['images_per_sec']:.1f} images/s",
                  flush=True)

        rows = runner.interleave(SETTINGS, lambda s: measure(data, args, s), args.rounds,
                                 alternate=True, on_result=progress)
    speeds = {s: [r["images_per_sec"] for r in rows[s]] for s in SETTINGS}
    on, off = (runner.median(speeds[s]) for s in SETTINGS)
    coverage = [c for r in rows["on"] for c in r.get("stages_worker_coverage") or []]
    return {"config": vars(args), "cpu_count": rows["on"][0]["cpu_count"],
            "images_per_sec": speeds, "median_on": on, "median_off": off,
            "cost": 1 - on / off, "worker_coverage": coverage,
            "stages_sum_ms": [r["stages_total_ms_mean"] for r in rows["on"]],
            "worker_ms": [r["stages_worker_ms_per_image"] for r in rows["on"]]}


def main_cli(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    runner.add_data_option(parser, "the image folder (train/ and val/), e.g. the real sample")
    runner.add_rounds_option(parser, 5)
    parser.add_argument("--copies", type=int, default=8, help="symlinked copies per image")
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("-j", "--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=24, help="timed batches per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches per run")
    runner.add_out_option(parser, "write the report as JSON to this file")
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.join(args.data, "train")):
        return runner.error("bench_stage_cost", f"--data {args.data}: no train/ folder")
    report = run(args)
    print(f"\nstages on {report['median_on']:.1f} vs off {report['median_off']:.1f} images/s "
          f"(medians of {args.rounds} interleaved rounds, -b {args.batch_size} -j "
          f"{args.workers}, {report['cpu_count']} cores): cost {report['cost']:+.1%}")
    coverage = report["worker_coverage"]
    if coverage:
        print(f"stages' sum / each worker's measured time per image: {min(coverage):.1%} - "
              f"{max(coverage):.1%} over {len(coverage)} worker-runs")
    if args.out:
        runner.write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main_cli())
