"""The loaders' errors, each a one-line message for the user."""
from __future__ import annotations

from formats.errors import DataError


class AcceleratorError(Exception):
    """The GPU or its driver failed (CUDA out of memory, a CUDA error inside a DALI pipeline):
    not a data problem, so nothing is retried or skipped."""
