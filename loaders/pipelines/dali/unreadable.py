"""What :class:`~loaders.pipelines.dali.DALILoader` does about a sample DALI cannot decode (a
mixin): find it with our CPU decoder, then report, remember and replace it as the other pipelines
do (``loaders.pipelines.bad_samples``)."""
from __future__ import annotations

from decode import decode
from decode.acceptance import Frame, Refused, check
from decode.messages import capture

from ...errors import DataError
from ..bad_samples import DECODE_ERRORS, check_share, report_damaged, report_unreadable
from .environment import message_lines
from .graph import window_mismatch


class AcceptedReads:
    """``read(index) -> (bytes, label, frame)`` for the feed threads: ``reader.read(index)`` and
    the :class:`~decode.acceptance.Frame` the acceptance rule (``max_pixels``) read (None: no
    parser reads it), or where the rule refuses those bytes the next readable sample's, each
    refused one reported once, marked in ``unreadable`` and counted in :attr:`refused`. Raises
    :class:`DataError` if every sample is unreadable. It holds no reference to the loader: a
    loader (its DALI pipelines with it) freed in a process forked while a feed thread holds it
    would hang there, waiting for DALI threads that only the parent has."""

    def __init__(self, reader, unreadable, max_pixels: int):
        self.reader, self.unreadable, self.max_pixels = reader, unreadable, max_pixels
        self.refused = 0

    def __call__(self, index: int) -> tuple[bytes, int, Frame | None]:
        while True:
            data, label = self.reader.read(index)
            try:
                return data, label, check(data, self.max_pixels)
            except Refused as exc:
                if self.unreadable.mark(index):
                    self.refused += 1
                    report_unreadable(self.reader.name_of(index), exc)
                index = self.unreadable.next_readable(index)


class UnreadableSamples:
    """Needs the loader's ``batch_size``, ``reader``, ``unreadable``, ``warned``, ``max_pixels``,
    ``sample_order``, ``max_bad_share``, ``_split``, ``_drop_pipelines()``."""

    def _check_refused(self) -> None:
        """Raise :class:`DataError` past ``max_bad_share`` (refused samples counted too)."""
        check_share(self.unreadable, self.max_bad_share, self.sample_order.num_samples)

    def _name_damaged(self, order: list[int], step: int, lines: list[str],
                      lookahead: int) -> None:
        """Name once (``warned``) the sample whose CPU decode prints ``lines`` too, among batches
        ``step - lookahead .. step + lookahead`` (DALI's threads decode ahead, and their output
        may arrive late); a sample named before takes them unprobed; none: one line says so."""
        batch = self.batch_size
        first = max(0, step - lookahead)
        window = [order[p] for p in range(first * batch, min(len(order), (step + lookahead)
                                                             * batch))]
        if any(self.warned.known(index) for index in window):
            return
        found = False
        for index in window:
            if self.unreadable.known(index):  # refused by the feed, never handed to DALI
                continue
            try:
                data = self.reader.read(index)[0]
                check(data, self.max_pixels)
                with capture() as caught:
                    decode(data)
            except DECODE_ERRORS:
                continue
            if caught.lines:
                found = True
                if self.warned.mark(index):
                    report_damaged(self.reader.name_of(index), caught.lines)
        if not found:
            report_damaged(f"(one of batches {first}-{step + lookahead - 1} of the "
                           f"{self._split} split; our CPU decoder decodes them without a "
                           "warning)", lines)

    def _replace_unreadable(self, order: list[int], step: int, exc: RuntimeError,
                            lookahead: int) -> None:
        """Probe batches ``step .. step + lookahead`` (DALI runs ahead) by the acceptance rule
        and our CPU decoder; report, remember and replace in ``order`` (by the next readable
        index) each unreadable sample. Raises :class:`DataError` (DALI's message) if none."""
        batch = self.batch_size
        window = range(step * batch, min(len(order), (step + lookahead) * batch))
        found = 0
        for position in window:
            index = order[position]
            while True:  # never one known unreadable: the order skips those
                try:
                    data = self.reader.read(index)[0]
                    check(data, self.max_pixels)
                    decode(data)
                    break
                except DECODE_ERRORS as error:
                    if self.unreadable.mark(index):
                        report_unreadable(self.reader.name_of(index), error)
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

    def _skip_mismatched_window(self, order: list[int], step: int, outputs) -> bool:
        """Whether a sample of batch ``step`` has a wrong window (:func:`.graph.window_mismatch`):
        it is then reported, remembered and replaced in ``order``, and the pipelines dropped.
        Raises :class:`DataError` past ``max_bad_share``."""
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
        self._check_refused()
        return True
