"""The error for bad data input, raised by the formats' readers and by every loader above them
(``loaders`` re-exports it): in its own module so any module can raise it."""
from __future__ import annotations


class DataError(Exception):
    """Bad data input (missing directory, wrong format, inconsistent splits, too many damaged
    samples, an unreachable shard): a one-line message for the user.

    Raised in a DataLoader worker, it reaches the main process through torch's
    ``ExceptionWrapper.reraise``, which builds ``DataError("Caught DataError in DataLoader worker
    process N.\\nOriginal Traceback ...")``; only the original one-line message is kept."""

    def __init__(self, *args):
        if len(args) == 1 and isinstance(args[0], str) and args[0].startswith("Caught DataError"):
            args = (_original_message(args[0]),)
        super().__init__(*args)


def _original_message(wrapped: str) -> str:
    lines = [line for line in wrapped.splitlines() if line.strip()]
    for line in reversed(lines):
        if "DataError: " in line:
            return line.split("DataError: ", 1)[1]
    return lines[-1] if lines else wrapped
