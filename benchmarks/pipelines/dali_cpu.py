"""Where DALI's CPU-only training pipeline spends its time: images/s of each stage alone.

Each row runs ``--batches`` batches after 10 warm-up ones over the sample replicated 16 times:
:func:`stage_rows`, then :func:`loader_rows`. Every row gives the cores the process kept busy;
``ms/image/thread`` is ``threads / (images/s)``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

import decode
from benchmarks import runner
from benchmarks.loading.throughput import main_loader
from engine.settings import node_cores
from loaders.readers.folder import open_reader
from loaders.transforms import RRC_RATIO, RRC_SCALE


def stage_pipeline(stage: str, files: list[str], batch_size: int, threads: int):
    """A built DALI pipeline on the CPU that runs ``files`` up to ``stage`` (a row's name)."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def
    def graph():
        encoded, labels = fn.readers.file(files=files, labels=list(range(len(files))),
                                          random_shuffle=True, seed=0, dont_use_mmap=True)
        if stage == "read":
            return encoded, labels
        if stage == "decode whole image":
            return fn.decoders.image(encoded, device="cpu", output_type=types.RGB), labels
        images = fn.decoders.image_random_crop(
            encoded, device="cpu", output_type=types.RGB, random_area=list(RRC_SCALE),
            random_aspect_ratio=list(RRC_RATIO), num_attempts=100)
        if stage.startswith("+ fn.resize"):
            images = fn.resize(images, resize_x=224, resize_y=224,
                               antialias=stage.endswith("antialiased"))
        return images, labels

    pipe = graph(batch_size=batch_size, num_threads=threads, device_id=None, seed=0)
    pipe.build()
    return pipe


def images_per_sec(next_batch, batch_size: int, batches: int) -> tuple[float, float]:
    """(images/s, busy cores) over ``batches`` calls after 10 warm-up ones."""
    for _ in range(10):
        next_batch()
    cpu, start = os.times(), time.perf_counter()
    for _ in range(batches):
        next_batch()
    wall, end = time.perf_counter() - start, os.times()
    busy = (end.user - cpu.user + end.system - cpu.system) / wall
    return batches * batch_size / wall, busy


def stage_rows(files: list[str], b: int, j: int, batches: int) -> None:
    """Print one row per stage of DALI's CPU pipeline (``device_id=None``, ``j`` threads), each
    alone: reading, decoding whole images, decoding the RandomResizedCrop window, and that
    window resized to 224 by ``fn.resize`` with and without antialiasing."""
    print(f"{len(files)} JPEGs, batch {b}, {j} DALI threads, CPU only")
    print(f"  {'stage':42} {'images/s':>9} {'ms/image/thread':>16} {'busy cores':>11}")
    for stage in ("read", "decode whole image", "decode crop window",
                  "+ fn.resize 224, antialiased", "+ fn.resize 224, not antialiased"):
        pipe = stage_pipeline(stage, files, b, j)
        speed, busy = images_per_sec(pipe.run, b, batches)
        print(f"  {stage:42} {speed:9.0f} {1e3 * j / speed:16.2f} {busy:11.2f}", flush=True)
        del pipe


def loader_rows(data: str, b: int, j: int, batches: int, rounds: int) -> None:
    """Print our ``--dali --dali-cpu`` loader (DALI decodes the window, torch resizes, flips
    and normalises) as it runs (``j`` single-threaded pipelines taking turns) and as one
    pipeline of ``j`` threads, medians of interleaved rounds."""
    pipelines = {f"our --dali loader, {j} 1-thread pipelines": None,
                 f"our --dali loader, 1 pipeline of {j} threads": 1}

    def measure(name: str) -> tuple[float, float]:
        train = main_loader(["--dali", "--dali-cpu", "--no-accel", data, "-b", str(b),
                             "-j", str(j), "--seed", "0"])
        train.cpu_pipelines = pipelines[name]
        batch_iter = iter(train)
        return images_per_sec(lambda: next(batch_iter), b, min(batches, len(train) - 10))

    for name, runs in runner.interleave(pipelines, measure, rounds).items():
        speed, busy = runner.median_high(runs)
        print(f"  {name:42} {speed:9.0f} {1e3 * j / speed:16.2f} {busy:11.2f}", flush=True)


def main_cli(argv=None) -> int:
    """Command line: 0 when every row is printed, 1 with one ``error:`` line otherwise."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pipelines.dali_cpu",
                                     description=__doc__.splitlines()[0])
    runner.add_data_option(parser, "ImageNet-layout folder (train/<wnid>/*.JPEG)")
    parser.add_argument("-b", "--batch-size", type=int, default=32)
    parser.add_argument("-j", "--workers", type=int, default=node_cores())
    parser.add_argument("--batches", type=int, default=80)
    runner.add_rounds_option(parser, 3, "interleaved rounds of the two loader rows; the median "
                             "is printed")
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.join(args.data, "train")):
        return runner.error("benchmarks.pipelines.dali_cpu",
                            f"{args.data}/train: no such directory")
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return runner.error("benchmarks.pipelines.dali_cpu", "needs NVIDIA DALI (make install)")
    torch.set_num_threads(1)
    decode.retain_freed_memory()
    with runner.scratch("profile-dali-") as tmp:
        data = runner.replicate(args.data, os.path.join(tmp, "jpeg"), 16)
        files = [path for path, _ in open_reader(os.path.join(data, "train")).samples]
        stage_rows(files, args.batch_size, args.workers, args.batches)
        loader_rows(data, args.batch_size, args.workers, args.batches, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main_cli())
