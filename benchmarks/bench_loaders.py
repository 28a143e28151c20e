#!/usr/bin/env python
"""Side-by-side training-loader throughput on the same JPEGs, in one process.

    python benchmarks/bench_loaders.py --data ../shared/data/imagenet-sample --out bench-output

Runs, with the same batch size, workers and images:

* ``stock``: the pytorch/examples pipeline users have today (ImageFolder + PIL
  RandomResizedCrop(224) + flip + ToTensor + Normalize in a DataLoader);
* ``decode-only``: read and fully decode each file to RGB and nothing else, in the same
  DataLoader setup, with libjpeg-turbo through torchvision (the decoding ceiling of these files
  on this CPU with the fastest decoder we have); ``decode-only-pil``: the same through PIL;
* each of our training loaders (``folder``, ``lmdb``, and ``dali`` when installed), including
  the copy to the device and normalisation there.

Writes ``OUT/report.json`` and ``OUT/chart.png`` (images/s per core) and prints a table.
The sample is replicated ``--repeat`` times (symlinks) so timing sees steady state, not
worker start-up. Every pipeline iterates ``--warmup`` batches untimed, then ``--batches`` timed ones, cycling
epochs when the data is smaller; ``--rounds`` interleaved repetitions, median reported. Files are read once beforehand so all pipelines see a warm
page cache.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets, transforms

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import folder2lmdb  # noqa: E402
import loaders  # noqa: E402
from loaders import DistInfo, LoaderSettings  # noqa: E402
from loaders._throughput import measure  # noqa: E402
from loaders._transforms import decode, image_library, read_file  # noqa: E402


class _DeviceCopy:
    """Moves a stock float batch to the device as pytorch/examples' training loop does."""

    def __init__(self, loader: DataLoader, device: torch.device):
        self.loader, self.device = loader, device

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for images, labels in self.loader:
            yield images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)


def stock_loader(root: str, batch_size: int, workers: int, device: torch.device):
    """The pytorch/examples imagenet/main.py training pipeline, unchanged."""
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    dataset = datasets.ImageFolder(root, transforms.Compose([
        transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(), normalize]))
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                        pin_memory=device.type == "cuda", drop_last=True)
    return _DeviceCopy(loader, device)


class _DecodeOnly(Dataset):
    """Reads and fully decodes each file to RGB, returning only its label: with libjpeg-turbo
    through torchvision (the decoder of our CPU loaders) or through PIL."""

    def __init__(self, root: str, use_pil: bool):
        self.samples, self.use_pil = datasets.ImageFolder(root).samples, use_pil

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, label = self.samples[index]
        if self.use_pil:
            with Image.open(path) as img:
                img.convert("RGB").load()
        else:
            decode(read_file(path))
        return 0, label


def decode_only_loader(root: str, batch_size: int, workers: int, use_pil: bool = False):
    return DataLoader(_DecodeOnly(root, use_pil), batch_size=batch_size, shuffle=True,
                      num_workers=workers, drop_last=True)


def bench_settings(backend: str, data: str, batch_size: int, workers: int,
                   **overrides) -> LoaderSettings:
    """The settings ``main.py`` resolves for ``data`` (``data/train``, ``data/val``) at its
    defaults on one process: 224-px crops (val resize 256), seed 0, float32 NCHW, random LMDB
    order, readahead auto; ``overrides`` replace fields (e.g. ``dali_cpu=True``)."""
    fields = dict(
        backend=backend, train_path=os.path.join(data, "train"),
        val_path=os.path.join(data, "val"), batch_size=batch_size, workers=workers, seed=0,
        lmdb=backend == "lmdb", train_crop_size=224, val_resize_size=256, val_crop_size=224,
        train_batches=None, val_batches=None, max_bad_share=0.01, channels_last=False,
        dtype=torch.float32, lmdb_order="random", lmdb_block_size=256, lmdb_buffer_blocks=8,
        lmdb_readahead="auto", dali_cpu=False, dali_hw_decoder_load=None)
    fields.update(overrides)
    return LoaderSettings(**fields)


def our_loader(backend: str, data: str, batch_size: int, workers: int, device, **overrides):
    """The training loader of ``backend`` over ``data`` (see :func:`bench_settings`)."""
    settings = bench_settings(backend, data, batch_size, workers, **overrides)
    train, _ = loaders.build_loaders(settings, DistInfo(device=device))
    return train


def replicate(src: str, dst: str, copies: int) -> str:
    """``dst/{train,val}/<class>/`` with ``copies`` symlinks per source image, so one epoch is
    long enough to measure steady state (worker start-up excluded) on a small sample."""
    for split in ("train", "val"):
        for wnid in sorted(os.listdir(os.path.join(src, split))):
            folder = os.path.join(src, split, wnid)
            if not os.path.isdir(folder):
                continue
            os.makedirs(os.path.join(dst, split, wnid), exist_ok=True)
            for name in os.listdir(folder):
                stem, ext = os.path.splitext(name)
                for k in range(copies):
                    os.symlink(os.path.abspath(os.path.join(folder, name)),
                               os.path.join(dst, split, wnid, f"{stem}_{k}{ext}"))
    return dst


def warm_page_cache(root: str) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                while f.read(1 << 20):
                    pass


def run(args) -> dict:
    """Build the copies and LMDBs in a temporary folder, measure, and remove the folder.

    glibc keeps freed memory in this process and its workers, as ``main.py`` does
    (``loaders/_malloc.py``): every pipeline, stock included, runs with that setting.
    """
    args.retain_freed_memory = loaders.retain_freed_memory()
    tmp = tempfile.mkdtemp(prefix="bench-loaders-")
    try:
        return _run(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run(args, tmp: str) -> dict:
    # The main process only receives batches (and normalises ours on a CPU-only machine); its
    # intra-op threads would spin against the loader workers for the same cores.
    torch.set_num_threads(args.main_threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cores = len(os.sched_getaffinity(0))
    data = replicate(args.data, os.path.join(tmp, "jpeg"), args.repeat)
    train_root = os.path.join(data, "train")
    warm_page_cache(train_root)
    lmdb_root = os.path.join(tmp, "lmdb")
    for split in ("train", "val"):
        folder2lmdb.convert(os.path.join(data, split), os.path.join(lmdb_root, split),
                            progress=False)
    b, j = args.batch_size, args.workers
    pipelines = {
        "stock": lambda: stock_loader(train_root, b, j, device),
        "decode-only": lambda: decode_only_loader(train_root, b, j),
        "decode-only-pil": lambda: decode_only_loader(train_root, b, j, use_pil=True),
        "folder": lambda: our_loader("folder", data, b, j, device),
        "lmdb": lambda: our_loader("lmdb", lmdb_root, b, j, device),
        "lmdb-readahead-off": lambda: our_loader("lmdb", lmdb_root, b, j, device,
                                                 lmdb_readahead="off"),
    }
    if "dali" in loaders.BACKENDS and _has_dali():
        pipelines["dali-cpu"] = lambda: our_loader("dali", data, b, j, device, dali_cpu=True)
        if device.type == "cuda":
            pipelines["dali-mixed"] = lambda: our_loader("dali", data, b, j, device)
    names = [n for n in pipelines if not args.only or n in args.only]
    runs = {name: [] for name in names}
    for round_ in range(args.rounds):  # interleaved, so drift in machine load hits all alike
        for name in names:
            stats = measure(pipelines[name](), args.batches, args.warmup)
            runs[name].append(stats)
            print(f"round {round_ + 1}: {name:>12} {stats['images_per_sec']:8.1f} images/s",
                  flush=True)
    results = []
    for name in names:
        speeds = sorted(r["images_per_sec"] for r in runs[name])
        median = speeds[len(speeds) // 2]
        results.append({"loader": name, "images_per_sec": median,
                        "images_per_sec_per_core": median / cores,
                        "images_per_sec_runs": speeds,
                        "images": sum(r["images"] for r in runs[name]),
                        "seconds": sum(r["seconds"] for r in runs[name])})
    by_name = {r["loader"]: r["images_per_sec"] for r in results}
    for r in results:
        if "stock" in by_name:
            r["ratio_vs_stock"] = r["images_per_sec"] / by_name["stock"]
        if "decode-only" in by_name:
            r["share_of_decode_only"] = r["images_per_sec"] / by_name["decode-only"]
    return {
        "machine": {"cpu_count": cores, "cpu": _cpu_model(), "device": str(device),
                    "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
                    "python": platform.python_version(), "torch": torch.__version__,
                    "image_library": image_library()},
        "config": {"data": os.path.abspath(args.data), "repeat": args.repeat,
                   "main_threads": args.main_threads,
                   "retain_freed_memory": args.retain_freed_memory,
                   "batch_size": b, "workers": j,
                   "batches": args.batches, "warmup": args.warmup, "rounds": args.rounds},
        "results": results,
    }


def _has_dali() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def write_chart(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    names = [r["loader"] for r in results]
    values = [r["images_per_sec_per_core"] for r in results]
    fig, ax = plt.subplots(figsize=(8, 4))
    bars = ax.bar(names, values, color=["#999999" if n.startswith(("stock", "decode-only")) else "#2a7ab9"
                                        for n in names])
    ax.bar_label(bars, fmt="%.0f")
    ax.tick_params(axis="x", labelrotation=20)
    machine = report["machine"]
    ax.set_ylabel("images/s per core")
    ax.set_title(f"Training loaders, batch {report['config']['batch_size']}, "
                 f"{report['config']['workers']} workers, {machine['cpu_count']} cores",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(report: dict) -> None:
    print("\n| loader | images/s | per core | vs stock | of decode-only |\n|---|---|---|---|---|")
    for r in report["results"]:
        print(f"| {r['loader']} | {r['images_per_sec']:.1f} | {r['images_per_sec_per_core']:.1f} "
              f"| {r.get('ratio_vs_stock', float('nan')):.2f}x "
              f"| {100 * r.get('share_of_decode_only', float('nan')):.0f}% |")


def main_cli(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.path.join("..", "shared", "data", "imagenet-sample"),
                        help="ImageNet-layout root with train/ and val/")
    parser.add_argument("--out", default="bench-output", help="report.json and chart.png go here")
    parser.add_argument("-b", "--batch-size", type=int, default=32)
    parser.add_argument("-j", "--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--batches", type=int, default=100, help="timed batches per pipeline")
    parser.add_argument("--warmup", type=int, default=20,
                        help="untimed batches first: worker start-up and the first touch of "
                        "shared memory, which an epoch of thousands of batches pays once")
    parser.add_argument("--repeat", type=int, default=16,
                        help="each image appears this many times (symlinks), so an epoch "
                        "outlasts the timed batches")
    parser.add_argument("--rounds", type=int, default=5,
                        help="interleaved repetitions; the median is reported")
    parser.add_argument("--main-threads", type=int, default=1,
                        help="torch intra-op threads of this (the main) process")
    parser.add_argument("--only", nargs="*", help="run only these pipelines")
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.join(args.data, "train")):
        print(f"bench_loaders.py: error: {args.data}/train: no such directory", file=sys.stderr)
        return 1
    report = run(args)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    write_chart(report, os.path.join(args.out, "chart.png"))
    print_table(report)
    print(f"\nwrote {args.out}/report.json and {args.out}/chart.png")
    return 0


if __name__ == "__main__":
    sys.exit(main_cli())
