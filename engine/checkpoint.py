"""Checkpoints: pytorch/examples' keys plus AMP scaler, config, seed, per-rank RNG states and the
position inside an epoch; written atomically, restored into a :class:`~engine.state.TrainState`
from ours, pytorch/examples', torchvision references' or a bare state_dict (:func:`restore`)."""
from __future__ import annotations

import os
import random

import torch

from engine import ConfigError
from engine.distributed.processes import unwrap
from engine.recipe.optim import fill_momentum_buffers, position_scheduler
from engine.settings import RunSettings
from loaders import DistInfo

# Key parts wrappers add: DataParallel / DDP ``module.`` (pytorch/examples' AlexNet/VGG:
# ``features.module.``) and torch.compile ``_orig_mod.``.
WRAPPER_PARTS = {"module", "_orig_mod"}
# Each optimizer's param-group hyper-parameters (another optimizer's state lacks some); the
# IMPLEMENTATION_KEYS stay this run's, so a fused state saved on a GPU resumes on the CPU.
SGD_KEYS = {"lr", "momentum", "dampening", "weight_decay", "nesterov"}
OPTIMIZER_KEYS = {"SGD": SGD_KEYS, "AdamW": {"lr", "betas", "eps", "weight_decay", "amsgrad"},
                  "RMSprop": {"lr", "alpha", "eps", "weight_decay", "momentum", "centered"}}
IMPLEMENTATION_KEYS = ("foreach", "fused", "differentiable")


def restore_rng(saved, dist: DistInfo) -> None:
    """Restore this rank's RNG states from ``rng`` (a list by rank, or rank 0's dict with a list
    of devices' ``cuda``) where saved for it; else it keeps its ``seed + rank`` streams."""
    states = saved if isinstance(saved, list) else [saved]
    if dist.rank >= len(states):
        return
    state = states[dist.rank]
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if dist.device.type != "cuda" or cuda is None:
        return
    if isinstance(cuda, list):  # a dict's: every visible device's state, by index
        if dist.device.index >= len(cuda):
            return
        cuda = cuda[dist.device.index]
    torch.cuda.set_rng_state(cuda, dist.device)


def checkpoint_state(state, s: RunSettings, epoch: int, best_acc1: float, rng_states: list[dict],
                     batch: int = 0, partial: dict | None = None,
                     position: dict | None = None) -> dict:
    """The checkpoint of ``state``: the ``epoch`` to run next and its ``batch`` to start with
    (> 0 only for ``--save-every``, then with the epoch's global sums, ``partial``, and
    ``position``: :func:`loaders.orders.positions.position_record`), ``config``
    (``vars(args)``), the resolved ``seed``, every rank's ``rng`` and any ``model_ema``."""
    ema = getattr(state, "ema", None)
    config = s.output.config
    return {**({"model_ema": ema.state_dict()} if ema is not None else {}),
        "epoch": epoch, "batch": batch, "partial": partial,
        **({"position": position} if batch and position else {}),
        "arch": config["arch"], "state_dict": unwrap(state.model).state_dict(),
        "best_acc1": best_acc1, "optimizer": state.optimizer.state_dict(),
        "scheduler": state.scheduler.state_dict(), "scaler": state.scaler.state_dict(),
        "config": dict(config), "seed": s.seed, "rng": rng_states,
    }


def save_checkpoint(state: dict, is_best: bool, output_dir: str) -> None:
    """Write ``checkpoint.pth.tar`` (and ``model_best.pth.tar``) through a temporary file and
    ``os.replace``: never a torn file. Raises :class:`ConfigError` if it fails (old one kept)."""
    names = ["checkpoint.pth.tar"] + (["model_best.pth.tar"] if is_best else [])
    for name in names:
        path = os.path.join(output_dir, name)
        tmp = f"{path}.tmp.{os.getpid()}"
        try:
            os.makedirs(output_dir, exist_ok=True)
            torch.save(state, tmp)
            os.replace(tmp, path)
        except (OSError, RuntimeError) as exc:  # torch.save reports a full disk as RuntimeError
            if os.path.exists(tmp):
                os.remove(tmp)
            reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
            raise ConfigError(f"cannot write checkpoint {path}: {reason}; the previous one "
                              "is intact") from None


CHECKPOINT_NAMES = ("checkpoint.pth.tar", "model_best.pth.tar")  # what save_checkpoint writes


def newest_checkpoint(output_dir: str) -> tuple[str | None, list[str]]:
    """``(path, skipped)``: the newest whole checkpoint in ``output_dir`` (a zip archive, as
    torch.save writes) or None, and the newer files passed over."""
    import zipfile

    found = []
    for name in CHECKPOINT_NAMES:
        path = os.path.join(output_dir, name)
        try:
            found.append((os.stat(path).st_mtime_ns, path))
        except OSError:
            continue
    skipped = []
    for _, path in sorted(found, reverse=True):
        if zipfile.is_zipfile(path):
            return path, skipped
        skipped.append(path)
    return None, skipped


def resume_path(resume: str, output_dir: str, log) -> str | None:
    """The checkpoint ``--resume`` names: ``auto`` -> :func:`newest_checkpoint` of
    ``output_dir`` (None: fresh), logged; a path as it is; ``""`` -> None."""
    if resume != "auto":
        return resume or None
    path, skipped = newest_checkpoint(output_dir)
    for bad in skipped:
        log(f"--resume auto: skipping {bad}: not a whole checkpoint")
    log(f"--resume auto: resuming from {path}" if path
        else f"--resume auto: no checkpoint in {output_dir}: starting fresh")
    return path


def load_checkpoint(path: str) -> dict:
    """Read a checkpoint onto the CPU (:func:`as_checkpoint`). Raises :class:`ConfigError` if it
    is missing, unreadable, or neither a checkpoint nor a state_dict."""
    if not os.path.isfile(path):
        raise ConfigError(f"--resume {path}: no such checkpoint file")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a damaged or foreign file
        raise ConfigError(f"--resume {path}: not a readable checkpoint ({type(exc).__name__})") from None
    return as_checkpoint(saved, path)


def _is_state_dict(saved) -> bool:
    return (isinstance(saved, dict) and bool(saved)
            and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in saved.items()))


def as_checkpoint(saved, path: str = "") -> dict:
    """``saved`` as a checkpoint dict: one with a ``state_dict`` as it is; torchvision
    references' ``{"model", "optimizer", "epoch", ...}`` as ``{"state_dict", "optimizer",
    "model_ema", "epoch": epoch + 1}`` (those it has); a bare state_dict as ``{"state_dict":
    saved}``. Raises :class:`ConfigError` naming what is missing for anything else."""
    where = f"--resume {path}".rstrip()
    if isinstance(saved, dict) and "state_dict" not in saved and _is_state_dict(
            saved.get("model")):
        # torchvision's "epoch" is the last done; its lr_scheduler is dropped: ours is placed
        saved = {"state_dict": saved["model"],
                 **({"epoch": int(saved["epoch"]) + 1} if "epoch" in saved else {}),
                 **{key: saved[key] for key in ("optimizer", "model_ema") if key in saved}}
    if isinstance(saved, dict) and "state_dict" in saved:
        if not isinstance(saved["state_dict"], dict):
            raise ConfigError(f"{where}: its state_dict is not a mapping of names to tensors")
        return saved
    if _is_state_dict(saved):
        return {"state_dict": saved}
    if isinstance(saved, dict):
        keys = ", ".join(sorted(map(str, saved))[:8]) or "none"
        raise ConfigError(f"{where}: neither a checkpoint nor a state_dict: no 'state_dict' key "
                          f"and not all tensors (keys: {keys})")
    raise ConfigError(f"{where}: neither a checkpoint nor a state_dict "
                      f"(a {type(saved).__name__})")


def _bare_key(key: str) -> str:
    return ".".join(part for part in key.split(".") if part not in WRAPPER_PARTS)


def _few(keys, n: int = 4) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:n]) + (f" and {len(keys) - n} more" if len(keys) > n else "")


def load_weights(model, state_dict: dict, arch: str, where: str = "--resume") -> None:
    """Load ``state_dict`` into the bare ``model``, whatever wrappers it was saved from. Raises
    :class:`ConfigError` naming missing, unexpected or misshapen keys (never a partial load)."""
    model = unwrap(model)
    own = model.state_dict()
    bare = {_bare_key(k): k for k in own}
    if len(bare) == len(own):  # else the model's own names hold such parts: take keys as saved
        state_dict = {bare.get(_bare_key(k), k): v for k, v in state_dict.items()}
    shapes = [f"{k} {list(v.shape)} vs {list(own[k].shape)}" for k, v in state_dict.items()
              if k in own and v.shape != own[k].shape]
    if shapes:
        raise ConfigError(f"{where}: state_dict does not fit -a {arch} (checkpoint vs model "
                          f"shapes: {_few(shapes, 2)}); another architecture or class count?")
    result = model.load_state_dict(state_dict, strict=False)
    problems = [f"{len(keys)} {what} keys ({_few(keys)})" for what, keys in
                (("missing", result.missing_keys), ("unexpected", result.unexpected_keys)) if keys]
    if problems:
        raise ConfigError(f"{where}: state_dict does not fit -a {arch}: " + "; ".join(problems))


def load_optimizer(optimizer, saved: dict, where: str = "--resume") -> None:
    """Load a state of this run's optimizer type, keeping this run's foreach/fused choice.
    Raises :class:`ConfigError` for another optimizer's state or other parameters'."""
    kind = type(optimizer).__name__
    needed = OPTIMIZER_KEYS.get(kind, SGD_KEYS)
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    lacking = needed - set.intersection(*(set(g) for g in groups)) if groups else needed
    if lacking:
        raise ConfigError(f"{where}: its optimizer state is not {kind}'s (no "
                          f"{', '.join(sorted(lacking))}); -e needs none, or train from its "
                          "weights saved as a bare state_dict")
    kept = [{k: g[k] for k in IMPLEMENTATION_KEYS if k in g} for g in optimizer.param_groups]
    try:
        optimizer.load_state_dict(saved)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise ConfigError(f"{where}: its optimizer state does not fit this model's {kind} "
                          f"({str(exc).splitlines()[0]})") from None
    for group, implementation in zip(optimizer.param_groups, kept):
        group.update(implementation)
    fill_momentum_buffers(optimizer)


def _saved_base_lrs(scheduler, saved) -> None:
    """Keep a saved scheduler's base LRs where they fit (pytorch/examples resumes at its LR)."""
    base = saved.get("base_lrs") if isinstance(saved, dict) else None
    if base and len(base) == len(scheduler.base_lrs):
        scheduler.base_lrs = [float(b) for b in base]


def restore(checkpoint: dict | None, state, s: RunSettings, steps_per_epoch: int,
            log=None) -> tuple[int, float]:
    """Load ``checkpoint`` into ``state`` (model not wrapped yet); return ``(start_epoch,
    best_acc1)``: the epoch to run next, the best top-1 (%), ``(--start-epoch, 0.0)`` without
    one. Weights always; under ``-e`` only them (the EMA's with ``--model-ema``); else, as far
    as saved, optimizer, scheduler at step ``epoch x steps_per_epoch + batch``, loss scale and
    RNG states. Raises :class:`ConfigError` for another architecture or state that does not fit."""
    if not checkpoint:
        return s.recipe.start_epoch, 0.0
    arch, path, evaluate = s.model.arch, s.resume or "", s.mode == "evaluate"
    if evaluate and s.recipe.model_ema:
        checkpoint = with_ema_weights(checkpoint, path, log)
    optimizer, scheduler, scaler = state.optimizer, state.scheduler, state.scaler
    checkpoint = as_checkpoint(checkpoint, path)
    where = f"--resume {path}".rstrip()
    if checkpoint.get("arch", arch) != arch:
        raise ConfigError(f"{where}: checkpoint is a {checkpoint['arch']}, not -a {arch}")
    load_weights(state.model, checkpoint["state_dict"], arch, where)
    start_epoch = int(checkpoint.get("epoch", s.recipe.start_epoch))
    best_acc1 = float(checkpoint.get("best_acc1", 0.0))
    weights_only = "optimizer" not in checkpoint
    if evaluate:
        message = (f"evaluating the weights in {path}" if weights_only
                   else f"resumed from {path} at epoch {start_epoch}")
    elif weights_only:
        position_scheduler(scheduler, optimizer, start_epoch * steps_per_epoch)
        missing = "/".join(k for k in ("optimizer", "epoch") if k not in checkpoint)
        message = (f"{where}: weights only (no {missing}): training from them with a fresh "
                   f"optimizer at epoch {start_epoch}")
    else:
        load_optimizer(optimizer, checkpoint["optimizer"], where)
        _saved_base_lrs(scheduler, checkpoint.get("scheduler"))
        position_scheduler(scheduler, optimizer,
                           start_epoch * steps_per_epoch + int(checkpoint.get("batch") or 0))
        if scaler.is_enabled() and checkpoint.get("scaler"):
            scaler.load_state_dict(checkpoint["scaler"])
        if checkpoint.get("rng") is not None:
            restore_rng(checkpoint["rng"], s.dist)
        message = f"resumed from {path} at epoch {start_epoch}" + (
            f", batch {checkpoint['batch']}" if checkpoint.get("batch") else "")
    if log:
        log(message)
    return start_epoch, best_acc1


def restore_ema(checkpoint: dict | None, ema, arch: str, path: str = "", log=None) -> None:
    """Load a checkpoint's ``model_ema`` into ``ema`` (else it starts from the restored model).
    Raises :class:`ConfigError` if it does not fit."""
    saved = (checkpoint or {}).get("model_ema")
    if not isinstance(saved, dict):
        if checkpoint and log:
            log(f"--resume {path}: no model_ema: the EMA starts from the resumed weights")
        return
    load_weights(ema.module, {k: v for k, v in saved.items() if k != "n_averaged"}, arch,
                 f"--resume {path} model_ema")
    if "n_averaged" in saved:
        ema.n_averaged.fill_(int(saved["n_averaged"]))


def with_ema_weights(checkpoint: dict, path: str = "", log=None) -> dict:
    """``-e --model-ema``: ``checkpoint`` with its ``model_ema`` as the ``state_dict`` to
    evaluate, or as it is if none is saved (logged)."""
    checkpoint = as_checkpoint(checkpoint, path)
    saved = checkpoint.get("model_ema")
    if not isinstance(saved, dict):
        if log:
            log(f"--model-ema: {path} holds no model_ema: evaluating its model weights")
        return checkpoint
    if log:
        log(f"--model-ema: evaluating the EMA weights (model_ema) of {path}")
    return {**checkpoint, "state_dict": {k: v for k, v in saved.items() if k != "n_averaged"}}
