"""Side-by-side training-loader throughput on the same JPEGs, each pipeline in its own process.

Each pipeline runs in a fresh process with the same ``-b``, ``-j``, images and timing
(``loaders.measure_throughput``): ``stock`` (:func:`stock_loader`), ``decode-only`` (the
decoding ceiling on this CPU, :class:`_DecodeOnly`) and each of our loaders as users run them,
``main.py --benchmark-data``. Writes ``OUT/report.json`` and ``OUT/chart.png`` (medians of the
interleaved rounds, ratios to stock) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets, transforms

import decode
import folder2lmdb
import folder2shards
import loaders
from benchmarks import runner
from benchmarks.runner import REPO
from engine.settings import node_cores
from loaders.readers.folder import read_file

BASELINES = ("stock", "decode-only", "decode-only-pil")


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
    """The pytorch/examples imagenet/main.py training pipeline, unchanged: float32 batches of
    shape (B, 3, 224, 224) on ``device``."""
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    dataset = datasets.ImageFolder(root, transforms.Compose([
        transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(), normalize]))
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                        pin_memory=device.type == "cuda", drop_last=True)
    return _DeviceCopy(loader, device)


class _DecodeOnly(Dataset):
    """Reads and fully decodes each file to RGB (``decode.decode``, or PIL), returning only
    its label."""

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
            decode.decode(read_file(path))
        return 0, label


def decode_only_loader(root: str, batch_size: int, workers: int, use_pil: bool = False):
    """The decode-only baseline: :class:`_DecodeOnly` in the stock pipeline's DataLoader."""
    return DataLoader(_DecodeOnly(root, use_pil), batch_size=batch_size, shuffle=True,
                      num_workers=workers, drop_last=True)


def main_loader(argv: list[str]):
    """The training loader ``main.py argv`` builds in this process, through main.py's parser
    and :func:`engine.settings.resolve_settings` (pass ``--seed`` so no seed is drawn)."""
    import main
    from engine.distributed.processes import Job, resolve_device
    from engine.settings import resolve_settings

    args = main.parse_args(argv)
    job = Job(loaders.DistInfo(device=resolve_device(args.gpu, args.no_accel)))
    settings = resolve_settings(args, job, None)
    return loaders.build_loaders(settings.loader, settings.dist)[0]


def run(args) -> dict:
    """Build the copies and LMDBs in a temporary folder, measure, and remove the folder."""
    with runner.scratch("bench-loaders-") as tmp:
        return _run(args, tmp)


def commands(args, data: str, lmdb_root: str, has_cuda: bool,
             shard_roots: tuple[str, str] | None = None) -> dict[str, list[str]]:
    """Each pipeline's command line: this script's ``--baseline`` mode for the baselines,
    ``main.py --benchmark-data`` for ours, all with the same ``-b``, ``-j`` and timing."""
    timing = ["-b", str(args.batch_size), "-j", str(args.workers)]
    base = runner.module_command("benchmarks.loading.throughput", *timing, "--batches",
                                 str(args.batches), "--warmup", str(args.warmup), "--data",
                                 os.path.join(data, "train"), "--baseline")
    tail = [*timing, "--train-batches", str(args.batches), "--benchmark-warmup",
            str(args.warmup), "--seed", "0", "--benchmark-data"]

    def ours(*flags):
        return [sys.executable, os.path.join(REPO, "main.py"), *flags, *tail]

    cmds = {name: [*base, name] for name in BASELINES}
    cmds["folder"] = ours(data)
    cmds["lmdb"] = ours("--lmdb", lmdb_root)
    cmds["lmdb-readahead-off"] = ours("--lmdb", lmdb_root, "--lmdb-readahead", "off")
    if shard_roots:  # the local shard folder, and the same served over loopback HTTP
        cmds["shards"] = ours("--loader", "shards", shard_roots[0])
        cmds["shards-http"] = ours("--loader", "shards", shard_roots[1])
    if _has_dali():
        cmds["dali-cpu"] = ours("--dali", "--dali-cpu", data)
        if has_cuda:
            cmds["dali-mixed"] = ours("--dali", data)
    return {name: cmd for name, cmd in cmds.items() if not args.only or name in args.only}


def _run(args, tmp: str) -> dict:
    has_cuda = torch.cuda.is_available()
    images = _image_count(os.path.join(args.data, "train"))
    cores = node_cores()
    args.repeat = runner.steady_copies(images, args.batch_size, args.warmup,
                                       args.batches, args.repeat or 1)
    data = runner.replicate(args.data, os.path.join(tmp, "jpeg"), args.repeat)
    runner.warm_page_cache(os.path.join(data, "train"))
    lmdb_root, shard_root = os.path.join(tmp, "lmdb"), os.path.join(tmp, "shards")
    for split in ("train", "val"):
        folder2lmdb.convert(os.path.join(data, split), os.path.join(lmdb_root, split),
                            progress=False)
        folder2shards.convert(os.path.join(data, split), os.path.join(shard_root, split),
                              max_per_shard=args.shard_records, progress=False)
    server = serve_http(tmp)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/shards"
        cmds = commands(args, data, lmdb_root, has_cuda, (shard_root, url))

        def progress(round_: int, name: str, stats: dict) -> None:
            print(f"round {round_ + 1}: {name:>18} {stats['images_per_sec']:8.1f} images/s",
                  flush=True)

        runs = runner.interleave(
            cmds, lambda name: runner.run_json_process(name, cmds[name], args.timeout),
            args.rounds, on_result=progress)
    finally:
        server.shutdown()
        server.server_close()
    results = [summarise(name, runs[name], cores) for name in cmds]
    by_name = {r["loader"]: r["images_per_sec"] for r in results}
    for r in results:
        if "stock" in by_name:
            r["ratio_vs_stock"] = r["images_per_sec"] / by_name["stock"]
        if "decode-only" in by_name:
            r["share_of_decode_only"] = r["images_per_sec"] / by_name["decode-only"]
        if r["loader"] not in BASELINES:
            r["command"] = " ".join(_shown(a, tmp) for a in cmds[r["loader"]][1:])
    return {
        "machine": {"cpu_count": cores, "cpu": _cpu_model(),
                    "device": "cuda" if has_cuda else "cpu",
                    "gpu": torch.cuda.get_device_name() if has_cuda else None,
                    "python": platform.python_version(), "torch": torch.__version__,
                    "image_library": decode.image_library()},
        "config": {"data": os.path.abspath(args.data), "repeat": args.repeat,
                   "images": images,
                   "batch_size": args.batch_size, "workers": args.workers,
                   "batches": args.batches, "warmup": args.warmup, "rounds": args.rounds,
                   "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
        "results": results,
    }


def serve_http(root: str):
    """A thread serving ``root`` over HTTP on 127.0.0.1 (``python -m http.server``'s handler)
    for the ``shards-http`` pipeline, files sent by ``sendfile``; call ``shutdown()`` when done.
    Silent: no access log, and a client that closes its connection early (a loader's stream at
    the end of its batches: ``ConnectionResetError``, ``BrokenPipeError``) is no error; any other
    failure of a request is one stderr line, never socketserver's traceback."""
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def copyfile(self, source, outputfile):
            # sendfile, not a copy through Python (12 vs 18-28 us of this process's CPU per
            # 108 KB record): a user's shard server is another machine, its CPU not the loader's
            self.connection.sendfile(source)

    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, request, client_address):
            exc = sys.exc_info()[1]
            if not isinstance(exc, ConnectionError):
                print(f"benchmark HTTP server: {type(exc).__name__}: {exc}", file=sys.stderr)

    server = Server(("127.0.0.1", 0), functools.partial(Quiet, directory=root))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def summarise(name: str, stats: list[dict], cores: int) -> dict:
    """Median images/s of one pipeline's rounds, per core, every round, and the median round's
    ``stages_*`` figures (``stages``; empty where none were measured)."""
    speeds = sorted(r["images_per_sec"] for r in stats)
    median = runner.median_high(speeds)
    middle = next(r for r in stats if r["images_per_sec"] == median)
    return {"loader": name, "images_per_sec": median, "images_per_sec_per_core": median / cores,
            "images_per_sec_runs": speeds, "images": sum(r["images"] for r in stats),
            "seconds": sum(r["seconds"] for r in stats),
            "stages": {k: v for k, v in middle.items() if k.startswith("stages_")}}


def top_stage(stages: dict) -> str:
    """The stage with the largest share of the measured stages' time, e.g. ``"decode 69%"``;
    ``"-"`` without stage figures."""
    means = {name: stages.get(f"stages_{name}_ms_mean") for name in
             ("read", "window", "decode", "resize", "augment", "write")}
    means = {name: v for name, v in means.items() if v is not None}
    if not means or not sum(means.values()):
        return "-"
    name = max(means, key=means.get)
    return f"{name} {means[name] / sum(means.values()):.0%}"


def _shown(arg: str, tmp: str) -> str:
    """A command argument as docs/performance.md shows it: the temporary folder as ``DATA``."""
    arg = re.sub(r"http://127\.0\.0\.1:\d+/shards", "http://127.0.0.1:PORT", arg)
    return arg.replace(os.path.join(tmp, "jpeg"), "DATA").replace(
        os.path.join(tmp, "lmdb"), "DATA-LMDB").replace(
        os.path.join(tmp, "shards"), "DATA-SHARDS").replace(REPO + os.sep, "")


def baseline(args) -> int:
    """``--baseline NAME``: time one baseline in this process and print its JSON line; glibc
    keeps freed memory as in ``main.py``, so the stock pipeline pays no page faults ours avoid."""
    decode.retain_freed_memory()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    b, j = args.batch_size, args.workers
    if args.baseline == "stock":
        loader = stock_loader(args.data, b, j, device)
    else:
        loader = decode_only_loader(args.data, b, j, use_pil=args.baseline == "decode-only-pil")
    print(json.dumps(loaders.measure_throughput(loader, args.batches, args.warmup)), flush=True)
    return 0


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


def _image_count(train: str) -> int | None:
    """JPEGs (files) under ``train``, the image set's size for the chart's title."""
    if not os.path.isdir(train):
        return None
    return sum(len(files) for _, _, files in os.walk(train))


def ffcv_beside(out: str, data: str) -> dict | None:
    """``make bench-ffcv``'s report (``OUT/ffcv/report.json``) when it timed the same image
    set as this run, else None."""
    path = os.path.join(out, "ffcv", "report.json")
    try:
        with open(path) as f:
            ffcv = json.load(f)
    except (OSError, ValueError):
        return None
    image_set = ffcv.get("image_set", {})
    same = image_set.get("data") == os.path.abspath(data) and image_set.get("bucket") == "all"
    return ffcv if same and not image_set.get("larger_than") else None


def _ffcv_panel(ax, ffcv: dict) -> None:
    """FFCV 1.0.2 beside ours on the same stored bytes (JPEGs capped at 512 px, q90) at the
    largest size ``make bench-ffcv`` timed: its own image set, so its own panel."""
    sizes = sorted(ffcv["median"], key=int)
    size = sizes[-1]
    med = ffcv["median"][size]
    shown = [(name, med[key]) for name, key in (("ours, LMDB", "lmdb-512"),
                                                ("FFCV, same bytes", "beton-512"),
                                                ("FFCV example store", "beton-example"))
             if med.get(key)]
    bars = ax.bar([n for n, _ in shown], [v for _, v in shown],
                  color=["#2a7ab9" if n.startswith("ours") else "#d08b2c" for n, _ in shown])
    ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.margins(y=0.18)
    ax.tick_params(axis="x", labelrotation=20)
    ax.set_title(f"FFCV 1.0.2 (make bench-ffcv), 512-px store\n{size} px, "
                 f"x{ffcv['repeat']}, {ffcv['rounds']} rounds", fontsize=9)


def write_chart(report: dict, path: str, ffcv: dict | None = None) -> None:
    """``chart.png``: each pipeline's median images/s (baselines grey, ours blue) with its
    ratio to ``stock``; with ``ffcv`` (:func:`ffcv_beside`), a second panel of FFCV beside ours
    on its capped store (docs/performance.md, *The README's chart*)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    names = [r["loader"] for r in results]
    values = [r["images_per_sec"] for r in results]
    if ffcv is None:
        fig, ax = plt.subplots(figsize=(9, 4.2))
    else:
        fig, (ax, right) = plt.subplots(1, 2, figsize=(13, 4.2),
                                        gridspec_kw={"width_ratios": [3, 1.2]})
        _ffcv_panel(right, ffcv)
    bars = ax.bar(names, values, color=["#999999" if n in BASELINES else "#2a7ab9"
                                        for n in names])
    ax.bar_label(bars, labels=[f"{v:.0f}" + (f"\n{r['ratio_vs_stock']:.2f}x"
                                             if "ratio_vs_stock" in r else "")
                               for v, r in zip(values, results)], fontsize=8)
    ax.margins(y=0.18)
    ax.tick_params(axis="x", labelrotation=20)
    ax.set_ylabel("images/s (median of rounds)")
    machine, config = report["machine"], report["config"]
    images = config.get("images")
    where = os.path.basename(config["data"].rstrip(os.sep))
    shown = (f"{images} training JPEGs x{config['repeat']}" if images
             else f"x{config['repeat']}")
    ax.set_title(f"Training loaders on {where} ({shown}): -b {config['batch_size']} "
                 f"-j {config['workers']}, {config['rounds']} rounds, "
                 f"{machine['cpu_count']} cores ({machine['device']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(report: dict) -> None:
    """The table docs/performance.md quotes: median images/s, per core, and the ratios."""
    rows = [[r["loader"], f"{r['images_per_sec']:.1f}", f"{r['images_per_sec_per_core']:.1f}",
             f"{r.get('ratio_vs_stock', float('nan')):.2f}x",
             f"{100 * r.get('share_of_decode_only', float('nan')):.0f}%",
             top_stage(r.get("stages", {}))]
            for r in report["results"]]
    print("\n" + runner.markdown_table(
        ["loader", "images/s", "per core", "vs stock", "of decode-only", "largest stage"],
        rows))


def main_cli(argv=None) -> int:
    """Command line: 0 when the report is written, 1 with one ``error:`` line otherwise."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loading.throughput",
                                     description=__doc__.splitlines()[0])
    runner.add_data_option(parser, "ImageNet-layout root with train/ and val/")
    runner.add_out_option(parser, "report.json and chart.png go here", default="bench-output")
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("-j", "--workers", type=int, default=node_cores())
    parser.add_argument("--batches", type=int, default=100, help="timed batches per pipeline")
    parser.add_argument("--warmup", type=int, default=20,
                        help="untimed batches first: worker start-up and the first touch of "
                        "shared memory, which an epoch of thousands of batches pays once")
    parser.add_argument("--repeat", type=int,
                        help="each image appears at least this many times (symlinks); more "
                        "where needed so that an epoch outlasts the warm-up and timed batches")
    runner.add_rounds_option(parser, 5)
    parser.add_argument("--only", nargs="*", help="run only these pipelines")
    parser.add_argument("--shard-records", type=int, default=500,
                        help="records per shard of the shards pipelines (folder2shards.py "
                        "--max-per-shard)")
    parser.add_argument("--timeout", type=float, default=900,
                        help="seconds one pipeline's process may take")
    parser.add_argument("--baseline", choices=BASELINES,
                        help="(internal) time this baseline over --data (a train folder)")
    args = parser.parse_args(argv)
    if args.baseline:
        return baseline(args)
    if not os.path.isdir(os.path.join(args.data, "train")):
        return runner.error("benchmarks.loading.throughput",
                            f"{args.data}/train: no such directory")
    try:
        report = run(args)
    except RuntimeError as exc:
        return runner.error("benchmarks.loading.throughput", exc)
    os.makedirs(args.out, exist_ok=True)
    runner.write_json(os.path.join(args.out, "report.json"), report, indent=2)
    write_chart(report, os.path.join(args.out, "chart.png"), ffcv_beside(args.out, args.data))
    print_table(report)
    print(f"\nwrote {args.out}/report.json and {args.out}/chart.png")
    return 0


if __name__ == "__main__":
    sys.exit(main_cli())
