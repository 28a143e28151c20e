"""The training and validation passes and the epoch's metrics. Every number they return is
global: sums over all ranks, each image counted once."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch
from torch import nn

from engine.report import bounds
from engine.distributed.processes import StopAgreement, reduce_sum, sync_buffers, unwrap
from engine.distributed.preempt import Stopped
from engine.report.progress import MetricsWriter, Progress, StepTimer, device_clock, memory_mib
from engine.state import TrainState
from loaders import DataError, DistInfo, Loader, tree_cpu_seconds


def train_step(state: TrainState, images: torch.Tensor, labels: torch.Tensor, epoch: int,
               step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One optimizer step on a device batch (float ``(N, 3, H, W)``, int64 ``(N,)``): MixUp/CutMix,
    forward under autocast, backward, clipping, the scaler's optimizer step, the LR scheduler and
    the EMA (step ``step`` of ``epoch``). Returns the logits ``(N, C)``, the mean loss (0-dim,
    detached) and the labels top-1 is scored against (the mixed soft labels' argmax)."""
    targets = labels
    if state.mix is not None:
        images, targets = state.mix(images, labels)
    with state.autocast():
        output = state.model(images)
        loss = state.criterion(output, targets)
    state.optimizer.zero_grad(set_to_none=True)
    state.scaler.scale(loss).backward()
    if state.clip_grad_norm is not None:  # torchvision: on the unscaled gradients
        state.scaler.unscale_(state.optimizer)
        nn.utils.clip_grad_norm_(state.model.parameters(), state.clip_grad_norm)
    state.scaler.step(state.optimizer)
    state.scaler.update()
    state.scheduler.step()
    if state.ema is not None:
        state.ema.after_step(unwrap(state.model), epoch, step)
    return output, loss.detach(), targets.argmax(1) if targets.ndim == 2 else targets


@dataclass
class EpochSums:
    """An epoch's running sums over all ranks (a ``--save-every`` checkpoint's ``partial``):
    loss x images, top-1 hits, images, seconds waited for data, wall seconds so far."""

    loss_sum: float = 0.0
    correct: int = 0
    images: int = 0
    data_time: float = 0.0
    seconds: float = 0.0

    @classmethod
    def from_dict(cls, partial: dict | None) -> "EpochSums":
        return cls(**(partial or {}))

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class EpochPlan:
    """How a run's passes go and report: ``warmup`` steps left out of ``steady_images_per_sec``
    (None: no such figure); ``save(epoch, batch, sums)`` (a collective) every ``save_every`` steps
    (0: never); ``writer`` None off rank 0; ``machine`` for the stage report (None: none)."""

    dist: DistInfo
    print_freq: int
    warmup: int | None = None
    save_every: int = 0
    save: Callable[[int, int, EpochSums], None] | None = None
    writer: MetricsWriter | None = None
    stop: StopAgreement | None = None
    machine: bounds.Machine | None = None


def train_one_epoch(state: TrainState, loader: Loader, epoch: int, plan: EpochPlan,
                    resumed_from: dict | None = None) -> dict:
    """One training pass over ``loader`` in ``epoch``, from batch 0 or where ``resumed_from`` (a
    mid-epoch checkpoint) stood. Every ``plan.save_every`` steps, and when the ranks agree on
    ``plan.stop`` before the last step, ``plan.save`` checkpoints the position (then raises
    :class:`~engine.distributed.preempt.Stopped` for the stop). Each step's LR goes to TensorBoard. Returns,
    over all ranks: mean ``loss``, ``acc1`` (%), ``images``, ``images_per_sec`` (summed),
    ``steady_images_per_sec`` (after ``plan.warmup`` steps of cuDNN autotuning and
    ``torch.compile``; None without more steps), ``data_time_fraction`` (mean); this rank's
    first ``lr``, ``started`` (``time.perf_counter()`` at the epoch's start, less a resumed
    epoch's seconds) and ``stages``. Raises :class:`DataError` if the loader yields nothing."""
    state.model.train()
    dist, stop = plan.dist, plan.stop
    progress, carried, start_batch, started = _start_pass(loader, epoch, plan, resumed_from)
    loss_sum = torch.full((), carried.loss_sum, device=dist.device)
    correct = torch.full((), carried.correct, device=dist.device, dtype=torch.int64)
    first_lr = lr = state.optimizer.param_groups[0]["lr"]  # the step just taken's, for figures
    figures = lambda: {"loss": loss_sum.item() / progress.images,  # noqa: E731
                       "acc1": 100.0 * correct.item() / progress.images, "lr": lr}
    timer, pass_images, pass_start = StepTimer(dist.device), progress.images, time.perf_counter()
    cpu_start = tree_cpu_seconds()
    for step, (images, labels) in progress.log_every(loader, figures, start_batch, plan.warmup,
                                                     dist.device):
        lr = state.optimizer.param_groups[0]["lr"]
        if progress.writer:
            progress.writer.scalar("step/lr", lr, progress.first_step + step)
        timer.start()
        output, loss, truth = train_step(state, images, labels, epoch, step)
        timer.stop()
        loss_sum += loss * labels.size(0)
        correct += (output.argmax(1) == truth).sum()
        # the same steps on every rank: the collectives here are safe
        inside = step + 1 < progress.total
        stopping = stop is not None and stop.after_step() and inside
        if plan.save and inside and (stopping or plan.save_every
                                     and (step + 1) % plan.save_every == 0):
            plan.save(epoch, step + 1, _global_sums(loss_sum, correct, progress, dist))
        if stopping:
            raise Stopped(stop.agreed, epoch, step + 1)
    if progress.images == 0:
        raise DataError("the training loader yielded no batch")
    now, cpu_end = device_clock(dist.device), tree_cpu_seconds()
    timing = bounds.Steps(progress.images - pass_images, now - pass_start, progress.waits,
                          timer.seconds())
    cpu = None if cpu_start is None or cpu_end is None else cpu_end - cpu_start
    stages = plan.machine and stage_report(loader, timing, plan.machine, cpu,
                                           time.perf_counter() - pass_start)
    return {**_pass_figures(loss_sum, correct, progress, now, dist), "lr": first_lr,
            "started": started, "stages": stages}


def _start_pass(loader: Loader, epoch: int, plan: EpochPlan,
                resumed_from: dict | None) -> tuple:
    """Set ``loader`` to the epoch; return ``(progress, carried, start_batch, started)``."""
    start_batch = resumed_from["batch"] if resumed_from else 0
    carried = EpochSums.from_dict(resumed_from["partial"] if resumed_from else None)
    started = time.perf_counter() - carried.seconds
    loader.set_epoch(epoch, start_batch, resumed_from.get("rest") if resumed_from else None)
    total = start_batch + len(loader)
    progress = Progress(total, f"Epoch: [{epoch}]", "train", plan.print_freq, plan.dist.is_main,
                        plan.writer, epoch * total)
    if not plan.dist.is_main:  # a checkpoint's sums are global: global rank 0 carries them
        carried = EpochSums(seconds=carried.seconds)
    progress.carry(carried.images, carried.data_time, carried.seconds)
    return progress, carried, start_batch, started


def _pass_figures(loss_sum, correct, progress: Progress, now: float, dist: DistInfo) -> dict:
    """The pass's figures over all ranks (a collective); ``now``: a :func:`device_clock`."""
    seconds = now - progress.start
    loss_total, correct_total, images, speed, data_share, steady_speed = reduce_sum(
        [loss_sum.item(), correct.item(), progress.images, progress.images / seconds,
         progress.data_time / seconds, progress.steady_images_per_sec(now)], dist)
    return {"loss": loss_total / images, "acc1": 100.0 * correct_total / images,
            "images": int(images), "images_per_sec": speed,
            "steady_images_per_sec": steady_speed or None,
            "data_time_fraction": data_share / dist.world_size}


def _global_sums(loss_sum, correct, progress: Progress, dist: DistInfo) -> EpochSums:
    """The running sums over all ranks (a collective)."""
    sums = reduce_sum([loss_sum.item(), correct.item(), progress.images, progress.data_time],
                      dist)
    return EpochSums(sums[0], int(sums[1]), int(sums[2]), sums[3], progress.elapsed())


@torch.no_grad()
def evaluate(model: nn.Module, loader: Loader, criterion: nn.Module, autocast_: Callable,
             progress: Progress, dist: DistInfo, flip_tta: bool = False) -> dict:
    """Mean ``loss``, top-1 ``acc1`` and top-5 ``acc5`` (%) over ``images`` validation images of
    all ranks, each with rank 0's BatchNorm buffers. ``flip_tta``: logits averaged with the
    horizontal mirror's, as FFCV's ``lr_tta`` (which sums them: the same ranking)."""
    sync_buffers(model, dist)
    model = unwrap(model)  # no DDP collectives: ranks may hold different batch counts
    model.eval()
    loss_sum = torch.zeros((), device=dist.device)
    correct = torch.zeros(2, device=dist.device, dtype=torch.int64)
    k = min(5, len(loader.classes))
    figures = lambda: {"loss": loss_sum.item() / progress.images,  # noqa: E731
                       "acc1": 100.0 * correct[0].item() / progress.images,
                       "acc5": 100.0 * correct[1].item() / progress.images}
    for _, (images, labels) in progress.log_every(loader, figures):
        with autocast_():
            output = model(images)
            if flip_tta:
                output = (output + model(images.flip(3))) / 2
            loss = criterion(output, labels)
        loss_sum += loss.float() * labels.size(0)
        hits = output.topk(k, dim=1).indices == labels[:, None]
        correct += torch.stack([hits[:, 0].sum(), hits.any(dim=1).sum()])
    loss_total, top1, top5, images = reduce_sum(
        [loss_sum.item(), correct[0].item(), correct[1].item(), progress.images], dist)
    n = max(images, 1)
    return {"loss": loss_total / n, "acc1": 100.0 * top1 / n, "acc5": 100.0 * top5 / n,
            "images": int(images)}


def validate(state: TrainState, loader: Loader, plan: EpochPlan, flip_tta: bool = False
             ) -> tuple[dict, dict]:
    """``(val, ema)``: :func:`evaluate` of ``state.model`` and ``state.ema`` (``{}``: none)."""
    progress = Progress(len(loader), "Test: ", "val", plan.print_freq, plan.dist.is_main)
    val = evaluate(state.model, loader, state.criterion, state.autocast, progress, plan.dist,
                   flip_tta)
    if state.ema is None:
        return val, {}
    progress = Progress(len(loader), "Test EMA: ", "val_ema", plan.print_freq, plan.dist.is_main)
    return val, evaluate(state.ema, loader, state.criterion, state.autocast, progress,
                         plan.dist, flip_tta)


def epoch_metrics(epoch: int, train: dict, val: dict, ema: dict, train_loader,
                  device: torch.device) -> dict:
    """The epoch's ``metrics.jsonl`` object (global figures) from the passes' (the EMA's as
    ``val_ema_*``), with ``train_res``, ``epoch_seconds``, :func:`memory_mib` and ``stages_*``."""
    stages = train["stages"]
    return {
        "epoch": epoch, "train_res": getattr(train_loader, "resolution", None),
        "train_loss": train["loss"], "train_acc1": train["acc1"],
        "val_loss": val["loss"], "val_acc1": val["acc1"], "val_acc5": val["acc5"],
        "lr": train["lr"], "train_images_per_sec": train["images_per_sec"],
        "train_images": train["images"],
        "steady_images_per_sec": train["steady_images_per_sec"],
        "val_images": val["images"],
        "data_time_fraction": train["data_time_fraction"],
        "epoch_seconds": time.perf_counter() - train["started"],
        **{f"val_ema_{key}": ema[key] for key in ("loss", "acc1", "acc5") if ema},
        **memory_mib(device),
        **(stages["metrics"] if stages else {}),
    }


def stage_report(loader, steps: bounds.Steps | None, machine: bounds.Machine,
                 cpu_seconds: float | None, wall_seconds: float) -> dict:
    """:func:`engine.report.bounds.report` of a pass over ``loader`` on this rank, ``machine``'s busy
    cores being ``cpu_seconds`` (None: unknown) of this process tree over ``wall_seconds``."""
    busy = cpu_seconds / wall_seconds if cpu_seconds is not None and wall_seconds > 0 else None
    summary = getattr(loader, "stage_summary", None)
    return bounds.report(summary() if summary else None, steps,
                         dataclasses.replace(machine, busy_cores=busy))
