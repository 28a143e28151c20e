"""``make gpu-bundle``: ``.gpu-bundle/``, what the check needs on a GPU host without internet:
``sample/train/<class>/*`` (``sample/val`` a link to it), ``wheels/`` (lmdb, pytest,
nvImageCodec, nvJPEG and their dependencies for CPython ``--python-version`` on manylinux
x86_64), ``wheels-dali/`` (DALI for CUDA ``--cuda``), less numpy; ``--step-size``: in steps."""
import argparse
import importlib.metadata
import itertools
import os
import re
import shutil
import subprocess
import sys

from decode.gpu import nvjpeg_pip_package
from formats.cli import parse_size

from ..rows.measure import list_images
from ..runner import REPO, InputError
from .steps import (DALI_WHEELS, dist_name, folder_bytes, lay_out_steps, repository_bytes,
                    torch_cuda)

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# the GPU host's torch brings numpy; the wheel would only add 16 MB
ALREADY_THERE = ("numpy",)
SAMPLE_IMAGES = 100  # of --data, one per class first


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default=os.path.join(REPO, ".gpu-bundle"), help="bundle folder "
                   "(replaced)")
    p.add_argument("--data", help="image folder with train/<class>/, of which 100 files are "
                   "taken, one per class first (default: generate 10 classes x 10 images)")
    p.add_argument("--cuda", help="CUDA major of the GPU host's torch (default: this torch's, "
                   "else 13)")
    p.add_argument("--no-dali", action="store_true", help="leave out DALI (~190 MiB)")
    p.add_argument("--python-version", default="3.12", help="CPython of the GPU host")
    p.add_argument("--step-size", help="also split the bundle into steps that each fit, with "
                   "the repository's files, a transfer of this size (64M)")
    return p


def pinned(name: str) -> str:
    """``name==version`` of the distribution installed here, else ``name``."""
    try:
        return f"{name}=={importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        return name


def local_cuda_major() -> str:
    return (torch_cuda() or "13").split(".")[0]


def wheel_specs(cuda: str, dali: bool) -> list[str]:
    """Requirement strings to download: versions of this machine's packages where they are
    for the same CUDA major, else pip's choice (DALI pins its own CUDA libraries). nvJPEG is
    only an optional extra of nvImageCodec, without which every GPU decode falls back to the
    CPU."""
    same = cuda == local_cuda_major()
    specs = [pinned("lmdb"), pinned("pytest")] + [pinned(x) if same else x for x in (
        f"nvidia-nvimgcodec-cu{cuda}", nvjpeg_pip_package(cuda))]
    if dali:
        here = [pinned(d) for d in ("nvidia-dali-cuda130", "nvidia-dali-cuda120")]
        version = next((x[x.index("=="):] for x in here if "==" in x), "")
        specs.append(f"nvidia-dali-cuda{cuda}0{version}")
    return specs


def copy_sample(data: str | None, train: str) -> str:
    """Copy :data:`SAMPLE_IMAGES` files of ``DATA/train/<class>/`` into ``train``, the first of
    each class in sorted order, then the second, ...; without ``data``, generate 100
    ImageNet-sized JPEGs (:mod:`tools.datagen`). Returns the line that says so. Raises
    :class:`InputError` when there is no such folder or image."""
    if not data:
        from ...datagen import make_split  # numpy and PIL only here

        make_split(train, 10, 10, seed=0, min_size=320, max_size=500, noise=60, shapes=3)
        return ("gpu-bundle: images: 100 generated JPEGs (320-500 px, tools/datagen.py; pass "
                "DATA=DIR for real images)")
    source = os.path.join(data, "train")
    if not os.path.isdir(source):
        raise InputError(f"--data {data}: no train/ folder")
    ranked = sorted((k, cls, path) for cls, group in itertools.groupby(
        list_images(source), key=lambda x: x[0]) for k, (_, path) in enumerate(group))
    if not ranked:
        raise InputError(f"--data {data}: no images in {source}/<class>/")
    for _, cls, path in ranked[:SAMPLE_IMAGES]:
        os.makedirs(os.path.join(train, cls), exist_ok=True)
        shutil.copy2(path, os.path.join(train, cls))
    classes = len({cls for _, cls, _ in ranked[:SAMPLE_IMAGES]})
    return (f"gpu-bundle: images: {min(SAMPLE_IMAGES, len(ranked))} files in {classes} classes "
            f"from {source}")


def build(args) -> int:
    """Write the bundle; returns the exit status. Raises :class:`InputError`."""
    try:
        step_bytes = parse_size(args.step_size) if args.step_size else None
    except ValueError:
        raise InputError(f"--step-size {args.step_size}: expected a size such as 64M") from None
    cuda = args.cuda or local_cuda_major()
    if not re.fullmatch(r"1[1-9]", cuda):
        raise InputError(f"--cuda {cuda}: expected a CUDA major such as 12 or 13")
    if args.data and not os.path.isdir(args.data):
        raise InputError(f"--data {args.data}: no such directory")
    out = os.path.abspath(args.out)
    shutil.rmtree(out, ignore_errors=True)
    train, wheels = os.path.join(out, "sample", "train"), os.path.join(out, "wheels")
    os.makedirs(train)
    os.makedirs(wheels)
    print(copy_sample(args.data, train), flush=True)
    os.symlink("train", os.path.join(out, "sample", "val"))
    specs = wheel_specs(cuda, not args.no_dali)
    base, dali = [x for x in specs if "dali" not in x], [x for x in specs if "dali" in x]
    print(f"gpu-bundle: wheels for CPython {args.python_version}, CUDA {cuda}: "
          f"{' '.join(specs)} and their dependencies", flush=True)
    # wheels-dali/ (DALI, nvCOMP, nvTIFF, ...) goes in the steps after the first; one
    # version of each distribution, as two stop pip's install
    for wanted, folder in ((base, wheels), (dali, os.path.join(out, DALI_WHEELS))):
        if not wanted:
            continue
        os.makedirs(folder, exist_ok=True)
        if subprocess.run([sys.executable, "-m", "pip", "download", "-q",
                           "--disable-pip-version-check", "--only-binary=:all:",
                           "--python-version", args.python_version, "--implementation", "cp",
                           *(f"--platform={x}" for x in PLATFORMS), "-d", folder,
                           *wanted]).returncode != 0:
            print("gpu-bundle: pip download failed (see above)", file=sys.stderr)
            return 1
        # DALI's folder drops what wheels/ already holds; both drop what the host has
        have = set(ALREADY_THERE) | ({dist_name(n) for n in os.listdir(wheels)}
                                     if folder != wheels else set())
        for name in [n for n in os.listdir(folder) if dist_name(n) in have]:
            os.remove(os.path.join(folder, name))
    dali_dir = os.path.join(out, DALI_WHEELS)
    dali_mib = folder_bytes(dali_dir) / 2**20 if os.path.isdir(dali_dir) else 0
    print(f"gpu-bundle: {out}: {folder_bytes(wheels) / 2**20:.0f} MiB of wheels "
          f"({len(os.listdir(wheels))}), {dali_mib:.0f} MiB of DALI's; on the GPU host: "
          "python3 -m tools.gpu_check [--budget T]", flush=True)
    if step_bytes:
        steps = lay_out_steps(out, repository_bytes(REPO), step_bytes)
        print(f"gpu-bundle: {len(steps)} steps; on the GPU host, from the repository, run the "
              "steps in order, on one host, with the same --out (docs/gpu-check.md):")
        for x in steps:
            print(f"  step {x['step']}: copy {os.path.relpath(out, REPO)}/steps/{x['step']} "
                  f"({x['bytes'] / 2**20:.1f} MiB with the repository), then: python3 -m "
                  f"tools.gpu_check --step {x['step']} [--budget T]")
    return 0


def main_cli(argv=None) -> int:
    """Console entry: 0 when the bundle is written, 1 when pip fails, 2 for bad input."""
    args = get_args_parser().parse_args(argv)
    try:
        return build(args)
    except (InputError, OSError) as exc:
        print(f"gpu-bundle: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main_cli())
