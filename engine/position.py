"""A mid-epoch checkpoint's position (:func:`loaders.orders.positions.position_record`), placed
at the resuming run's layout: at the same layout the run resumes at ``batch``, to the bit; at
another world size, ``-b`` or ``-j`` the rest of the epoch's global order is dealt anew and the
per-step schedules (LR, warm-up, EMA, resolution) go on at the fraction of the epoch consumed.
What cannot go on exactly is a one-line :class:`~engine.ConfigError`: another dataset size, seed
or order kind; a checkpoint without a position at another world size or ``-b``; streamed shards
(read front to back by fixed workers) dealt anew."""
from __future__ import annotations

from dataclasses import asdict
from typing import Callable

from engine import ConfigError
from loaders.orders.positions import Layout, same_global_order


def place_resume(checkpoint: dict | None, train_loader, s, log: Callable) -> dict | None:
    """``checkpoint`` with a mid-epoch position placed at ``train_loader``'s layout: ``batch``
    the step to start at and ``rest`` (a :class:`~loaders.orders.positions.RestOfEpoch`) for
    ``set_epoch``; any other checkpoint as it is. Raises :class:`ConfigError` (see above)."""
    if not checkpoint or not checkpoint.get("batch") or "optimizer" not in checkpoint:
        return checkpoint
    epoch, batch = int(checkpoint.get("epoch", 0)), int(checkpoint["batch"])
    seed, config, where = s.seed, s.output.config, f"--resume {s.resume}"
    now = train_loader.layout
    saved = checkpoint.get("position")
    if saved is None:
        saved = _legacy_position(checkpoint, batch, now, config, where)
    else:
        _check_same_epoch_order(saved, train_loader.position_order, seed, where)
    try:
        origin, at = Layout.from_dict(saved["origin"]), Layout.from_dict(saved["layout"])
        consumed = int(saved["consumed"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{where}: its mid-epoch position record is malformed") from None
    order = train_loader.position_order
    same = same_global_order(order, origin, now)
    if not same and getattr(getattr(train_loader, "reader", None), "streaming", False):
        raise ConfigError(
            f"{where}: epoch {epoch} was read from streamed shards as {origin.describe()}, "
            f"-j {origin.workers}; streams cannot be dealt anew mid-epoch: resume with that "
            "layout, or from an epoch-end checkpoint")
    try:
        rest = train_loader.rest_of_epoch(epoch, consumed, origin)
    except ValueError as exc:
        raise ConfigError(f"{where}: its mid-epoch position does not fit this training set "
                          f"({exc})") from None
    if not same:
        _say_new_layout(log, epoch, rest, at, now, len(train_loader))
    return {**checkpoint, "batch": rest.start_batch, "rest": rest}


def _legacy_position(checkpoint: dict, batch: int, now: Layout, config: dict,
                     where: str) -> dict:
    """The position of a checkpoint without one: its ``batch`` at this layout, if saved at
    this world size and ``-b`` (else refused)."""
    rng = checkpoint.get("rng")
    world = len(rng) if isinstance(rng, list) else None
    saved_b = (checkpoint.get("config") or {}).get("batch_size")
    if (world is not None and world != now.world_size) or (
            saved_b is not None and saved_b != config.get("batch_size")):
        raise ConfigError(
            f"{where}: a mid-epoch checkpoint from before positions were recorded (saved at "
            f"world size {world or '?'}, -b {saved_b or '?'}) resumes only at that world size "
            "and -b; or resume from an epoch-end checkpoint")
    return {"consumed": batch * now.world_size * now.batch_size, "origin": asdict(now),
            "layout": asdict(now)}


def _check_same_epoch_order(saved: dict, order, seed: int, where: str) -> None:
    """Refuse a position of another dataset size, seed or order kind than this run's."""
    if saved.get("num_samples") != order.num_samples:
        raise ConfigError(f"{where}: its epoch was over {saved.get('num_samples')} training "
                          f"images, this training set has {order.num_samples}: resume on the "
                          "same dataset")
    if saved.get("seed") is not None and saved.get("seed") != getattr(order, "seed", None):
        raise ConfigError(f"{where}: its epoch was shuffled with --seed {saved['seed']}, this "
                          f"run has --seed {seed}: resume with --seed {saved['seed']}")
    kind = type(order).__name__
    if saved.get("order") not in (None, kind):
        raise ConfigError(f"{where}: its epoch was read in a {saved['order']}, this run reads "
                          f"a {kind} (--ra-sampler in one process, --lmdb-order, --loader): "
                          "resume with the saved run's reading flags and process count")


def _say_new_layout(log: Callable, epoch: int, rest, at: Layout, now: Layout,
                    steps: int) -> None:
    """One line on the re-dealt epoch, and one when the global batch changed."""
    log(f"resume: epoch {epoch} goes on after {rest.consumed} samples of its global order "
        f"(saved at {at.describe()}), dealt to {now.describe()}: step {rest.start_batch} of "
        f"{steps}; the epoch's last < {now.world_size * now.batch_size} samples sit out")
    old, new = at.world_size * at.batch_size, now.world_size * now.batch_size
    if old != new:
        log(f"resume: global batch {new}, was {old}: LR, warmup and EMA steps continue at the "
            f"same fraction of the epoch; the LR is the saved run's, set for a batch of {old} "
            "(not rescaled)")
