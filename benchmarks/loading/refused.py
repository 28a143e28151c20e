"""The acceptance rule's targets, through ``main.py`` as users run it: a 65,000 x 65,000-claiming
JPEG and a one-bit height flip among 1,000 good ImageNet-sized JPEGs, read by every loader: the
folder, an LMDB and shards damaged after conversion (as on a failing disk), DALI on the CPU and
``--decode-device cpu-nvimgcodec``. Targets: each skipped in under a second with one line
naming it (no raw libjpeg line), no process above its usual size plus 200 MB.

Each row runs two epochs in a fresh process, interleaved with the same data without the two
files: the lines naming each damaged file, the seconds with and without them (medians), and
the peak RSS (VmHWM, polled every 20 ms) of the largest worker and of the training process.
"""
from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time

from benchmarks import runner

LOADERS = {"folder": [], "lmdb": ["--lmdb"], "shards": ["--loader", "shards"],
           "dali-cpu": ["--dali", "--dali-cpu"], "cpu-nvimgcodec": ["--decode-device",
                                                                  "cpu-nvimgcodec"]}
NAMES = ("bomb", "flipped_height")
REASONS = ("too large to decode safely", "damaged header")  # decode.acceptance's words


def damaged_pair(seed: int) -> dict[str, tuple[bytes, bytes]]:
    """``{name: (original, damaged)}``: two 500 x 375 generated JPEGs (about 33 KB) with their
    frame header edited: claiming 65,000 x 65,000, and the height's high bit flipped."""
    import io

    from tools.datagen import make_image

    out = {}
    for k, name in enumerate(NAMES):
        buffer = io.BytesIO()
        make_image(k, 4, random.Random(seed + k), (500, 375), 8, 3).save(buffer, "JPEG",
                                                                          quality=90)
        original = buffer.getvalue()
        body = bytearray(original)
        at = body.index(b"\xff\xc0") + 5
        if name == "bomb":
            body[at:at + 4] = (65000).to_bytes(2, "big") * 2
        else:
            body[at] ^= 0x80
        out[name] = (original, bytes(body))
    return out


def make_data(root: str, images: int, with_damaged: bool) -> dict[str, str]:
    """``{loader: data argument}``: ``images`` generated JPEGs (300-500 px) in 10 classes, 100
    in val, the damaged pair in class 1 of each split if ``with_damaged``; the LMDB and shards
    converted from the originals, then edited."""
    import folder2lmdb
    import folder2shards

    from tools.datagen import make_split

    folder = os.path.join(root, "folder")
    pair = damaged_pair(0)
    for split, count, seed in (("train", images, 0), ("val", 100, 1)):
        make_split(os.path.join(folder, split), 10, count // 10, seed, 300, 500, 8, 3)
        for name, (original, _) in pair.items() if with_damaged else ():
            with open(os.path.join(folder, split, "n00000001", f"{name}.JPEG"), "wb") as f:
                f.write(original)
        folder2lmdb.convert(os.path.join(folder, split), os.path.join(root, "lmdb", split),
                            progress=False, workers=2)
        folder2shards.convert(os.path.join(folder, split), os.path.join(root, "shards", split),
                              progress=False, workers=2)
    for dirpath, _, files in os.walk(root) if with_damaged else ():
        for file in files:
            if file.endswith((".JPEG", ".mdb", ".tar")):
                _damage(os.path.join(dirpath, file), pair)
    return {"folder": folder, "lmdb": os.path.join(root, "lmdb"),
            "shards": os.path.join(root, "shards"), "dali-cpu": folder,
            "cpu-nvimgcodec": folder}


def _damage(path: str, pair: dict) -> None:
    """Each original's bytes in ``path`` replaced by its damaged twin (same length)."""
    with open(path, "rb") as f:
        data = f.read()
    edited = data
    for original, damaged in pair.values():
        edited = edited.replace(original, damaged, 1)
    if edited != data:
        with open(path, "wb") as f:
            f.write(edited)


def _hwm_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return None


def _children(pid: int) -> list[int]:
    """``pid``'s descendants (from /proc)."""
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for child in map(int, f.read().split()):
                    found += [child, *_children(child)]
    except OSError:
        pass
    return found


def run_once(loader: str, data: str, args) -> dict:
    """One ``main.py --benchmark-data`` run of 12 batches (two epochs): ``seconds``, ``err``
    (its stderr), ``main_mib`` and ``worker_mib`` (peak RSS of the training process and of its
    largest descendant). Raises RuntimeError if it fails."""
    cmd = [sys.executable, "main.py", *LOADERS[loader], data, "--benchmark-data",
           "-b", str(args.batch), "-j", str(args.workers), "--train-batches", "12",
           "--benchmark-warmup", "0", "--seed", "0", "--max-bad-share", "0.05"]
    log = os.path.join(args.tmp, "stderr.txt")
    with open(log, "w") as err:
        # runner's subprocess: the tests start it warm (tests/helpers/warm.py)
        child = runner.subprocess.Popen(cmd, cwd=runner.REPO, stdout=subprocess.PIPE,
                                        stderr=err, text=True)
        peaks: dict[int, float] = {}
        deadline = time.monotonic() + args.timeout
        while child.poll() is None and time.monotonic() < deadline:
            for pid in [child.pid, *_children(child.pid)]:
                mib = _hwm_mib(pid)
                if mib is not None:
                    peaks[pid] = max(peaks.get(pid, 0.0), mib)
            time.sleep(0.02)
        if child.poll() is None:
            child.kill()
        out = child.communicate()[0]
    with open(log) as f:
        text = f.read()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if child.returncode or not lines:
        raise RuntimeError(f"{loader}: exit status {child.returncode}: "
                           f"{(text.strip().splitlines() or ['no output'])[-1]}")
    import json

    workers = [mib for pid, mib in peaks.items() if pid != child.pid]
    return {"seconds": json.loads(lines[-1])["seconds"], "err": text,
            "main_mib": peaks.get(child.pid, 0.0), "worker_mib": max(workers, default=0.0)}


def summarise(loader: str, bad: list[dict], clean: list[dict]) -> dict:
    """One row: the lines of the damaged run naming each refusal, the medians of both."""
    err = bad[0]["err"]
    named = {name: [line for line in err.splitlines() if reason in line]  # LMDB, shards:
             for name, reason in zip(NAMES, REASONS)}                   # "PATH record N"
    raw = [line for line in err.splitlines() if line.startswith("Corrupt JPEG data")]
    med = {key: (runner.median(r[key] for r in bad), runner.median(r[key] for r in clean))
           for key in ("seconds", "main_mib", "worker_mib")}
    return {"loader": loader, "lines": {name: lines for name, lines in named.items()},
            "raw_libjpeg_lines": len(raw), **{f"{key}_damaged": v[0] for key, v in med.items()},
            **{f"{key}_clean": v[1] for key, v in med.items()}}


def measure(names: list[str], args) -> list[dict]:
    """The rows of ``names`` (keys of :data:`LOADERS`), measured in interleaved rounds."""
    with runner.scratch("bench-refused-") as tmp:
        args.tmp = tmp
        data = {kind: make_data(os.path.join(tmp, kind), args.images, kind == "damaged")
                for kind in ("damaged", "clean")}
        for kind in data.values():
            runner.warm_page_cache(kind["folder"])
        runs = runner.interleave(
            [(name, kind) for name in names for kind in ("damaged", "clean")],
            lambda row: run_once(row[0], data[row[1]][row[0]], args), args.rounds,
            on_result=lambda r, row, res: print(f"round {r + 1}: {row[0]:>14} {row[1]:>7} "
                                                f"{res['seconds']:6.2f} s", flush=True))
    rows = [summarise(name, runs[name, "damaged"], runs[name, "clean"]) for name in names]
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loading.refused",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000, help="good training images")
    parser.add_argument("-b", "--batch", type=int, default=167,
                        help="batch size (1,002 images: 6 batches an epoch, none left out)")
    parser.add_argument("-j", "--workers", type=int, default=2)
    parser.add_argument("--only", nargs="*", choices=sorted(LOADERS), help="these loaders only")
    runner.add_rounds_option(parser, 3)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run")
    runner.add_out_option(parser, "also write the rows to this JSON file")
    args = parser.parse_args(argv)
    names = [name for name in LOADERS if not args.only or name in args.only]
    try:
        rows = measure(names, args)
    except RuntimeError as exc:
        return runner.error("benchmarks.loading.refused", exc)
    print("\n" + runner.markdown_table(
        ["loader", "lines (bomb, flip)", "raw libjpeg lines", "2 epochs s: damaged / clean",
         "largest worker MiB: damaged / clean", "training process MiB: damaged / clean"],
        [[r["loader"], f"{len(r['lines']['bomb'])}, {len(r['lines']['flipped_height'])}",
          str(r["raw_libjpeg_lines"]), f"{r['seconds_damaged']:.2f} / {r['seconds_clean']:.2f}",
          f"{r['worker_mib_damaged']:.0f} / {r['worker_mib_clean']:.0f}",
          f"{r['main_mib_damaged']:.0f} / {r['main_mib_clean']:.0f}"] for r in rows]))
    for r in rows[:1]:
        for name, lines in r["lines"].items():
            print(f"{name}: {lines[0] if lines else 'not named'}")
    if args.out:
        runner.write_json(args.out, {"rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
