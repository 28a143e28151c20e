"""Keeping a run alive through damaged samples: :class:`TolerantDataset` replaces a sample that
fails to decode by the next readable one and reports it on stderr; each item says how many it
replaced, so the main process can stop the run when too many fail (``DeviceLoader``,
``--max-bad-share``; DALI's loader uses :data:`DECODE_ERRORS` and the messages here too).
"""
from __future__ import annotations

import sys

from torch.utils.data import Dataset

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
