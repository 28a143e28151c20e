"""The raw-pixel share of a store (``--raw-budget``, docs/raw-share.md#what-is-chosen): an image is
stored as raw pixels (:mod:`decode.raw`) when its predicted decode time saved per extra byte clears
a threshold (a greedy knapsack; FFCV draws at random). :class:`CostModel` is fitted on
:data:`SAMPLE` timed images, the threshold set where :data:`SIZE_SAMPLE` images would fill the
:class:`Budget`, which holds pro rata all along; the resume state carries all three."""
from __future__ import annotations

import dataclasses
import math
import re
import time
from contextlib import closing
from dataclasses import dataclass

import numpy as np
import torch

from decode import decode, decode_window
from decode.acceptance import read_frame
from decode.messages import capture
from decode.raw import encode_raw, raw_bytes, raw_size
from formats.images import check_files

SAMPLE = 64  # images timed to fit the cost model (evenly spaced over the listing)
SIZE_SAMPLE = 1024  # images whose sizes set the threshold (evenly spaced; SAMPLE among them)
WINDOWS = 3  # RandomResizedCrop windows timed per image
OUTPUT_SIDE = 224  # training crop side the windows are resized to (pytorch/examples' default)


@dataclass(frozen=True)
class Budget:
    """``share`` (times the JPEG-only store's image bytes, > 1) or ``size`` (bytes), from
    ``text``."""

    text: str
    share: float | None = None
    size: int | None = None

    def limit(self, jpeg: int, files_done: int, files: int) -> float:
        """Image bytes allowed where the images as JPEGs take ``jpeg`` bytes, after ``files_done``
        of ``files`` source files (pro rata)."""
        return self.share * jpeg if self.share is not None else \
            self.size * files_done / max(1, files)


def parse_budget(text: str) -> Budget:
    """``--raw-budget``: ``Nx`` (decimal N > 1, e.g. ``1.5x``) or bytes with an optional binary
    suffix (``200M``, ``200MB`` = 200 MiB, ``30G``). Raises ``ValueError``."""
    share = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*x\s*", text, re.I)
    if share:
        value = float(share[1])
        if not value > 1:
            raise ValueError(f"--raw-budget {text}: a share must exceed 1x (1x: no raw images)")
        return Budget(text.strip(), share=value)
    size = size_in_bytes(text)
    if size is None:
        raise ValueError(f"--raw-budget {text!r}: give a share of the JPEG store (1.5x) or the "
                         "store's size in bytes (200M, 30G)")
    return Budget(text.strip(), size=size)


def size_in_bytes(text: str) -> int | None:
    """Bytes in ``text``: a number with an optional binary suffix (``4096``, ``512M``, ``1.5G``,
    ``1GiB``, ``200MB`` = 200 MiB, up to T); None unless a whole positive number of bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*", text, re.I)
    if not match:
        return None
    size = int(float(match[1]) * (1 << 10 * " kmgt".index(match[2].lower() or " ")))
    return size if size > 0 else None


@dataclass(frozen=True)
class CostModel:
    """Seconds a read saves when an image of ``pixels`` (stored size) and ``jpeg_bytes`` is raw:
    ``a + b * pixels + c * jpeg_bytes``, fitted on ``sampled`` images."""

    a: float
    b: float
    c: float
    sampled: int = 0

    def saved(self, pixels: int, jpeg_bytes: int) -> float:
        return self.a + self.b * pixels + self.c * jpeg_bytes

    @classmethod
    def fit(cls, pixels, jpeg_bytes, saved) -> "CostModel":
        """Non-negative least squares (``scipy.optimize.nnls``, Lawson and Hanson)."""
        from scipy.optimize import nnls

        x = np.column_stack([np.ones(len(pixels)), np.asarray(pixels, float),
                             np.asarray(jpeg_bytes, float)])
        coef, _ = nnls(x, np.asarray(saved, float))
        return cls(*map(float, coef), len(saved))


@dataclass
class RawChoice:
    """One conversion's choice: ``threshold`` (seconds saved per extra byte) and totals: ``stored``
    and ``jpeg`` bytes, ``records`` raw, ``saved`` seconds per epoch, ``extra`` bytes."""

    budget: Budget
    model: CostModel
    threshold: float
    stored: int = 0
    jpeg: int = 0
    records: int = 0
    saved: float = 0.0
    extra: int = 0

    def candidate(self, pixels: int, jpeg_bytes: int, raw_bytes: int) -> bool:
        return ratio(self.model, pixels, jpeg_bytes, raw_bytes) >= self.threshold

    def take(self, jpeg_bytes: int, raw_bytes: int | None, pixels: int, files_done: int,
             files: int) -> bool:
        """Count one record (``raw_bytes``: its raw size if a candidate); True if stored raw."""
        raw = raw_bytes is not None and self.stored + raw_bytes <= self.budget.limit(
            self.jpeg + jpeg_bytes, files_done, files)
        self.jpeg += jpeg_bytes
        self.stored += raw_bytes if raw else jpeg_bytes
        if raw:
            self.records += 1
            self.extra += raw_bytes - jpeg_bytes
            self.saved += self.model.saved(pixels, jpeg_bytes)
        return raw

    def state(self) -> dict:
        """The resume state's and metadata's fields (taken per record: the model's listed)."""
        m = self.model
        return {"budget": self.budget.text, "model": [m.a, m.b, m.c, m.sampled],
                "threshold": self.threshold, "stored": self.stored, "jpeg": self.jpeg,
                "records": self.records, "saved_s": self.saved, "extra": self.extra}

    @classmethod
    def from_state(cls, state: dict) -> "RawChoice":
        return cls(parse_budget(state["budget"]), CostModel(*state["model"]),
                   state["threshold"], state["stored"], state["jpeg"], state["records"],
                   state["saved_s"], state["extra"])

    def line(self, images: int) -> str:
        """The summary's sentence on what the budget bought."""
        share = self.records / images if images else 0.0
        grown = self.stored / self.jpeg if self.jpeg else 1.0
        return (f"raw pixels: {self.records} of {images} images ({share:.0%}), "
                f"{grown:.2f}x the JPEG store's bytes (--raw-budget {self.budget.text}); "
                f"expected decode time saved {self.saved:.3g} s per epoch on one core, "
                f"{self.saved / max(1, self.records) * 1e3:.2f} ms per raw image (cost model "
                f"from {self.model.sampled} timed images)")


def ratio(model: CostModel, pixels: int, jpeg_bytes: int, raw_bytes: int) -> float:
    """Seconds saved per extra byte stored (infinite if the raw record is no larger)."""
    extra = raw_bytes - jpeg_bytes
    return math.inf if extra <= 0 else model.saved(pixels, jpeg_bytes) / extra


def sample_indices(count: int, sample: int = SAMPLE) -> list[int]:
    """``sample`` indices spread evenly over ``range(count)`` (all of them if fewer)."""
    return sorted({int(i * count / sample) for i in range(sample)} if count > sample else
                  range(count))


def time_saving(jpeg: bytes, raw: bytes) -> float:
    """Seconds a read of :data:`WINDOWS` RandomResizedCrop windows (torchvision's draw, from
    torch's random state) of ``jpeg`` (:func:`decode.decode_window`, the loaders' cascade) costs
    over its raw record's, per window, on this thread."""
    from torchvision.transforms import RandomResizedCrop

    size = (OUTPUT_SIDE, OUTPUT_SIDE)
    best = [math.inf, math.inf]
    image = torch.empty(1, 1, 1).expand(3, *raw_size(raw))  # its shape only
    windows = [RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3])
               for _ in range(WINDOWS)]
    for _ in range(2):
        for k, data in enumerate((jpeg, raw)):
            start = time.perf_counter()
            for window in windows:
                decode_window(data, window, size)
            best[k] = min(best[k], time.perf_counter() - start)
    return (best[0] - best[1]) / len(windows)


def raw_record(jpeg: bytes) -> tuple[bytes, int]:
    """``(raw record, pixels)``: :func:`decode.decode`'s pixels, PGM if grayscale."""
    with capture():  # libjpeg's warnings: the checking thread named the image already
        image = decode(jpeg)
    frame = read_frame(jpeg)
    return encode_raw(image, gray=frame is not None and frame.components == 1), \
        image.shape[1] * image.shape[2]


def plan(budget: Budget, stored: list[bytes], files: int, timed: list[int]) -> RawChoice:
    """A :class:`RawChoice` fitted on ``stored``'s JPEGs at ``timed``, the threshold where all of
    ``stored`` fill ``budget``. One thread, ~10 ms per timed image."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a DataLoader worker
    try:
        fit = []
        with torch.random.fork_rng(devices=[]):  # the windows' draws, without touching the caller's
            torch.manual_seed(0)
            for i in timed:
                raw, pixels = raw_record(stored[i])
                fit.append((pixels, len(stored[i]), time_saving(stored[i], raw)))
    finally:
        torch.set_num_threads(threads)
    if not fit:
        return RawChoice(budget, CostModel(0.0, 0.0, 0.0), math.inf)
    model = CostModel.fit(*zip(*fit))
    rows = [row for row in map(_sizes, stored) if row is not None]
    return RawChoice(budget, model, threshold(budget, model, rows, files))


def _sizes(jpeg: bytes) -> tuple[int, int, int] | None:
    """``(pixels, JPEG bytes, raw bytes)`` from the header; None if it does not parse."""
    frame = read_frame(jpeg)
    if frame is None or not frame.components:
        return None
    return frame.pixels, len(jpeg), raw_bytes(frame.height, frame.width,
                                              1 if frame.components == 1 else 3)


def threshold(budget: Budget, model: CostModel, rows: list, files: int) -> float:
    """The lowest :func:`ratio` at which ``rows`` (``(pixels, jpeg bytes, raw bytes, ...)``),
    taken best first, stay within ``budget``; infinite if none fits."""
    ranked = sorted(rows, key=lambda r: -ratio(model, r[0], r[1], r[2]))
    jpeg = sum(r[1] for r in rows)
    allowed = budget.limit(jpeg, len(rows), files)
    stored, level = jpeg, math.inf
    for pixels, jpeg_bytes, raw_bytes, *_ in ranked:
        stored += raw_bytes - jpeg_bytes
        if stored > allowed:
            break
        level = ratio(model, pixels, jpeg_bytes, raw_bytes)
    return level


def with_candidate(choice: RawChoice):
    """A ``post`` for ``check_files`` attaching to each checked JPEG its raw record and pixels
    if it clears ``choice``'s threshold (a JPEG whose header does not parse stays JPEG)."""
    def post(checked):
        sizes = _sizes(checked.data)
        if sizes is None or not choice.candidate(*sizes):
            return dataclasses.replace(checked, raw=None, pixels=sizes[0] if sizes else 0)
        raw, pixels = raw_record(checked.data)
        return dataclasses.replace(checked, raw=raw, pixels=pixels)

    return post


def start(budget: Budget | None, listing, check: str, cap, saved: dict | None, workers: int):
    """The :class:`RawChoice` of a conversion: ``saved`` if resuming, else planned on a sample of
    ``listing`` checked by ``workers`` threads (``-j``); None without ``budget``."""
    if budget is None:
        return None
    if saved:
        return RawChoice.from_state(saved)
    count = len(listing.files)
    sized = sample_indices(count, SIZE_SAMPLE)
    timed = set(sample_indices(count))  # a subset: both spread evenly over the same listing
    with closing(check_files([listing.files[i] for i in sized], workers, check, cap=cap)) as found:
        # a skipped file (a str: why) is neither timed nor sized
        kept = [(i, c.data) for i, c in zip(sized, found) if not isinstance(c, str)]
    return plan(budget, [data for _, data in kept], count,
                [at for at, (i, _) in enumerate(kept) if i in timed])
