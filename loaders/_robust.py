"""Keeping a run alive through damaged samples, and resuming an epoch part-way.

* :class:`TolerantDataset`: a sample that fails to decode is replaced by the next readable one
  and reported on stderr; each item says how many it replaced, so the main process can stop
  the run when too many fail (``DeviceLoader``, ``--max-bad-share``).
* :class:`SkipSampler`: starts an epoch's deterministic order at a given position, so a run
  resumed from a mid-epoch checkpoint (``--save-every``) reads exactly the batches it had not
  yet read: none repeated, none skipped.
"""
from __future__ import annotations

import itertools
import sys
from typing import Iterator

from torch.utils.data import Dataset, Sampler

from ._errors import DataError

# What decoders raise for bytes that are not a readable image: torchvision (RuntimeError),
# PIL (OSError incl. UnidentifiedImageError, ValueError), our LMDB codec (ValueError, KeyError).
DECODE_ERRORS = (OSError, RuntimeError, ValueError, KeyError)


def report_unreadable(name: str, exc: BaseException) -> None:
    """One stderr line naming a sample that failed to decode, and why."""
    reason = str(exc).splitlines()[0] if str(exc) else ""
    print(f"warning: skipping unreadable sample {name}: {type(exc).__name__}: {reason}",
          file=sys.stderr, flush=True)


def too_many_unreadable(bad: int, max_bad_share: float, scope: str) -> DataError:
    """The error that stops a run when ``bad`` samples of this ``scope`` (epoch, pass) failed."""
    return DataError(f"{bad} samples failed to decode in this {scope}, more than the "
                     f"{max_bad_share:.1%} --max-bad-share allows; the warnings above name them")


class TolerantDataset(Dataset):
    """Wraps a dataset of ``(image, label)``; item ``i`` is ``(image, label, replaced)``.

    If sample ``i`` raises one of :data:`DECODE_ERRORS`, samples ``i+1, i+2, ...`` are tried
    (at most ``max_tries``) and ``replaced`` counts the failures (int, 0 normally). Each failure
    is printed on stderr with ``dataset.name_of(index)`` (a path or record) and the reason.
    Raises :class:`DataError` if ``max_tries`` consecutive samples fail.
    """

    def __init__(self, dataset: Dataset, max_tries: int = 16):
        self.dataset, self.max_tries = dataset, max_tries

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        for attempt in range(self.max_tries):
            j = (index + attempt) % len(self.dataset)
            try:
                image, label = self.dataset[j]
            except DECODE_ERRORS as exc:
                report_unreadable(getattr(self.dataset, "name_of", str)(j), exc)
                continue
            return image, label, attempt
        raise DataError(f"{self.max_tries} consecutive samples from index {index} failed to "
                        "decode: is this dataset damaged?")


class SkipSampler(Sampler[int]):
    """Yields ``sampler``'s order from position ``start`` on (``start`` = batches done x batch
    size); ``set_epoch`` is passed through, ``len()`` counts only what is left."""

    def __init__(self, sampler: Sampler[int]):
        self.sampler, self.start = sampler, 0

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.sampler), self.start, None)

    def __len__(self) -> int:
        return max(0, len(self.sampler) - self.start)
