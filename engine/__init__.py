"""The training engine behind ``main.py``, one module per concern (docs/architecture.md, *The
run*): ``cli`` (every flag), ``settings``, ``distributed``, ``state``, ``optim``, ``recipes``,
``loop``, ``checkpoint``, ``reporting``, ... Submodules are imported by name (``from
engine.loop import train_one_epoch``); this package only defines the error type they share.
"""


class ConfigError(Exception):
    """Bad settings (preset, flags, output directory, checkpoint): one-line message."""
