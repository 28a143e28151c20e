"""The training engine behind ``main.py``: one module per concern.

``settings``: what a training process resolves from the command line, once (a frozen
:class:`~engine.settings.RunSettings`: loader, model, recipe and output settings; nothing below
``main.run`` reads the namespace). ``distributed``: launching ``--multiprocessing-distributed``
processes, joining the process group (a :class:`~engine.distributed.Job` value) and the
collectives the loops need. ``state``: the :class:`~engine.state.TrainState` a step touches and
how a run builds it. ``optim``: the optimizer (SGD, its weight-decay groups, the per-step LR
schedule, fused SGD's momentum buffers). ``recipes``: the training-recipe flags, MixUp/CutMix and
the EMA. ``loop``: the training and evaluation passes. ``checkpoint``: atomic save, load and
restore. ``reporting``: per-step progress, the epoch's metrics (``metrics.jsonl``, TensorBoard)
and the data-bound warning. Imports run one way, ``loaders``/``models`` < ``engine`` <
``main.py``. Submodules are imported by name (``from engine.loop import train_one_epoch``); this
package only defines the error type they share.
"""


class ConfigError(Exception):
    """Bad settings (preset, flags, output directory, checkpoint): one-line message."""
