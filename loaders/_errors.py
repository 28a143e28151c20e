"""The loaders' error type, in its own module so every helper module can raise it."""


class DataError(Exception):
    """Bad data input (missing directory, wrong format, inconsistent splits, too many damaged
    samples): a one-line message for the user."""


class AcceleratorError(Exception):
    """The GPU or its driver failed (CUDA out of memory, a CUDA error inside a DALI pipeline):
    not a data problem, so nothing is retried or skipped; a one-line message for the user."""
