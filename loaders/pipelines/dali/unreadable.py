"""What :class:`~loaders.pipelines.dali.DALILoader` does about a sample DALI cannot decode
(a mixin): find it with our CPU decoder, report it once on stderr, remember it and replace it
in the pass's order by the next readable sample, as the other pipelines do
(``loaders.pipelines.bad_samples``); past ``max_bad_share`` of the split, :class:`DataError`.
"""
from __future__ import annotations

from decode import decode

from ...errors import DataError
from ..bad_samples import DECODE_ERRORS, report_unreadable, too_many_unreadable
from .environment import message_lines
from .graph import window_mismatch


class UnreadableSamples:
    """Needs ``batch_size``, ``reader``, ``unreadable`` (an ``UnreadableSet``),
    ``sample_order``, ``max_bad_share``, ``_split`` and ``_drop_pipelines()`` of the loader."""

    def _replace_unreadable(self, order: list[int], step: int, exc: RuntimeError,
                            lookahead: int) -> int:
        """Probe the samples of batches ``step .. step + lookahead`` (DALI runs a few batches
        ahead) with our CPU decoder; remember and report each unreadable one (once) and replace
        it in ``order`` by the next readable dataset index. Returns how many were newly found
        unreadable; raises :class:`DataError` with DALI's message if none of them is."""
        batch = self.batch_size
        window = range(step * batch, min(len(order), (step + lookahead) * batch))
        found = 0
        for position in window:
            index = order[position]
            while not self._readable(index):
                index = self.unreadable.next_readable(index)
                found += 1
                if found > len(window):
                    raise DataError(f"DALI: {found} unreadable samples near batch {step}: "
                                    "is this dataset damaged?")
            order[position] = index
        if found == 0:
            lines = message_lines(exc)
            raise DataError(f"DALI failed on the {self._split} split at or shortly after batch "
                            f"{step} of this pass: {lines[-1] if lines else exc}") from None
        return found

    def _skip_mismatched_window(self, order: list[int], step: int, outputs) -> bool:
        """A sample of batch ``step`` whose window :func:`~.graph.window_mismatch` finds wrong is an unreadable sample (reported, remembered, replaced in ``order``; the
        pipelines dropped): returns whether there was one. Raises :class:`DataError` past
        ``max_bad_share``."""
        found = window_mismatch(outputs)
        if found is None:
            return False
        self._drop_pipelines()
        position, reason = found
        position += step * self.batch_size
        index = order[position]
        if self.unreadable.mark(index):
            report_unreadable(self.reader.name_of(index), DataError(reason))
        order[position] = self.unreadable.next_readable(index)
        bad, size = self.unreadable.count(), self.sample_order.num_samples
        if bad > self.max_bad_share * size:
            raise too_many_unreadable(bad, self.max_bad_share, size) from None
        return True

    def _readable(self, index: int) -> bool:
        """Decode sample ``index`` (never one known unreadable: the order skips those); if it
        fails, remember it, report it and return False."""
        try:
            decode(self.reader.read(index)[0])
        except DECODE_ERRORS as exc:
            if self.unreadable.mark(index):
                report_unreadable(self.reader.name_of(index), exc)
            return False
        return True
