"""Damaged samples (``--max-bad-share``): one that fails to decode or is refused is replaced and
never drawn again, one a native decoder warns about is kept; each named once."""
from __future__ import annotations

import sys

import torch

from decode import DECODE_ERRORS
from decode.messages import capture

from ..errors import DataError


def mark_unreadable(unreadable: UnreadableSet, index: int, name_of, exc: BaseException) -> bool:
    """Flag sample ``index`` in ``unreadable``; the first time, one stderr line naming it
    (``name_of(index)``) and why it failed to decode, and True."""
    if not unreadable.mark(index):
        return False
    reason = str(exc).splitlines()[0] if str(exc) else ""
    print(f"warning: skipping unreadable sample {name_of(index)}: {type(exc).__name__}: "
          f"{reason}", file=sys.stderr, flush=True)
    return True


def report_damaged(name: str, lines: list[str]) -> None:
    """One stderr line naming a sample kept though a native decoder warned about its data
    (``lines``, e.g. ``["Corrupt JPEG data: premature end of data segment"]``)."""
    more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
    print(f"warning: keeping damaged sample {name}: the decoder said \"{lines[0]}\"{more}; its "
          "header passed the acceptance rule, so it is used as decoded", file=sys.stderr,
          flush=True)


class UnreadableSet:
    """One uint8 flag per sample, in shared memory if ``shared`` (made before the workers start).
    Two workers marking one sample at once may both report it; :meth:`count` is exact."""

    def __init__(self, size: int, shared: bool = False):
        self.flags = torch.zeros(size, dtype=torch.uint8)
        if shared:
            self.flags.share_memory_()
        self.view = self.flags.numpy()  # a byte read costs ~0.1 us, a tensor's ~1 us

    def __len__(self) -> int:
        return len(self.flags)

    def known(self, index: int) -> bool:
        return bool(self.view[index])

    def mark(self, index: int) -> bool:
        """Flag sample ``index``; True if it was not flagged yet."""
        known = self.view[index]
        self.view[index] = 1
        return not known

    def count(self) -> int:
        """Distinct samples flagged so far (by any process sharing the flags)."""
        return int(self.flags.sum())

    def next_readable(self, index: int) -> int:
        """``index`` or the next (wrapping) not flagged; :class:`DataError` if none."""
        size = len(self.flags)
        for step in range(size):
            if not self.view[(index + step) % size]:
                return (index + step) % size
        raise DataError(f"all {size} samples of this split failed to decode: is it damaged?")

    def __getstate__(self):
        return {"flags": self.flags}

    def __setstate__(self, state):
        self.flags = state["flags"]
        self.view = self.flags.numpy()


def check_share(unreadable: UnreadableSet, max_bad_share: float, size: int) -> None:
    """Raise :class:`DataError` once ``unreadable`` exceeds ``max_bad_share`` of ``size``."""
    bad = unreadable.count()
    if bad > max_bad_share * size:
        raise DataError(f"{bad} samples failed to decode (distinct unreadable samples of the "
                        f"split's {size}), more than the {max_bad_share:.1%} --max-bad-share "
                        "allows; the warnings above name them") from None


class BadSamples:
    """A split's :attr:`unreadable` and :attr:`warned` (kept) samples, ``name_of(index)`` for
    the warnings, at most ``max_tries`` failing samples in a row."""

    def __init__(self, size: int, name_of=str, shared: bool = False, max_tries: int = 16):
        self.unreadable = UnreadableSet(size, shared=shared)
        self.warned = UnreadableSet(size, shared=shared)
        self.name_of, self.max_tries = name_of, max_tries


def fetch_readable(fetch, index: int, bad: BadSamples):
    """``(fetch(j), found)``: ``j`` is ``index`` or, if unreadable, the next readable; ``found``
    the samples newly failing. Raises :class:`DataError` past ``bad.max_tries`` in a row."""
    unreadable, found, j = bad.unreadable, 0, index
    for _ in range(bad.max_tries):
        if unreadable.view[j]:  # the one byte a healthy sample costs
            j = unreadable.next_readable(j)
        try:
            with capture() as caught:
                item = fetch(j)
        except DECODE_ERRORS as exc:
            found += mark_unreadable(unreadable, j, bad.name_of, exc)
            j = (j + 1) % len(unreadable)
            continue
        if caught.lines and bad.warned.mark(j):
            report_damaged(bad.name_of(j), caught.lines)
        return item, found
    raise DataError(f"{bad.max_tries} consecutive samples from index {index} failed to "
                    "decode: is this dataset damaged?")
