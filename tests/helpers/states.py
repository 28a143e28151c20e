"""The train state of a one-process run of a flag list, built in ``main.run``'s order."""
from __future__ import annotations


def settings_of(argv):
    """The :class:`engine.settings.RunSettings` of one process running ``argv`` (parsed as
    ``main.py`` parses it; no process group)."""
    import main
    from engine.distributed.processes import Job
    from engine.settings import resolve_settings
    from loaders import DistInfo

    return resolve_settings(main.parse_args(argv), Job(DistInfo()), None)


def state_of(s, loader):
    """The :class:`engine.state.TrainState` ``main.run`` builds for settings ``s`` over
    ``loader`` (its ``len()`` and ``classes``), without a checkpoint, EMA included."""
    from engine.recipe.optim import make_optimizer
    from engine.recipe.reference import resolve_recipe
    from engine.state import make_ema, make_model, train_state

    def log(*_args):
        pass

    recipe = resolve_recipe(s.recipe, s.loader.batch_size * s.dist.world_size, len(loader))
    model = make_model(s, len(loader.classes), log)
    optimizer = make_optimizer(model, recipe.lr, s.recipe.momentum, s.recipe.weight_decay,
                               s.dist.device, s.recipe.opt, recipe.decays)
    state = train_state(model, optimizer, s, recipe, len(loader.classes))
    state.ema = make_ema(model, s, recipe, None, log)
    return state
