"""torchvision's recipes through main.py: the targets, measured and printed.

Four parts (``--only`` picks some), each with its target: :func:`throughput` (the augmented
loader at >= 70% of the plain one's images/s), :func:`exact` (no image whose pixels differ
from torchvision's), :func:`costs` (figures only) and :func:`command` (it trains: exit status 0,
a finite loss). ``--data`` is replicated ``--copies`` times, so that an epoch outlasts the timed
batches and RASampler (256 images at least) has one.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
import time

import torch

from benchmarks import runner
from engine.distributed.processes import free_port
from engine.settings import node_cores

# torchvision's ResNet-50 IMAGENET1K_V2 command (its weights' recipe), train.py -> main.py
TORCHVISION_R50_V2 = (
    "--model resnet50 --batch-size 128 --lr 0.5 --lr-scheduler cosineannealinglr "
    "--lr-warmup-epochs 5 --lr-warmup-method linear --auto-augment ta_wide --epochs 600 "
    "--random-erase 0.1 --weight-decay 0.00002 --norm-weight-decay 0.0 --label-smoothing 0.1 "
    "--mixup-alpha 0.2 --cutmix-alpha 1.0 --train-crop-size 176 --model-ema "
    "--val-resize-size 232 --ra-sampler --ra-reps 4").split()
RECIPE_AUGMENT = ["--auto-augment", "ta_wide", "--random-erase", "0.1"]
PARTS = ("throughput", "exact", "costs", "command")


def throughput(data: str, args) -> dict:
    """``main.py --benchmark-data`` images/s at ``--crop`` px without and with the ResNet-50
    v2 recipe's ``--auto-augment ta_wide --random-erase 0.1``, medians of interleaved rounds."""
    base = ["main.py", data, "--benchmark-data", "--train-crop-size", str(args.crop), "-b",
            str(args.batch_size), "-j", str(args.workers), "--train-batches",
            str(args.batches), "--benchmark-warmup", str(args.warmup), "--seed", "0"]
    rows = {"plain": [], "ta_wide + random-erase 0.1": RECIPE_AUGMENT}

    def measure(name):
        return runner.run_json_process(name, [sys.executable, *base, *rows[name]],
                                       timeout=900)["images_per_sec"]

    speeds = runner.interleave(rows, measure, args.rounds, alternate=True)
    plain, augmented = (runner.median(speeds[name]) for name in rows)
    return {"plain": plain, "augmented": augmented, "ratio": augmented / plain,
            "rounds": speeds, "target": 0.70, "met": augmented / plain >= 0.70}


def _crops(data: str, count: int, size: int) -> list:
    from loaders.transforms import TrainTransform

    files = sorted(glob.glob(os.path.join(data, "train", "*", "*")))[:count]
    torch.manual_seed(0)
    transform = TrainTransform(size)
    return [transform(open(f, "rb").read()) for f in files]


def exact(data: str, args) -> dict:
    """Images (of ``--draws`` per policy) where ours and torchvision's ``transforms.v2`` policy
    or ``RandomErasing``'s erase differ anywhere, on the same crops with the same draws."""
    from torchvision.transforms import v2
    from torchvision.transforms.v2 import functional as F

    from loaders.transforms.erasing import RandomErasing
    from loaders.transforms.auto_augment import POLICIES, make_auto_augment

    crops = _crops(data, 50, args.crop)
    mode = v2.InterpolationMode.BILINEAR
    theirs = {"ta_wide": v2.TrivialAugmentWide(interpolation=mode),
              "ra": v2.RandAugment(interpolation=mode), "augmix": v2.AugMix(interpolation=mode)}
    out = {}
    for policy in POLICIES:
        ours = make_auto_augment(policy)
        reference = theirs.get(policy) or v2.AutoAugment(v2.AutoAugmentPolicy(policy),
                                                         interpolation=mode)
        differ = 0
        for seed in range(args.draws):
            crop = crops[seed % len(crops)]
            torch.manual_seed(seed)
            got = ours(crop)
            torch.manual_seed(seed)
            differ += not torch.equal(got, reference(crop))
        out[policy] = {"images": args.draws, "differ": differ}
    images = torch.stack([c.float() for c in crops])
    erasing = RandomErasing(1.0, seed=0, rank=0)
    boxes = erasing.boxes(0, 0, len(crops), *images.shape[-2:])
    erased = erasing(images.clone(), 0, 0)
    differ = sum(not torch.equal(e, F.erase(i, *b, v=torch.zeros(3, 1, 1)) if b else i)
                 for e, i, b in zip(erased, images, boxes))
    out["random_erase"] = {"images": len(crops), "differ": differ}
    return out


def _ms(fn, items, repeats: int = 2) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        for item in items:
            fn(item)
    return 1e3 * (time.perf_counter() - start) / (repeats * len(items))


def costs(data: str, args) -> dict:
    """Per-image CPU ms, one thread: each recipe's training transform (pytorch/examples, FFCV,
    torchvision v2), then each op, ours against torchvision's kernel."""
    from torchvision.transforms import v2

    from loaders.transforms.auto_augment import OPS, make_auto_augment
    from loaders.transforms import TrainTransform

    torch.set_num_threads(1)
    files = sorted(glob.glob(os.path.join(data, "train", "*", "*")))[:args.images]
    blobs = [open(f, "rb").read() for f in files]
    recipes = {
        "pytorch/examples: RandomResizedCrop 224 + flip": TrainTransform(224),
        "FFCV: RandomResizedCrop 160 + flip (first epochs)": TrainTransform(160),
        "FFCV: RandomResizedCrop 192 + flip (last epochs)": TrainTransform(192),
        "torchvision v2 (ResNet-50, ConvNeXt): 176 + flip + TrivialAugmentWide":
            TrainTransform(176, augment=make_auto_augment("ta_wide")),
        "torchvision ViT: 224 + flip + RandAugment": TrainTransform(
            224, augment=make_auto_augment("ra")),
        "torchvision MobileNetV3: 224 + flip + AutoAugment imagenet": TrainTransform(
            224, augment=make_auto_augment("imagenet")),
        "224 + flip + AugMix": TrainTransform(224, augment=make_auto_augment("augmix")),
    }
    torch.manual_seed(0)
    table = {name: _ms(transform, blobs) for name, transform in recipes.items()}
    crops = _crops(data, args.images, args.crop)
    reference = v2.TrivialAugmentWide(interpolation=v2.InterpolationMode.BILINEAR)
    ops = {}
    for op in OPS:
        magnitude = {"TranslateX": 20.0, "TranslateY": 20.0, "Rotate": 30.0,
                     "Posterize": 4}.get(op, 0.5)
        ops[op] = (_ms(lambda c: OPS[op](c, magnitude, "bilinear"), crops),
                   _ms(lambda c: reference._apply_image_or_video_transform(
                       c, op, magnitude, v2.InterpolationMode.BILINEAR, reference._fill), crops))
    return {"recipes": table, "ops": ops, "images": len(blobs), "crop": args.crop}


def test_size(args) -> list[str]:
    """The flags after torchvision's command that make it a test (two ranks of ResNet-50 at
    ``-b 128`` outgrow a small machine): one epoch, ``-b --command-batch`` per rank, one
    validation batch, one worker, then ``--command-extra``."""
    return ["--epochs", "1", "-b", str(args.command_batch), "--val-batches", "1", "-j", "1",
            "--seed", "0", *args.command_extra.split()]


def command(data: str, args) -> dict:
    """torchvision's ResNet-50 IMAGENET1K_V2 command verbatim under torchrun on 2 CPU ranks
    (gloo), test-sized after it."""
    import subprocess

    with runner.scratch("bench-recipes-run-") as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
               "--master-port", str(free_port()), "main.py", *TORCHVISION_R50_V2,
               "--data-path", data, *test_size(args), "--output-dir", out]
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=runner.REPO, capture_output=True, text=True,
                              timeout=args.command_timeout)
        seconds = time.perf_counter() - start
        records = []
        if os.path.isfile(os.path.join(out, "metrics.jsonl")):
            with open(os.path.join(out, "metrics.jsonl")) as f:
                records = [json.loads(line) for line in f]
    record = records[-1] if records else {}
    loss = record.get("train_loss")
    met = done.returncode == 0 and loss is not None and math.isfinite(loss)
    return {"command": " ".join(["torchrun", "--nproc_per_node=2", "main.py",
                                 *TORCHVISION_R50_V2]) + " ...",
            "exit_status": done.returncode, "seconds": seconds,
            "train_images": record.get("train_images"), "train_loss": loss,
            "val_ema_acc1": record.get("val_ema_acc1"), "met": met,
            "stderr_tail": (done.stderr.strip().splitlines() or [""])[-1] if not met else ""}


def report(results: dict, args) -> None:
    """Print each part's figures and targets."""
    if "throughput" in results:
        t = results["throughput"]
        print(f"\n--benchmark-data at {args.crop} px, -b {args.batch_size} -j {args.workers}, "
              f"{node_cores()} CPUs, median of {args.rounds} interleaved rounds:")
        print(runner.markdown_table(["loader", "images/s"], [
            ["plain", f"{t['plain']:.1f}"],
            ["--auto-augment ta_wide --random-erase 0.1", f"{t['augmented']:.1f}"]]))
        print(f"ratio {t['ratio']:.2f} (target >= {t['target']:.2f}): "
              f"{'met' if t['met'] else 'NOT met'}")
    if "exact" in results:
        rows = [[name, str(r["images"]), str(r["differ"])] for name, r in results["exact"].items()]
        print("\ntorchvision's own transform, same crops, same draws:")
        print(runner.markdown_table(["policy", "images", "not identical"], rows))
        ok = all(r["differ"] == 0 for r in results["exact"].values())
        print(f"identical pixels everywhere (target): {'met' if ok else 'NOT met'}")
    if "costs" in results:
        c = results["costs"]
        print(f"\nper-image CPU cost, 1 thread, {c['images']} images (ms):")
        print(runner.markdown_table(["training transform", "ms"], [
            [name, f"{ms:.2f}"] for name, ms in c["recipes"].items()]))
        print(runner.markdown_table([f"op at {c['crop']} px", "ours ms", "torchvision ms"], [
            [op, f"{a:.3f}", f"{b:.3f}"] for op, (a, b) in c["ops"].items()]))
    if "command" in results:
        r = results["command"]
        print(f"\n{r['command']}\n  test-sized ({' '.join(test_size(args))}): exit "
              f"status {r['exit_status']}, {r['train_images']} training images, loss "
              f"{r['train_loss']}, EMA top-1 {r['val_ema_acc1']}, {r['seconds']:.0f} s: "
              f"{'trains (target met)' if r['met'] else 'NOT met: ' + r['stderr_tail']}")


def main_cli(argv=None) -> int:
    """Command line: prints the parts' tables; 1 with one error line for bad data."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.training.recipes",
                                     description=__doc__.splitlines()[0])
    runner.add_data_option(parser, "ImageNet-layout folder (the real sample)")
    runner.add_rounds_option(parser, 3)
    runner.add_out_option(parser, "JSON report file")
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--copies", type=int, default=4, help="symlinks per image")
    parser.add_argument("--crop", type=int, default=176, help="training crop side (px)")
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("-j", "--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=12, help="timed batches per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches per run")
    parser.add_argument("--draws", type=int, default=200, help="exact: images per policy")
    parser.add_argument("--images", type=int, default=100, help="costs: images")
    parser.add_argument("--command-batch", type=int, default=32, help="command: -b per rank")
    parser.add_argument("--command-extra", default="",
                        help="command: flags after torchvision's (tests shrink the model)")
    parser.add_argument("--command-timeout", type=float, default=1800)
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.join(args.data, "train")):
        return runner.error("benchmarks.training.recipes", f"{args.data}/train: no such directory")
    results = {}
    with runner.scratch("bench-recipes-") as tmp:
        data = runner.replicate(args.data, os.path.join(tmp, "data"), args.copies)
        runner.warm_page_cache(args.data)
        for part in PARTS:
            if part in args.only:
                source = data if part in ("throughput", "command") else args.data
                results[part] = globals()[part](source, args)
    report(results, args)
    if args.out:
        runner.write_json(args.out, {"data": args.data, "copies": args.copies,
                                     "cpu_count": node_cores(), **results})
    return 0


if __name__ == "__main__":
    sys.exit(main_cli())
