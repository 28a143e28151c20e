"""The training engine behind ``main.py``: one module per concern.

``distributed``: launching ``--multiprocessing-distributed`` processes, joining the process
group (a :class:`~engine.distributed.Job` value, nothing written to the command line's
namespace) and the collectives the loops need. ``loop``: the training and evaluation passes.
``checkpoint``: atomic save, load and restore. ``reporting``: per-step progress, the epoch's
metrics (``metrics.jsonl``, TensorBoard) and the data-bound warning. Submodules are imported
by name (``from engine.loop import train_one_epoch``); this package only defines the error type
they share.
"""


class ConfigError(Exception):
    """Bad settings (preset, flags, output directory, checkpoint): one-line message."""
