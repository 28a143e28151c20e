"""What measuring the stages costs: ``main.py --benchmark-data`` images/s with the per-stage
clocks on and off (``IMAGENET_FAST_STAGES=0``), and how much of each worker's time per image
the stages account for (``stages_worker_coverage``). Target: cost (1 - on/off) <= 1%, coverage
>= 95%.

Each alternating round runs both in fresh processes over ``--copies`` symlinked copies of
``--data``. On a shared machine whole runs differ by far more than 1%, so :func:`blocks` and
:func:`overhead` add measurements that such load disturbs less.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

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


def _loader(data: str, args, setting: str):
    """The training loader of ``main.py data -j 0`` with the stages ``setting`` (on/off)."""
    from benchmarks.loading.throughput import main_loader

    os.environ["IMAGENET_FAST_STAGES"] = "1" if setting == "on" else "0"
    try:
        return main_loader([data, "-b", str(args.batch_size), "-j", "0", "--seed", "0",
                            "--no-accel"])
    finally:
        del os.environ["IMAGENET_FAST_STAGES"]


def blocks(data: str, args) -> dict:
    """``--blocks``: images/s of ``main.py``'s training loader at ``-j 0`` (the workers' code
    in this process) with each setting, in alternating blocks of ``--block-batches``; the cost
    is 1 - the median of the paired (on / off) ratios."""
    from loaders import measure_throughput

    made = {s: _loader(data, args, s) for s in SETTINGS}
    speeds: dict[str, list[float]] = {s: [] for s in SETTINGS}
    try:
        for k in range(args.blocks):
            for setting in SETTINGS if k % 2 == 0 else SETTINGS[::-1]:
                started = time.perf_counter()
                stats = measure_throughput(made[setting], args.block_batches, warmup=0)
                speeds[setting].append(stats["images"] / (time.perf_counter() - started))
    finally:
        for loader in made.values():
            loader.close()
    ratios = [on / off for on, off in zip(speeds["on"], speeds["off"])]
    return {"images_per_sec": speeds, "ratios": ratios, "cost": 1 - runner.median(ratios)}


def overhead(batch_size: int, images: int = 20000, repeats: int = 7) -> dict:
    """``--overhead``: CPU microseconds (which other jobs disturb least) the stages add per
    image in a worker (the clock calls around work that takes no time; fastest of ``repeats``)
    and per batch of ``batch_size`` in the main process (``StageLog.add_slot``)."""
    import numpy as np

    from loaders.timing import stages

    clock, clock_ = stages.StageClock(), time.perf_counter
    rows = np.zeros(batch_size * stages.IMAGE_COLUMNS)

    def one(i: int) -> None:  # the clock calls of TimedSlotWriter and stages.timed_transform
        t = clock.t
        clock.begin_image()
        start = clock_()
        read = clock_()
        t[stages.WINDOW] += clock_() - read
        t[stages.READ] += read - start
        t[stages.BYTES] = 1000
        start = clock_()
        drawn = clock_()
        decoded = clock_()
        resized = clock_()
        t[stages.WINDOW] += drawn - start
        t[stages.DECODE] += decoded - drawn
        t[stages.RESIZE] += resized - decoded
        t[stages.AUGMENT] += clock_() - resized
        t[stages.KIND], t[stages.SIDE] = stages.KIND_CODES["window"], 500
        clock.sampled = clock_()
        clock.end_image(rows, i % batch_size)

    worker = []
    for _ in range(repeats):
        started = time.process_time()
        for i in range(images):
            one(i)
        worker.append((time.process_time() - started) / images)
    log, batch = stages.StageLog(), np.array([0.0, 0.1, 0.1, 0.0])
    started = time.process_time()
    for _ in range(images // batch_size):
        log.add_slot(rows, batch, batch_size)
    main_side = (time.process_time() - started) / (images // batch_size)
    return {"worker_us_per_image": 1e6 * min(worker), "main_us_per_batch": 1e6 * main_side,
            "main_us_per_image": 1e6 * main_side / batch_size}


def run(args) -> dict:
    """The rounds, :func:`blocks` and :func:`overhead` as asked, and their summary."""
    with runner.scratch("bench-stage-cost-") as tmp:
        data = runner.replicate(args.data, tmp, args.copies)
        runner.warm_page_cache(data)

        def progress(round_: int, setting: str, row: dict) -> None:
            print(f"round {round_ + 1} stages {setting}: {row['images_per_sec']:.1f} images/s",
                  flush=True)

        rows = runner.interleave(SETTINGS, lambda s: measure(data, args, s), args.rounds,
                                 alternate=True, on_result=progress)
        in_process = blocks(data, args) if args.blocks else None
    extra = {"blocks": in_process,
             "overhead": overhead(args.batch_size) if args.overhead else None}
    if not args.rounds:
        return {"config": vars(args), **extra}
    speeds = {s: [r["images_per_sec"] for r in rows[s]] for s in SETTINGS}
    on, off = (runner.median(speeds[s]) for s in SETTINGS)
    coverage = [c for r in rows["on"] for c in r.get("stages_worker_coverage") or []]
    return {"config": vars(args), "cpu_count": rows["on"][0]["cpu_count"],
            "images_per_sec": speeds, "median_on": on, "median_off": off,
            "cost": 1 - on / off, "worker_coverage": coverage,
            "stages_sum_ms": [r["stages_total_ms_mean"] for r in rows["on"]],
            "worker_ms": [r["stages_worker_ms_per_image"] for r in rows["on"]], **extra}


def main_cli(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loading.stage_cost",
                                     description=__doc__.splitlines()[0])
    runner.add_data_option(parser, "the image folder (train/ and val/), e.g. the real sample")
    runner.add_rounds_option(parser, 5)
    parser.add_argument("--copies", type=int, default=8, help="symlinked copies per image")
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("-j", "--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=24, help="timed batches per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches per run")
    parser.add_argument("--blocks", type=int, default=0,
                        help="also time -j 0 in this process in N alternating blocks")
    parser.add_argument("--block-batches", type=int, default=4, help="batches per block")
    parser.add_argument("--overhead", action="store_true",
                        help="also time the stages' bookkeeping alone, in CPU seconds")
    runner.add_out_option(parser, "write the report as JSON to this file")
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.join(args.data, "train")):
        return runner.error("benchmarks.loading.stage_cost",
                            f"--data {args.data}: no train/ folder")
    report = run(args)
    if args.rounds:
        _print_rounds(report, args)
    if report["blocks"]:
        b = report["blocks"]
        print(f"-j 0 in this process, {args.blocks} alternating blocks of {args.block_batches} "
              f"batches: median on/off {1 - b['cost']:.4f} (cost {b['cost']:+.2%}; blocks' "
              f"ratios {min(b['ratios']):.3f}-{max(b['ratios']):.3f})")
    if report["overhead"]:
        o = report["overhead"]
        print(f"bookkeeping: {o['worker_us_per_image']:.2f} us of CPU per image in a worker, "
              f"{o['main_us_per_batch']:.0f} us per batch of {args.batch_size} in the main "
              f"process ({o['main_us_per_image']:.2f} us per image)")
    if args.out:
        runner.write_json(args.out, report)
    return 0


def _print_rounds(report: dict, args) -> None:
    print(f"\nstages on {report['median_on']:.1f} vs off {report['median_off']:.1f} images/s "
          f"(medians of {args.rounds} interleaved rounds, -b {args.batch_size} -j "
          f"{args.workers}, {report['cpu_count']} cores): cost {report['cost']:+.1%}")
    coverage = report["worker_coverage"]
    if coverage:
        print(f"stages' sum / each worker's measured time per image: {min(coverage):.1%} - "
              f"{max(coverage):.1%} over {len(coverage)} worker-runs")


if __name__ == "__main__":
    sys.exit(main_cli())
