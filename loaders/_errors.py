"""The loaders' error type, in its own module so every helper module can raise it."""


class DataError(Exception):
    """Bad data input (missing directory, wrong format, inconsistent splits, too many damaged
    samples): a one-line message for the user."""
