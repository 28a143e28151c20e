"""The batch-decode pipeline (``--decode-device``) beside the CPU loaders, from folder, LMDB and
shards, through ``main.py --benchmark-data`` (target: >= 10,000 images/s on one GPU at 224 px
with <= 4 workers).

Each row (:func:`rows`) is a fresh ``main.py SOURCE --benchmark-data --decode-device D``;
``cpu-nvimgcodec`` runs the GPU pipeline's code on nvImageCodec's CPU backend. Prints images/s
(median of the interleaved rounds), per core, and ``main.py``'s ``cpu_ms_per_image`` (the
training process and its workers); ``--out FILE`` keeps every round as JSON.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

from benchmarks import runner

PROG = "python -m benchmarks.pipelines.gpu_decode"
TARGET_IMAGES_PER_SEC = 10_000  # on one GPU, 224 px, at most 4 workers
TARGET_MAX_WORKERS = 4
SOURCES = ("folder", "lmdb", "shards")


def rows(has_cuda: bool, workers: list[int]) -> list[tuple[str, str, int, int]]:
    """``(source, decode_device, workers, px)`` of every row this machine times."""
    out = [(source, device, j, 224) for source in SOURCES for device in ("cpu", "cpu-nvimgcodec")
           for j in workers]
    if has_cuda:
        out += [(source, "cuda", j, px) for source in SOURCES for j in (2, 4)
                for px in (224, 160)]
        out += [("lmdb", "cpu", j, 224) for j in (8, 15) if j not in workers]
    return out


def command(row: tuple[str, str, int, int], roots: dict, args) -> list[str]:
    """``main.py --benchmark-data`` of one row."""
    source, device, workers, px = row
    where = {"folder": [roots["folder"]], "lmdb": ["--lmdb", roots["lmdb"]],
             "shards": ["--loader", "shards", roots["shards"]]}[source]
    return [sys.executable, "main.py", *where, "--benchmark-data", "-b", str(args.batch_size),
            "-j", str(workers), "--decode-device", device, "--train-crop-size", str(px),
            "--train-batches", str(args.batches), "--benchmark-warmup", str(args.warmup),
            "--seed", "0"]


def _prepare(args, tmp: str) -> dict:
    import folder2lmdb
    import folder2shards

    data = runner.replicate(args.data, os.path.join(tmp, "jpeg"), args.repeat)
    runner.warm_page_cache(data)
    roots = {"folder": data, "lmdb": os.path.join(tmp, "lmdb"),
             "shards": os.path.join(tmp, "shards")}
    for split in ("train", "val"):
        folder2lmdb.convert(os.path.join(data, split), os.path.join(roots["lmdb"], split),
                            workers=2, progress=False)
        folder2shards.convert(os.path.join(data, split), os.path.join(roots["shards"], split),
                              max_per_shard=128, workers=2, progress=False)
    return roots


def summarise(row, stats: list[dict]) -> dict:
    """One row's medians over its rounds (every round kept)."""
    source, device, workers, px = row
    speed = runner.median(r["images_per_sec"] for r in stats)
    cpu = [r["cpu_ms_per_image"] for r in stats if r.get("cpu_ms_per_image") is not None]
    cores = stats[0]["cpu_count"]
    return {"source": source, "decode_device": device, "workers": workers, "px": px,
            "images_per_sec": speed, "images_per_sec_per_core": speed / cores,
            "cpu_ms_per_image": runner.median(cpu) if cpu else None, "cpu_count": cores,
            "rounds": stats}


def table(results: list[dict]) -> str:
    """The Markdown table of the rows."""
    def cpu(r):
        ms = r["cpu_ms_per_image"]
        return "-" if ms is None else f"{ms:.2f} ({1000 / ms:.0f})" if ms else "0"

    return runner.markdown_table(
        ["source", "--decode-device", "-j", "px", "images/s", "images/s per core",
         "CPU ms per image (images per CPU-s)"],
        [[r["source"], r["decode_device"], str(r["workers"]), str(r["px"]),
          f"{r['images_per_sec']:.0f}", f"{r['images_per_sec_per_core']:.0f}", cpu(r)]
         for r in results])


def targets(results: list[dict], has_cuda: bool) -> list[str]:
    """The target lines: met or not on a GPU, or why not measured here."""
    if not has_cuda:
        return ["GPU targets (>= 10,000 images/s at 224 px with <= 4 workers; CPU per image "
                "vs the CPU loaders; -j 15 vs -j 8): not measured here (no CUDA)"]
    lines = []
    for source in SOURCES:
        best = max((r for r in results if r["source"] == source and r["decode_device"] == "cuda"
                    and r["px"] == 224 and r["workers"] <= TARGET_MAX_WORKERS),
                   key=lambda r: r["images_per_sec"], default=None)
        if best is not None:
            met = "met" if best["images_per_sec"] >= TARGET_IMAGES_PER_SEC else "NOT met"
            lines.append(f"{source}: {best['images_per_sec']:.0f} images/s at 224 px, -j "
                         f"{best['workers']} (target {TARGET_IMAGES_PER_SEC}: {met})")
    return lines


def main_cli(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    runner.add_data_option(parser, "ImageNet-layout folder (train/ and val/), e.g. the sample")
    parser.add_argument("--repeat", type=int, default=4, help="copies of each image (symlinks)")
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("--workers", default="2", help="comma-separated -j of the CPU rows")
    parser.add_argument("--batches", type=int, default=30, help="timed batches per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches first")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run")
    runner.add_rounds_option(parser, 3)
    runner.add_out_option(parser, "JSON file for every round (optional)")
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.join(args.data, "train")):
        return runner.error(PROG, f"{args.data}: no train/ folder")
    has_cuda = torch.cuda.is_available()
    workers = [int(j) for j in args.workers.split(",")]
    with runner.scratch("bench-gpu-decode-") as tmp:
        roots = _prepare(args, tmp)
        cmds = {row: command(row, roots, args) for row in rows(has_cuda, workers)}

        def progress(round_: int, row, stats: dict) -> None:
            print(f"round {round_ + 1}: {' '.join(map(str, row)):>32} "
                  f"{stats['images_per_sec']:8.1f} images/s", flush=True)

        try:
            runs = runner.interleave(
                cmds, lambda row: runner.run_json_process(str(row), cmds[row], args.timeout),
                args.rounds, alternate=True, on_result=progress)
        except RuntimeError as exc:
            return runner.error(PROG, exc)
    results = [summarise(row, runs[row]) for row in cmds]
    print(table(results))
    for line in targets(results, has_cuda):
        print(line)
    if args.out:
        runner.write_json(args.out, {"config": vars(args), "cuda": has_cuda,
                                     "gpu": torch.cuda.get_device_name() if has_cuda else None,
                                     "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main_cli())
