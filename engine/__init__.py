"""The training engine behind ``main.py``, one module per concern (docs/architecture.md, *The
run*), imported by name; this package defines only the error type they share."""


class ConfigError(Exception):
    """Bad settings (preset, flags, output directory, checkpoint): one-line message."""
