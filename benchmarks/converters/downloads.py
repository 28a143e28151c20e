"""Converting ImageNet as downloaded: the train tar read in place against the extracted class
folders, and every layout's disk space and conversion time per 1,000 images.

The sample's train JPEGs, copied ``--copies`` times, are laid out as each download
(:mod:`tools.replicas`; ``folder`` is the tree itself) and converted in alternating rounds by
``folder2lmdb.convert`` with ``make convert-imagenet``'s flags, timed by its own clock.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys

from benchmarks import runner

LAYOUTS = ("folder", "official", "kaggle", "hf-parquet", "hf-targz")
_MiB = 1 << 20


def replicate(sample: str, target: str, copies: int) -> int:
    """``target/train/<wnid>/<wnid>_<name>_<k>.JPEG``: ``copies`` real copies of every train
    image of ``sample``; returns the number of files."""
    from tools.replicas import train_images

    count = 0
    for wnid, name, path in train_images(sample):
        os.makedirs(os.path.join(target, "train", wnid), exist_ok=True)
        stem, ext = os.path.splitext(name)
        for k in range(copies):
            shutil.copyfile(path, os.path.join(target, "train", wnid, f"{stem}_{k}{ext}"))
            count += 1
    return count


def build(layout: str, replica: str, root: str) -> tuple[str, list[str]]:
    """``(what to pass as --dataset, the layout's train files)`` of ``layout``."""
    from tools import replicas

    if layout == "folder":
        train = os.path.join(replica, "train")
        return replica, glob.glob(os.path.join(train, "*", "*"))
    where = os.path.join(root, layout)
    {"official": replicas.write_official, "kaggle": replicas.write_kaggle,
     "hf-parquet": replicas.write_hf_parquet, "hf-targz": replicas.write_hf_targz}[layout](
        where, replica)
    pattern = {"official": "ILSVRC2012_img_train.tar", "kaggle": "ILSVRC/Data/CLS-LOC/train/*/*",
               "hf-parquet": "data/train-*.parquet", "hf-targz": "data/train_images_*"}[layout]
    return where, glob.glob(os.path.join(where, pattern))


def disk_bytes(paths: list[str]) -> int:
    """Allocated bytes of ``paths`` (``st_blocks``; symbolic links followed)."""
    return sum(os.stat(p).st_blocks * 512 for p in paths)


def folder_bytes(folder: str) -> int:
    """Allocated bytes of every file under ``folder``."""
    return disk_bytes([os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs])


def run(opts: argparse.Namespace, tmp: str) -> dict:
    """Interleaved rounds over ``opts.layouts``: median images/s, the ratio to the first
    layout, and per 1,000 images the train files' allocated MiB, the output's and the staging
    copy's (Parquet and ``.tar.gz`` only)."""
    import folder2lmdb
    from formats.conversion import stage_folder
    from decode import retain_freed_memory

    retain_freed_memory()  # as the command line does
    replica = os.path.join(tmp, "replica")
    images = replicate(opts.sample, replica, opts.copies)
    built = {layout: build(layout, replica, tmp) for layout in opts.layouts}
    out = os.path.join(tmp, "out")
    staged: dict[str, int] = {}

    def convert(layout: str) -> float:
        summary = folder2lmdb.convert(built[layout][0], out, overwrite=True, progress=False,
                                      shuffle_seed=0, split="train", allow_partial=True)
        staged[layout] = summary.bytes if layout.startswith("hf-") else 0
        assert not os.path.exists(stage_folder(out))
        return summary.images / summary.seconds

    def progress(round_: int, rates: dict[str, list[float]]) -> None:
        print(f"round {round_ + 1}/{opts.rounds}: " + ", ".join(
            f"{layout} {values[-1]:.0f}" for layout, values in rates.items()) + " images/s",
            flush=True)

    rates = runner.interleave(built, convert, opts.rounds, alternate=True, on_round=progress)
    output = folder_bytes(out)
    base = runner.median(rates[opts.layouts[0]])
    results = []
    for layout, (_, files) in built.items():
        rate = runner.median(rates[layout])
        results.append({"layout": layout, "images_per_sec": rate, "ratio_to_first": rate / base,
                        "seconds_per_1000": 1000 / rate, "rounds": rates[layout],
                        "mib_per_1000": disk_bytes(files) / images * 1000 / _MiB,
                        "extra_mib_per_1000": staged[layout] / images * 1000 / _MiB})
    return {"images": images, "copies": opts.copies, "output_mib_per_1000":
            output / images * 1000 / _MiB, "results": results}


def print_report(report: dict, first: str) -> None:
    """The table docs/downloads.md quotes: images/s, the ratio to ``first``, disk per 1,000."""
    print(f"\n{report['images']} images ({report['copies']} copies of the sample), train "
          f"split, folder2lmdb.convert defaults, medians; output LMDB "
          f"{report['output_mib_per_1000']:.1f} MiB per 1,000 images")
    print(f"{'layout':<12} {'images/s':>9} {'vs ' + first:>10} {'s/1000':>7} "
          f"{'MiB/1000':>9} {'extra MiB/1000':>15}")
    for r in report["results"]:
        print(f"{r['layout']:<12} {r['images_per_sec']:>9.0f} {r['ratio_to_first']:>10.1%} "
              f"{r['seconds_per_1000']:>7.2f} {r['mib_per_1000']:>9.1f} "
              f"{r['extra_mib_per_1000']:>15.1f}")


def main(argv=None) -> int:
    """Command line: 0 when the report is printed, 1 with one ``error:`` line, 2 for a
    ``--sample`` without ``train/``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.converters.downloads",
                                     description=__doc__.split("\n\n")[0])
    runner.add_data_option(parser, "ImageNet-layout folder whose train/<wnid>/ JPEGs are "
                           "replicated", flag="--sample")
    parser.add_argument("--copies", type=int, default=8, help="copies of each image (default 8)")
    runner.add_rounds_option(parser, 6)
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=LAYOUTS,
                        help="layouts to convert; ratios are to the first (default: all)")
    parser.add_argument("--tmp", help="folder for the replicas and output (default: a new "
                                      "temporary folder, deleted afterwards)")
    runner.add_out_option(parser, "also write the report as JSON here")
    opts = parser.parse_args(argv)
    if not os.path.isdir(os.path.join(opts.sample, "train")):
        parser.error(f"{opts.sample}: no train/ (an ImageNet-layout folder)")
    from formats.conversion import ConversionError
    from formats.sources import DatasetError

    try:
        with runner.scratch("bench_downloads_", dir=opts.tmp) as tmp:
            report = run(opts, tmp)
    except (ConversionError, DatasetError, OSError) as exc:
        return runner.error("benchmarks.converters.downloads", exc)
    print_report(report, opts.layouts[0])
    if opts.out:
        runner.write_json(opts.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
