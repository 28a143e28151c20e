"""Per-image cost of each CPU step, one thread, no DataLoader: where a training sample's time goes.

Prints ms per image for: PIL and ``decode.libraries`` decodes, decoding only the
RandomResizedCrop window (nvImageCodec), PIL's RandomResizedCrop(224) resize, the same crop
resized as a uint8 tensor (ours), ToTensor + Normalize, and the whole stock and our training
transforms (ours also with full decoding, and with and without ``decode/jpeg/_jpegcrop.so``).
"""
from __future__ import annotations

import argparse
import glob
import io
import os
import sys
import time

import torch
from PIL import Image
from torchvision import transforms

from benchmarks import runner
from decode import decode, jpeg, libraries, resize
from loaders.transforms import TrainTransform, ValTransform


def per_image_ms(fn, items, repeats: int = 2) -> float:
    """Wall milliseconds per item of ``fn(item)`` over ``repeats`` passes."""
    start = time.perf_counter()
    for _ in range(repeats):
        for item in items:
            fn(item)
    return 1e3 * (time.perf_counter() - start) / (repeats * len(items))


def main(argv=None) -> None:
    """Command line: prints the table; exits with one ``error:`` line without images."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loading.transforms",
                                     description=__doc__.splitlines()[0])
    runner.add_data_option(parser, "ImageNet-layout folder (train/<wnid>/*.JPEG)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    files = sorted(glob.glob(os.path.join(args.data, "train", "*", "*")))
    if not files:
        sys.exit(f"benchmarks.loading.transforms: error: no images under {args.data}/train")
    blobs = [open(f, "rb").read() for f in files]
    pil = [Image.open(io.BytesIO(b)).convert("RGB") for b in blobs]
    tensors = [decode(b) for b in blobs]
    boxes = [transforms.RandomResizedCrop.get_params(im, (0.08, 1.0), (3 / 4, 4 / 3)) for im in pil]
    normalize = transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    stock = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                                transforms.ToTensor(), normalize])
    crops = [transforms.functional.resized_crop(im, *box, [224, 224]) for im, box in zip(pil, boxes)]
    k = list(range(len(files)))
    rows = [
        ("decode, PIL", per_image_ms(lambda i: Image.open(io.BytesIO(blobs[i])).convert("RGB"), k)),
        (f"decode, {libraries.decoder_name()}", per_image_ms(lambda i: decode(blobs[i]), k)),
        ("crop + resize 224, PIL", per_image_ms(
            lambda i: transforms.functional.resized_crop(pil[i], *boxes[i], [224, 224]), k)),
        ("crop + resize 224, uint8 tensor (ours)", per_image_ms(
            lambda i: resize(tensors[i][:, boxes[i][0]:boxes[i][0] + boxes[i][2],
                                        boxes[i][1]:boxes[i][1] + boxes[i][3]], (224, 224)), k)),
        ("ToTensor + Normalize (stock only)", per_image_ms(
            lambda i: normalize(transforms.functional.to_tensor(crops[i])), k)),
        ("whole training transform, stock", per_image_ms(
            lambda i: stock(Image.open(io.BytesIO(blobs[i])).convert("RGB")), k)),
        ("whole training transform, ours", per_image_ms(lambda i: TrainTransform()(blobs[i]), k)),
    ]
    if jpeg.window.available():
        rows.insert(2, ("decode the crop window only (nvImageCodec)", per_image_ms(
            lambda i: jpeg.window.decode_window(blobs[i], *boxes[i]), k)))
        jpeg.window.set_enabled(False)
        rows.append(("whole training transform, ours, full decode",
                     per_image_ms(lambda i: TrainTransform()(blobs[i]), k)))
        jpeg.window.set_enabled(True)
    if jpeg.region.available():  # alternating, so both see the same machine
        for name, transform in (("train transform 160 px", TrainTransform(160)),
                                ("train transform 224 px", TrainTransform(224)),
                                ("val transform 256/224", ValTransform(256, 224))):
            ours, off = [], []
            for _ in range(3):
                ours.append(per_image_ms(lambda i: transform(blobs[i]), k))
                jpeg.region.set_enabled(False)
                off.append(per_image_ms(lambda i: transform(blobs[i]), k))
                jpeg.region.set_enabled(True)
            rows.append((f"{name}, ours (median of 3)", runner.median(ours)))
            rows.append(("  the same, crop + scale off", runner.median(off)))
    else:
        print(jpeg.region.status())
    print(f"{len(files)} images from {args.data}/train, 1 thread, ms per image")
    for name, ms in rows:
        print(f"  {name:<44} {ms:6.2f}")


if __name__ == "__main__":
    main()
