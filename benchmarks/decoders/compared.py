"""Image decoders side by side on the same JPEGs, one thread: whole images, then crop windows.

Each row gives CPU ms per image in every interleaved round, the median, and the largest and
mean absolute difference (levels, 0-255) from a reference: :func:`whole_rows`, then
:func:`crop_rows`. Torch runs 1 thread.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import os
import sys
import time

import torch

import decode
from benchmarks import runner
from decode import headers, jpeg, libraries
from loaders.transforms import random_resized_crop_params

def time_rows(rows: dict, run_row, rounds: int) -> dict[str, list[tuple[float, float]]]:
    """``{name: [(wall, CPU) ms per image, one per round]}`` from ``run_row(name)``,
    interleaved in reverse order on odd rounds."""
    return runner.interleave(rows, run_row, rounds, alternate=True)


def per_image_ms(fn, items, repeats: int, calls_per_pass: int | None = None) -> tuple[float, float]:
    """(wall, CPU) ms per item of ``fn(*item)`` over ``repeats`` passes. CPU time is the
    process's (every thread), so it counts a library's own threads and hardly a neighbour's
    load. With ``calls_per_pass`` (a batch API), ``fn()`` runs once a pass for all items."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(repeats):
        if calls_per_pass:
            fn()
        else:
            for item in items:
                fn(*item)
    count = repeats * len(items)
    return 1e3 * (time.perf_counter() - wall) / count, 1e3 * (time.process_time() - cpu) / count


def summary(rounds: list[tuple[float, float]]) -> tuple[str, float, float]:
    """(CPU ms of every round, median CPU ms, median wall ms)."""
    return (" ".join(f"{c:.3f}" for _, c in rounds), runner.median(c for _, c in rounds),
            runner.median(w for w, _ in rounds))


def differences(outputs: list[torch.Tensor], reference: list[torch.Tensor]) -> tuple[int, float]:
    """(largest, mean) absolute difference over all images; 255 if any shape differs."""
    worst, total, count = 0, 0.0, 0
    for out, ref in zip(outputs, reference):
        if out is None or tuple(out.shape) != tuple(ref.shape):
            return 255, 255.0
        diff = (out.int() - ref.int()).abs()
        worst, total = max(worst, int(diff.max())), total + float(diff.sum())
        count += diff.numel()
    return worst, total / max(count, 1)


def load_jpegcrop(path: str):
    """``(jpeg_size, decode_window)`` over a build of an ABI-2 ``decode/jpeg/_jpegcrop.c``
    (``git show 5256e47:decode/_jpegcrop.c``; ``jc_header``, ``jc_decode_window``). Raises
    OSError / AttributeError / ValueError."""
    lib = ctypes.CDLL(os.path.abspath(path))
    lib.jc_header.restype = lib.jc_decode_window.restype = ctypes.c_int
    if lib.jc_version() != 2:
        raise ValueError(f"{path}: jc_version() {lib.jc_version()}, expected 2")

    def size(data):
        w, h, c = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        lib.jc_header(data, len(data), ctypes.byref(w), ctypes.byref(h), ctypes.byref(c))
        return h.value, w.value

    def window(data, top, left, height, width):
        capacity = height * (width + 64) * 3  # whole iMCU columns, 32 px each side at most
        out = torch.empty(capacity, dtype=torch.uint8)
        if lib.jc_decode_window(data, len(data), left, top, width, height,
                                ctypes.c_void_p(out.data_ptr()), ctypes.c_ulong(capacity)) != 0:
            return None
        return out[:height * width * 3].view(height, width, 3).permute(2, 0, 1)

    return size, window


def dali_slicer(blobs: list[bytes], boxes: list[tuple]):
    """A function running DALI's CPU ``fn.decoders.image_slice`` over every image once (one
    synchronous batch, 1 thread) and returning the windows as uint8 ``(3, h, w)`` tensors."""
    import numpy as np
    from nvidia.dali import fn, pipeline_def, types

    encoded = [np.frombuffer(b, dtype=np.uint8) for b in blobs]
    anchors = [np.array([left, top], dtype=np.int32) for top, left, _, _ in boxes]  # x, y
    shapes = [np.array([w, h], dtype=np.int32) for _, _, h, w in boxes]

    @pipeline_def(batch_size=len(blobs), num_threads=1, device_id=None, exec_async=False,
                  exec_pipelined=False, prefetch_queue_depth=1)
    def graph():
        data = fn.external_source(source=lambda: encoded, dtype=types.UINT8)
        anchor = fn.external_source(source=lambda: anchors, dtype=types.INT32)
        shape = fn.external_source(source=lambda: shapes, dtype=types.INT32)
        return fn.decoders.image_slice(data, anchor, shape, device="cpu", output_type=types.RGB,
                                       normalized_anchor=False, normalized_shape=False,
                                       axis_names="WH", adjust_orientation=False)

    pipe = graph()
    pipe.build()

    def run():
        (out,) = pipe.run()
        return [torch.from_numpy(np.array(out[i])).permute(2, 0, 1) for i in range(len(blobs))]

    return run


def whole_rows(blobs: list[bytes], args) -> None:
    """Print the *Whole images* table: ``decode.libraries.decode_jpeg`` to RGB uint8
    ``(3, H, W)`` with each usable library, then ``decode_jpeg_luma`` (the converters' check)."""
    keys = libraries.backends()
    items = [(b,) for b in blobs]
    default = libraries.use(keys[0])  # the process's own choice, restored below
    libraries.use(default)
    reference = [libraries.decode_jpeg(b) for b in blobs]

    luma = f"{default} luma"  # decode_jpeg_luma: the converters' check

    def run(key):
        libraries.use(default if key == luma else key)
        decode = libraries.decode_jpeg_luma if key == luma else libraries.decode_jpeg
        return per_image_ms(decode, items, args.repeats)

    times = time_rows(dict.fromkeys(keys + [luma]), run, args.rounds)
    print(f"\nWhole images: decode_jpeg -> RGB uint8, {len(blobs)} JPEGs, 1 thread, "
          f"{args.rounds} interleaved rounds (default here: {default})")
    print(f"  {'library':<16} {'CPU ms/image, every round':<56} {'CPU':>6} {'wall':>6} "
          f"{'img/s/core':>10} {'vs default max|mean':>20}")
    for key in keys:
        libraries.use(key)
        worst, mean = differences([libraries.decode_jpeg(b) for b in blobs], reference)
        rounds, cpu, wall = summary(times[key])
        print(f"  {key:<16} {rounds:<56} {cpu:6.3f} {wall:6.3f} {1e3 / cpu:10.0f} "
              f"{worst:>11d} | {mean:.4f}")
    libraries.use(default)
    rounds, cpu, wall = summary(times[luma])
    print(f"  {luma:<16} {rounds:<56} {cpu:6.3f} {wall:6.3f} {1e3 / cpu:10.0f} "
          f"{'(1 channel: Y)':>20}")


def _region(data: bytes, top: int, left: int, height: int, width: int):
    """The window through ``decode.jpeg.region`` at scale 1/1, as uint8 ``(3, h, w)``."""
    pixels = jpeg.region.decode_region(data, 1, top, left, height, width)
    return None if pixels is None else torch.from_numpy(pixels).permute(2, 0, 1)


def crop_functions(blobs, boxes, args) -> dict:
    """``{row name: per-image function (data, top, left, h, w) -> tensor}``; a row whose
    library is missing maps to the reason (str)."""
    rows = {}
    if args.jpegcrop_so:
        try:
            size, window = load_jpegcrop(args.jpegcrop_so)
            rows["_jpegcrop.c (former)"] = lambda d, *box: (size(d), window(d, *box))[1]
        except (OSError, AttributeError, ValueError) as exc:
            rows["_jpegcrop.c (former)"] = f"not loaded: {exc}"
    rows["nvImageCodec CPU (loaders)"] = (
        (lambda d, *box: (decode.window_size(d), jpeg.window.decode_window(d, *box))[1])
        if jpeg.window.available() else jpeg.window.status())
    rows["_jpegcrop.so at 1/1"] = (  # the loaders' C, which they use for scaled windows
        (lambda d, *box: (jpeg.region.jpeg_size(d), _region(d, *box))[1])
        if jpeg.region.available() else jpeg.region.status())
    try:
        rows["DALI CPU image_slice"] = dali_slicer(blobs, boxes)
    except Exception as exc:  # noqa: BLE001 - DALI missing or refusing: report, go on
        rows["DALI CPU image_slice"] = f"not run: {type(exc).__name__}: {exc}"
    rows["whole decode + crop"] = lambda d, t, l, h, w: libraries.decode_jpeg(d)[:, t:t + h,
                                                                               l:l + w]
    return rows


def crop_rows(blobs: list[bytes], args) -> None:
    """Print the *Crop windows* table: every crop decoder (:func:`crop_functions`) on the same
    RandomResizedCrop(224) windows (seed 0), against the crop of a whole decode."""
    torch.manual_seed(0)
    boxes = []
    for data in blobs:
        height, width = libraries.decode_jpeg(data).shape[-2:]
        boxes.append(random_resized_crop_params(height, width, (0.08, 1.0), (3 / 4, 4 / 3),
                                                torch.rand(41).tolist()))
    rows = crop_functions(blobs, boxes, args)
    usable = {name: fn for name, fn in rows.items() if not isinstance(fn, str)}
    items = [(b, *box) for b, box in zip(blobs, boxes)]

    def run(name):
        batch = len(items) if name == "DALI CPU image_slice" else None
        return per_image_ms(usable[name], items, args.repeats, batch)

    times = time_rows(usable, run, args.rounds)
    whole = [libraries.decode_jpeg(b)[:, t:t + h, l:l + w] for b, (t, l, h, w) in zip(blobs, boxes)]
    outputs = {name: (fn() if name == "DALI CPU image_slice" else [fn(*item) for item in items])
               for name, fn in usable.items()}
    first = next(iter(usable), None)
    print(f"\nCrop windows: RandomResizedCrop(224) windows (seed 0), {len(blobs)} JPEGs, "
          f"1 thread, {args.rounds} interleaved rounds")
    print(f"  {'decoder':<26} {'CPU ms/image, every round':<56} {'CPU':>6} {'wall':>6} "
          f"{'ratio':>6} {'vs whole max|mean':>18} {'vs 1st max':>10}")
    for name, fn in rows.items():
        if isinstance(fn, str):
            print(f"  {name:<26} {fn}")
            continue
        rounds, cpu, wall = summary(times[name])
        ratio = cpu / summary(times[first])[1]
        worst, mean = differences(outputs[name], whole)
        vs_first, _ = differences(outputs[name], outputs[first])
        print(f"  {name:<26} {rounds:<56} {cpu:6.3f} {wall:6.3f} {ratio:6.3f} {worst:>9d} | "
              f"{mean:.4f} {vs_first:>10d}")
    print(f"  {'PyTurboJPEG':<26} {pyturbojpeg_note()}")


def pyturbojpeg_note() -> str:
    """Why PyTurboJPEG has no row: its ``decode`` takes no cropping region (only ``crop``, a
    lossless transform to a new JPEG), and it needs libturbojpeg >= 3.0."""
    try:
        from turbojpeg import TurboJPEG

        TurboJPEG()
        usable = "installed"
    except Exception as exc:  # noqa: BLE001 - ImportError, or its library missing / too old
        usable = f"not usable here ({type(exc).__name__}: {str(exc).splitlines()[0]})"
    return (f"no row: its decode() takes no cropping region (crop() is a lossless JPEG "
            f"transform); {usable}")


def main_cli(argv=None) -> int:
    """Command line: 0 when both tables are printed, 1 with one ``error:`` line for bad data."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.decoders.compared",
                                     description=__doc__.splitlines()[0])
    runner.add_data_option(parser, "a folder with train/CLASS/FILE images")
    runner.add_rounds_option(parser, 7)
    parser.add_argument("--repeats", type=int, default=2, help="passes over the images a round")
    parser.add_argument("--jpegcrop-so", help="a build of the former decode/jpeg/_jpegcrop.c")
    args = parser.parse_args(argv)
    files = sorted(glob.glob(os.path.join(args.data, "train", "*", "*")))
    blobs = []
    for path in files:
        with open(path, "rb") as f:
            data = f.read()
        if data[:3] == headers.JPEG_MAGIC:
            blobs.append(data)
    if not blobs:
        return runner.error("benchmarks.decoders.compared", f"no JPEGs under {args.data}/train/*/")
    torch.set_num_threads(1)
    print(f"whole-image decoder: {libraries.decoder_name()}; {decode.crop_decoder_status()}")
    whole_rows(blobs, args)
    crop_rows(blobs, args)
    return 0


if __name__ == "__main__":
    sys.exit(main_cli())
