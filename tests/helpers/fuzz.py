"""A seeded corpus of mutated images, and the child process that runs every decoder over it.

:func:`make_corpus` writes ``count`` cases to a folder: mutated copies of JPEGs from the real
sample (where given) and of generated images (always: baseline, progressive, grayscale, CMYK
JPEGs, a PNG and a GIF, so a clone without ``../shared`` fuzzes too): truncations, bit flips in the
header and in the scan, zeroed blocks, frame-size edits (SOF, PNG's IHDR), marker garbage.
Case ``k`` of a seed is the same bytes on every run (``case-KKKK-MUTATION.bin``: the file is the
reproducer).

``python -m tests.helpers.fuzz FOLDER`` (the child) takes each case through the acceptance
rule (``decode.acceptance.check``) and, where it passes, through every decoder of the cascade
(``decode.decode``, ``decode.decode_window``, the window, scaled and region decoders, each
whole-image library, the batch decoder on nvImageCodec's CPU backend), as the loaders would:
each must return pixels or raise one of the loaders' ``DECODE_ERRORS``. Before each case it
prints ``start K``, after it ``done K OUTCOME PEAK_MIB PIXELS`` (its peak resident memory above
the case's start, from ``/proc/self/status`` after ``clear_refs``), or ``bad K WHY`` for any
other exception; the parent (:func:`run_child`) watches for signals and hangs.
"""
from __future__ import annotations

import io
import os
import random
import select
import subprocess
import sys
import time
from dataclasses import dataclass, field

MUTATIONS = ("truncate", "flip-header", "flip-scan", "zero-block", "frame-size", "markers")


def _sources(sample: str | None, rng: random.Random) -> list[tuple[str, bytes]]:
    """``(name, bytes)`` of the images to mutate: generated ones always, real JPEGs of the
    sample (a few, chosen by ``rng``) where given."""
    import glob

    import numpy as np
    from PIL import Image

    from tools.datagen import make_image

    nprng = np.random.default_rng(rng.getrandbits(32))
    out = []
    for k, (w, h) in enumerate([(320, 240), (200, 300), (96, 64)]):
        image = make_image(k, 3, rng, (w, h), noise=24, shapes=4)
        pixels = np.asarray(image).copy()
        pixels[: h // 2] = nprng.integers(0, 256, pixels[: h // 2].shape, dtype=np.uint8)
        image = Image.fromarray(pixels, "RGB")
        out += [(f"gen{k}-baseline", _save(image, "JPEG", quality=90)),
                (f"gen{k}-progressive", _save(image, "JPEG", quality=75, progressive=True)),
                (f"gen{k}-gray", _save(image.convert("L"), "JPEG", quality=85)),
                (f"gen{k}-cmyk", _save(image.convert("CMYK"), "JPEG", quality=90)),
                (f"gen{k}-png", _save(image, "PNG")),
                (f"gen{k}-gif", _save(image.convert("P"), "GIF"))]
    if sample:
        files = sorted(glob.glob(os.path.join(sample, "train", "*", "*.JPEG")))
        for path in rng.sample(files, min(6, len(files))):
            with open(path, "rb") as f:
                out.append((f"real-{os.path.basename(path)[:24]}", f.read()))
    return out


def _save(image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def _header_end(data: bytes) -> int:
    """Where a JPEG's first scan's data starts (a PNG's first IDAT's), or 100 bytes in."""
    at = data.find(b"\xff\xda") if data[:2] == b"\xff\xd8" else data.find(b"IDAT")
    return min(len(data) - 1, at + 14) if at > 0 else min(100, len(data) - 1)


def _frame_at(data: bytes) -> int | None:
    """Offset of the height field (then the width) of a JPEG's SOF or a PNG's IHDR."""
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return 16  # IHDR: width (4 bytes) then height; both edited as one 8-byte field
    for marker in (b"\xff\xc0", b"\xff\xc1", b"\xff\xc2"):
        at = data.find(marker)
        if at > 0:
            return at + 5
    return None


def mutate(data: bytes, kind: str, rng: random.Random) -> bytes:
    """``data`` damaged one way (``kind`` of :data:`MUTATIONS`), drawn from ``rng``."""
    body = bytearray(data)
    head = _header_end(data)
    if kind == "truncate":
        return bytes(body[:rng.randrange(2, len(body))])
    if kind in ("flip-header", "flip-scan"):
        low, high = (2, head) if kind == "flip-header" else (head, len(body) - 2)
        for _ in range(rng.randint(1, 8)):
            body[rng.randrange(low, max(low + 1, high))] ^= 1 << rng.randrange(8)
        return bytes(body)
    if kind == "zero-block":
        size = rng.randint(16, 4096)
        at = rng.randrange(2, max(3, len(body) - 16))
        body[at:at + size] = bytes(len(body[at:at + size]))
        return bytes(body)
    if kind == "frame-size":
        return _resized(body, rng)
    spots = sorted(rng.randrange(2, len(body)) for _ in range(rng.randint(1, 6)))
    for at in reversed(spots):  # stray markers and garbage between segments and in the scan
        junk = bytes([0xFF, rng.choice([0x00, 0xC0, 0xC4, 0xD0, 0xD8, 0xD9, 0xDA, 0xDB, 0xE1,
                                        0xFE, 0xFF])]) + rng.randbytes(rng.randint(0, 12))
        body[at:at] = junk
    return bytes(body)


def _resized(body: bytearray, rng: random.Random) -> bytes:
    """A frame header's height or width edited: a one-bit flip, a small or large change, 0,
    the field's largest value."""
    at = _frame_at(bytes(body))
    if at is None:
        return bytes(body)
    width = 4 if body[:2] == b"\x89P" else 2
    field_at = at + rng.choice([0, width])  # height or width (PNG: width or height)
    old = int.from_bytes(body[field_at:field_at + width], "big")
    top = (1 << (8 * width)) - 1
    new = rng.choice([old ^ (1 << rng.randrange(8 * width)), old + rng.randint(1, 64),
                      old * rng.randint(2, 200), 0, top, rng.randint(1, min(top, 65535))])
    body[field_at:field_at + width] = min(top, max(0, new)).to_bytes(width, "big")
    return bytes(body)


def make_corpus(folder: str, count: int, seed: int, sample: str | None = None) -> list[str]:
    """Write ``count`` mutated cases (``case-KKKK-KIND-SOURCE.bin``) to ``folder``; returns
    their paths in case order. The same ``seed`` (and sample) gives the same bytes."""
    rng = random.Random(seed)
    sources = _sources(sample, rng)
    os.makedirs(folder, exist_ok=True)
    paths = []
    for k in range(count):
        name, data = sources[k % len(sources)]
        kind = MUTATIONS[(k // len(sources)) % len(MUTATIONS)]
        path = os.path.join(folder, f"case-{k:04d}-{kind}-{name}.bin")
        with open(path, "wb") as f:
            f.write(mutate(data, kind, rng))
        paths.append(path)
    return paths


@dataclass
class Outcome:
    """What the child reported: per case ``"refused"``, ``"decoded"`` or ``"declined"`` (no
    decoder gave pixels, each raising a decode error), peak MiB above its start and the
    frame's pixels (0: none read); ``problems``: one line per failure (a signal, a hang, an
    exception that is not a decode error), each naming the case's file."""

    outcomes: dict[int, str] = field(default_factory=dict)
    peaks: dict[int, tuple[float, int]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0


def run_child(folder: str, paths: list[str], case_timeout: float = 60.0) -> Outcome:
    """Run ``python -m tests.helpers.fuzz FOLDER`` over ``paths``; a case that takes longer than
    ``case_timeout`` seconds is a hang (the child is killed and restarted after it), a child
    that dies of a signal is a crash (restarted after the case it was in)."""
    result, first, started = Outcome(), 0, time.perf_counter()
    while first < len(paths):
        first = _one_child(folder, paths, first, case_timeout, result)
    result.seconds = time.perf_counter() - started
    return result


def _one_child(folder: str, paths: list[str], first: int, case_timeout: float,
               result: Outcome) -> int:
    """One child from case ``first`` on; returns the case to go on from."""
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    log = open(os.path.join(folder, f"stderr-from-{first}.txt"), "wb+")  # a file: never full
    child = subprocess.Popen([sys.executable, "-m", "tests.helpers.fuzz", folder, str(first)],
                             stdout=subprocess.PIPE, stderr=log, env=env,
                             cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                                 os.path.abspath(__file__)))))
    try:
        return _watch(child, log, paths, case_timeout, result)
    finally:
        log.close()


def _watch(child, log, paths: list[str], case_timeout: float, result: Outcome) -> int:
    """Read ``child``'s progress lines until it ends or a case outlasts ``case_timeout``;
    returns the case to go on from."""
    current, buffer, deadline = None, b"", time.monotonic() + 300  # start-up: imports
    while True:
        ready, _, _ = select.select([child.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            child.kill()
            child.wait()
            where = paths[current] if current is not None else "start-up"
            result.problems.append(f"hang: no progress within {case_timeout:.0f} s in {where}")
            return (current + 1) if current is not None else len(paths)
        chunk = os.read(child.stdout.fileno(), 65536)
        if not chunk:
            break
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            current = _take(line.decode(), paths, result, current)
            deadline = time.monotonic() + case_timeout
    code = child.wait()
    log.seek(0)
    err = log.read().decode(errors="replace")
    if code == 0 and current is None:
        return len(paths)
    if code != 0:
        where = paths[current] if current is not None else "start-up"
        how = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        last = (err.strip().splitlines() or [""])[-1]
        result.problems.append(f"child {how} in {where}: {last}")
        return (current + 1) if current is not None else len(paths)
    return len(paths)


def _take(line: str, paths: list[str], result: Outcome, current):
    """Read one progress line of the child; returns the case it is in (None between cases)."""
    word, _, rest = line.partition(" ")
    if word == "start":
        return int(rest)
    if word == "done":
        index, outcome, peak, pixels = rest.split()
        result.outcomes[int(index)] = outcome
        result.peaks[int(index)] = (float(peak), int(pixels))
        return None
    if word == "bad":
        index, why = rest.split(" ", 1)
        result.problems.append(f"{paths[int(index)]}: {why}")
        result.outcomes[int(index)] = "bad"
        return None
    return current


def _peak_mib() -> float:
    """This process's peak resident memory (VmHWM) in MiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def _reset_peak() -> float:
    """Reset VmHWM to the current resident size (``clear_refs`` 5, Linux 4.0); returns it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _peak_mib()


def _decoders():
    """``[(name, call(data, frame) -> pixels or None)]``: every decoder of the cascade."""
    import torch

    import decode
    from decode import jpeg, libraries
    from decode.gpu import WindowDecoder

    batch = WindowDecoder("cpu-nvimgcodec", torch.device("cpu")) \
        if jpeg.window.available() else None

    def window(frame):
        h, w = frame
        return (h // 4, w // 4, max(1, h // 2), max(1, w // 2))

    def batch_decode(data, frame):
        out = batch.decode([data], [window(frame)], (32, 32))
        if out.failed:
            raise out.failed[0][1]
        return out.images

    calls = [("decode", lambda d, f: decode.decode(d)),
             ("decode_window", lambda d, f: decode.decode_window(d, window(f), (32, 32))),
             ("jpeg.window", lambda d, f: jpeg.window.decode_window(d, *window(f))),
             ("jpeg.region", lambda d, f: jpeg.region.decode_region(d, 2, *window(
                 (-(-f[0] // 2), -(-f[1] // 2))))),
             ("draft", lambda d, f: jpeg.scaled.draft_resized(
                 d, 2, tuple(float(v) for v in (0, 0, f[0], f[1])), (32, 32)))]
    for key in libraries.backends():
        calls.append((f"{key}-jpeg", lambda d, f, key=key: _with(libraries, key,
                                                                  libraries.decode_jpeg, d)))
        calls.append((f"{key}-image", lambda d, f, key=key: _with(libraries, key,
                                                                   libraries.decode_image, d)))
    if batch is not None:
        calls.append(("batch", batch_decode))
    return calls


def _with(libraries, key: str, call, data):
    previous = libraries.use(key)
    try:
        return call(data)
    finally:
        libraries.use(previous)


def child(folder: str, first: int) -> int:
    """Run every decoder over the cases of ``folder`` from ``first`` on (the module docstring)."""
    from decode.acceptance import Refused, check
    from decode.messages import capture
    from loaders.pipelines.bad_samples import DECODE_ERRORS

    calls = _decoders()
    paths = sorted(os.path.join(folder, name) for name in os.listdir(folder)
                   if name.startswith("case-"))
    for index in range(first, len(paths)):
        print(f"start {index}", flush=True)
        with open(paths[index], "rb") as f:
            data = f.read()
        base = _reset_peak()
        outcome, pixels = "declined", 0
        try:
            frame = check(data)
            pixels = frame.pixels if frame is not None else 0
            size = (frame.height, frame.width) if frame and frame.pixels else (64, 64)
            for name, call in calls:
                try:
                    with capture():  # libjpeg's lines: what the loaders catch
                        if call(data, size) is not None:
                            outcome = "decoded"
                except DECODE_ERRORS:
                    pass
        except Refused:
            outcome = "refused"
        except Exception as exc:  # noqa: BLE001 - what the test reports as a failure
            print(f"bad {index} {name}: {type(exc).__name__}: {exc}".splitlines()[0], flush=True)
            continue
        print(f"done {index} {outcome} {_peak_mib() - base:.1f} {pixels}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(child(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0))
