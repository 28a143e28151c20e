"""The error for bad data input, raised by the formats' readers and every loader above them; in its
own module so any module can raise it."""
from __future__ import annotations


class DataError(Exception):
    """Bad data input (missing directory, wrong format, inconsistent splits, too many damaged
    samples, an unreachable shard): a one-line message. Re-raised from a DataLoader worker
    (``ExceptionWrapper.reraise``: ``"Caught DataError in DataLoader worker process N.\\nOriginal
    Traceback ..."``), it keeps only the original message."""

    def __init__(self, *args):
        if len(args) == 1 and isinstance(args[0], str) and args[0].startswith("Caught DataError"):
            lines = [line for line in args[0].splitlines() if line.strip()]
            found = [line.split("DataError: ", 1)[1] for line in lines if "DataError: " in line]
            args = (found[-1] if found else lines[-1],)
        super().__init__(*args)
