"""Keeping a run alive through damaged samples: :class:`TolerantDataset` replaces a sample that
fails to decode, or that the acceptance rule refuses from its header (:mod:`decode.acceptance`:
a decompression bomb, a frame the file cannot hold), by the next readable one, reports it once
on stderr and remembers it for the rest of the run (a flag per sample in memory every DataLoader
worker shares), so it is never drawn again; each item says how many samples it newly found
unreadable, so the main process can stop the run when too many distinct samples of the split
fail (``DeviceLoader``, ``--max-bad-share``; DALI's loader uses :data:`DECODE_ERRORS`,
:class:`UnreadableSet` and the messages here too). A sample that decodes while a native decoder
prints a warning (libjpeg's ``Corrupt JPEG data: ...``, caught by :mod:`decode.messages`) is
kept and named once (:func:`report_damaged`), never printed raw.
"""
from __future__ import annotations

import sys

import numpy as np
import torch
from torch.utils.data import Dataset

from decode.messages import capture

from ..errors import DataError

# What decoders raise for bytes that are not a readable image: torchvision (RuntimeError),
# PIL (OSError incl. UnidentifiedImageError, ValueError), our LMDB codec (ValueError, KeyError).
DECODE_ERRORS = (OSError, RuntimeError, ValueError, KeyError)


def report_unreadable(name: str, exc: BaseException) -> None:
    """One stderr line naming a sample that failed to decode, and why."""
    reason = str(exc).splitlines()[0] if str(exc) else ""
    print(f"warning: skipping unreadable sample {name}: {type(exc).__name__}: {reason}",
          file=sys.stderr, flush=True)


def report_damaged(name: str, lines: list[str]) -> None:
    """One stderr line naming a sample that decoded while a native decoder warned about its
    data (``lines``, e.g. ``["Corrupt JPEG data: premature end of data segment"]``): kept."""
    more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
    print(f"warning: keeping damaged sample {name}: the decoder said \"{lines[0]}\"{more}; its "
          "header passed the acceptance rule, so it is used as decoded", file=sys.stderr,
          flush=True)


def too_many_unreadable(bad: int, max_bad_share: float, size: int) -> DataError:
    """The error that stops a run when ``bad`` distinct samples of a split of ``size`` failed."""
    return DataError(f"{bad} samples failed to decode (distinct unreadable samples of the "
                     f"split's {size}), more than the {max_bad_share:.1%} --max-bad-share "
                     "allows; the warnings above name them")


class UnreadableSet:
    """Which samples of a dataset of ``size`` were found unreadable this run: one uint8 flag per
    sample (``size`` bytes), in shared memory if ``shared`` (made before the DataLoader workers
    start: forked workers inherit it, spawned ones unpickle it as they do the batch slots).

    :meth:`mark` sets a flag and says whether it was new. Check and set are two steps, not an
    atomic compare-and-set: two workers failing on the same sample within the same few
    nanoseconds could both see it as new (a duplicate stderr line; :meth:`count` stays exact).
    """

    def __init__(self, size: int, shared: bool = False):
        self.flags = torch.zeros(size, dtype=torch.uint8)
        if shared:
            self.flags.share_memory_()
        self._view = None  # numpy view of flags: a byte read costs ~0.1 us, a tensor's ~1 us

    @property
    def view(self) -> np.ndarray:
        if self._view is None:
            self._view = self.flags.numpy()
        return self._view

    def __len__(self) -> int:
        return len(self.flags)

    def known(self, index: int) -> bool:
        """Whether sample ``index`` was found unreadable before."""
        return bool(self.view[index])

    def mark(self, index: int) -> bool:
        """Remember sample ``index`` as unreadable; True if it was not known yet."""
        view = self.view
        if view[index]:
            return False
        view[index] = 1
        return True

    def count(self) -> int:
        """Distinct samples found unreadable so far (by any process sharing the flags)."""
        return int(self.flags.sum())

    def next_readable(self, index: int) -> int:
        """``index`` or the first index after it (wrapping) not known to be unreadable.
        Raises :class:`DataError` if every sample is."""
        view, size = self.view, len(self.flags)
        for step in range(size):
            j = (index + step) % size
            if not view[j]:
                return j
        raise DataError(f"all {size} samples of this split failed to decode: is it damaged?")

    def __getstate__(self):
        return {"flags": self.flags, "_view": None}


class TolerantDataset(Dataset):
    """Wraps a dataset of ``(image, label)``; item ``i`` is ``(image, label, found)``.

    If sample ``i`` is known unreadable (:attr:`unreadable`, an :class:`UnreadableSet` shared by
    the workers, ``shared``), or raises one of :data:`DECODE_ERRORS`, the next samples not
    known unreadable are tried (at most ``max_tries`` failing decodes). A sample that fails is
    remembered, printed once on stderr with ``dataset.name_of(index)`` (a path or record) and the
    reason, and never decoded again; ``found`` counts the samples this item newly found
    unreadable (int, 0 normally). What native decoders print while a sample is read and decoded
    is caught (:class:`decode.messages.capture`): a sample they warned about is named once in
    the run (:attr:`warned`, flags shared like :attr:`unreadable`) and kept. Raises
    :class:`DataError` if ``max_tries`` samples in a row fail, or every sample is known
    unreadable.
    """

    def __init__(self, dataset: Dataset, max_tries: int = 16, shared: bool = False):
        self.dataset, self.max_tries = dataset, max_tries
        self.unreadable = UnreadableSet(len(dataset), shared=shared)
        self.warned = UnreadableSet(len(dataset), shared=shared)  # named once as damaged

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        unreadable, found = self.unreadable, 0
        j = index
        for _ in range(self.max_tries):
            if unreadable.view[j]:  # the one byte a healthy sample costs
                j = unreadable.next_readable(j)
            try:
                with capture() as caught:
                    image, label = self.dataset[j]
            except DECODE_ERRORS as exc:
                if unreadable.mark(j):
                    found += 1
                    report_unreadable(getattr(self.dataset, "name_of", str)(j), exc)
                j = (j + 1) % len(self.dataset)
                continue
            if caught.lines and self.warned.mark(j):
                report_damaged(getattr(self.dataset, "name_of", str)(j), caught.lines)
            return image, label, found
        raise DataError(f"{self.max_tries} consecutive samples from index {index} failed to "
                        "decode: is this dataset damaged?")
