"""The training and evaluation passes, and one epoch of both.

Every number they return is global: sums over all ranks, each image counted once.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch
from torch import nn

from engine import bounds
from engine.distributed import reduce_sum, sync_buffers, unwrap
from engine.preempt import Stopped
from engine.reporting import Progress, StepTimer, device_clock, epoch_line, memory_mib
from engine.state import TrainState
from loaders import DataError, DistInfo, tree_cpu_seconds


def train_step(state: TrainState, images: torch.Tensor, labels: torch.Tensor, epoch: int,
               step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One optimizer step on a device batch (float ``(N, 3, H, W)``, int64 ``(N,)``): mix it
    (``state.mix``), forward under autocast, backward, gradient clipping
    (``state.clip_grad_norm``), the optimizer step through the scaler, then the LR
    scheduler and the EMA (step ``step`` of epoch ``epoch``). Returns the logits ``(N, C)``,
    the batch's mean loss (0-dim, detached) and the labels top-1 is scored against: ``labels``,
    or the argmax of the mixed soft labels."""
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
    """An epoch's running sums over all ranks, as a ``--save-every`` checkpoint's ``partial``
    holds them: summed loss (per-image loss x images), top-1 hits, images, seconds waited for
    data (summed over ranks) and wall seconds so far."""

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


def train_one_epoch(state: TrainState, loader, progress: Progress, dist: DistInfo,
                    start_batch: int = 0, carried: EpochSums | None = None,
                    warmup: int | None = None, save_every: int = 0, save_partial=None,
                    epoch: int = 0, stop=None) -> dict:
    """One pass over ``loader`` (epoch ``epoch``), which starts at batch ``start_batch``;
    ``carried`` holds the sums over all ranks for the batches before it. Every ``save_every``
    steps (not at the epoch's end) ``save_partial(next_batch, sums)`` checkpoints the
    position, ``sums`` an :class:`EpochSums` over all ranks (every rank calls it: a
    collective). ``stop`` (a :class:`~engine.distributed.StopAgreement`) is asked after every
    step: when the ranks agree to stop before the epoch's last step, the position is
    checkpointed the same way and :class:`~engine.preempt.Stopped` raised (at the last step
    the epoch ends as usual and the caller stops after it). Returns mean ``loss``, ``acc1``
    (%; with mixed labels against their argmax), ``images`` (all ranks), ``images_per_sec``
    (summed over ranks), ``steady_images_per_sec`` (the same after the pass's first
    ``warmup`` steps, which hold cuDNN autotuning and ``torch.compile``; None if the pass had
    no more steps) and
    ``data_time_fraction`` (share of wall time spent waiting for the next batch, mean over
    ranks); ``timing``: this rank's :class:`~engine.bounds.Steps` of this pass (per-batch
    waits and step times). The LR of every step goes to TensorBoard as ``step/lr`` (global
    rank 0). Raises :class:`DataError` if the loader yields nothing."""
    state.model.train()
    carried = carried or EpochSums()
    # A checkpoint's sums are global (all ranks): global rank 0 carries them, the others restart.
    if not dist.is_main:
        carried = EpochSums(seconds=carried.seconds)
    loss_sum = torch.full((), carried.loss_sum, device=dist.device)
    correct = torch.full((), carried.correct, device=dist.device, dtype=torch.int64)
    progress.carry(carried.images, carried.data_time, carried.seconds)
    lr = state.optimizer.param_groups[0]["lr"]  # the LR of the step just taken, for figures
    figures = lambda: {"loss": loss_sum.item() / progress.images,  # noqa: E731
                       "acc1": 100.0 * correct.item() / progress.images, "lr": lr}
    timer, pass_images, pass_start = StepTimer(dist.device), progress.images, time.perf_counter()
    for step, (images, labels) in progress.log_every(loader, figures, start_batch, warmup,
                                                     dist.device):
        lr = state.optimizer.param_groups[0]["lr"]
        if progress.writer:
            progress.writer.scalar("step/lr", lr, progress.first_step + step)
        timer.start()
        output, loss, truth = train_step(state, images, labels, epoch, step)
        timer.stop()
        loss_sum += loss * labels.size(0)
        correct += (output.argmax(1) == truth).sum()
        # The same steps on every rank, so the collectives here are safe.
        inside = step + 1 < progress.total
        stopping = stop is not None and stop.after_step() and inside
        if save_partial and inside and (stopping or save_every and (step + 1) % save_every == 0):
            save_partial(step + 1, _global_sums(loss_sum, correct, progress, dist))
        if stopping:
            raise Stopped(stop.agreed, epoch, step + 1)
    if progress.images == 0:
        raise DataError("the training loader yielded no batch")
    now = device_clock(dist.device)
    timing = bounds.Steps(progress.images - pass_images, now - pass_start, progress.waits,
                          timer.seconds())
    seconds = now - progress.start
    loss_total, correct_total, images, speed, data_share, steady_speed = reduce_sum(
        [loss_sum.item(), correct.item(), progress.images, progress.images / seconds,
         progress.data_time / seconds, progress.steady_images_per_sec(now)], dist)
    return {"loss": loss_total / images, "acc1": 100.0 * correct_total / images,
            "images": int(images), "images_per_sec": speed,
            "steady_images_per_sec": steady_speed or None,
            "data_time_fraction": data_share / dist.world_size, "timing": timing}


def _global_sums(loss_sum, correct, progress: Progress, dist: DistInfo) -> EpochSums:
    """The running sums over all ranks (a collective)."""
    sums = reduce_sum([loss_sum.item(), correct.item(), progress.images, progress.data_time],
                      dist)
    return EpochSums(sums[0], int(sums[1]), int(sums[2]), sums[3], progress.elapsed())


@torch.no_grad()
def evaluate(model: nn.Module, loader, criterion: nn.Module, autocast_: Callable,
             progress: Progress, dist: DistInfo, flip_tta: bool = False) -> dict:
    """Mean ``loss``, top-1 ``acc1`` and top-5 ``acc5`` (%) over ``images`` validation images,
    summed over all ranks' shards (each image counted once). Rank 0's BatchNorm buffers are
    used on every rank. ``autocast_``: a factory of the autocast context. ``flip_tta``
    (``--val-flip-tta``): the logits are the mean of the image's and its horizontal mirror's,
    as FFCV's ``lr_tta`` (which sums them: the same ranking)."""
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


@dataclass(frozen=True)
class EpochPlan:
    """How an epoch runs and reports: ``print_freq`` steps between progress lines, ``warmup``
    steps left out of ``steady_images_per_sec``, ``save_every`` steps between mid-epoch
    checkpoints (0: none), ``log`` (print on global rank 0, else a no-op) and
    ``writer`` (a :class:`~engine.reporting.MetricsWriter` on global rank 0, else None);
    ``resolution``: the training crop side per epoch
    (:class:`~engine.resolution.ResolutionSchedule`; None: the loader's fixed size);
    ``flip_tta``: validate with flip averaging (see :func:`evaluate`); ``stop``: the
    :class:`~engine.distributed.StopAgreement` asked after every step (None: never stop);
    ``machine``: the :class:`~engine.bounds.Machine` the epoch's stage report and advice are
    for (None: no report)."""

    print_freq: int
    warmup: int
    save_every: int
    log: Callable
    writer: object = None
    resolution: object = None
    flip_tta: bool = False
    stop: object = None
    machine: object = None


def run_epoch(epoch: int, state: TrainState, train_loader, val_loader, dist: DistInfo,
              plan: EpochPlan, save_partial=None, resumed_from: dict | None = None) -> dict:
    """Train one epoch (from a mid-epoch checkpoint's position if ``resumed_from``), validate
    (the EMA too, as ``val_ema_loss``/``val_ema_acc1``/``val_ema_acc5``, with ``state.ema``),
    log and write; returns the epoch's metrics (the ``metrics.jsonl`` object), all global:
    losses and accuracies over all ranks, images/s summed over ranks. ``save_partial(epoch,
    batch, sums)``: see :func:`train_one_epoch`."""
    start_batch = resumed_from["batch"] if resumed_from else 0
    carried = EpochSums.from_dict(resumed_from["partial"]) if resumed_from else None
    start = time.perf_counter() - (carried.seconds if carried else 0.0)
    if plan.resolution is not None and plan.resolution.progressive:
        train_loader.set_resolution(plan.resolution.at(epoch))  # a function of the epoch alone
    rest = resumed_from.get("rest") if resumed_from else None  # dealt anew: engine/position.py
    train_loader.set_epoch(epoch, start_batch, rest)
    lr = state.optimizer.param_groups[0]["lr"]
    total = start_batch + len(train_loader)
    progress = Progress(total, f"Epoch: [{epoch}]", "train", plan.print_freq, dist.is_main,
                        plan.writer, epoch * total)
    cpu_start, wall_start = tree_cpu_seconds(), time.perf_counter()
    train = train_one_epoch(
        state, train_loader, progress, dist, start_batch, carried, plan.warmup,
        plan.save_every, save_partial and (lambda batch, sums: save_partial(epoch, batch, sums)),
        epoch, plan.stop)
    stages = _stage_report(train_loader, train["timing"], plan.machine, cpu_start, wall_start)
    val_progress = Progress(len(val_loader), "Test: ", "val", plan.print_freq, dist.is_main)
    val = evaluate(state.model, val_loader, state.criterion, state.autocast, val_progress, dist,
                   plan.flip_tta)
    ema = {}
    if state.ema is not None:
        ema_progress = Progress(len(val_loader), "Test EMA: ", "val_ema", plan.print_freq,
                                dist.is_main)
        ema = evaluate(state.ema, val_loader, state.criterion, state.autocast, ema_progress, dist,
                       plan.flip_tta)
    epoch_metrics = {
        "epoch": epoch, "train_res": getattr(train_loader, "resolution", None),
        "train_loss": train["loss"], "train_acc1": train["acc1"],
        "val_loss": val["loss"], "val_acc1": val["acc1"], "val_acc5": val["acc5"], "lr": lr,
        "train_images_per_sec": train["images_per_sec"], "train_images": train["images"],
        "steady_images_per_sec": train["steady_images_per_sec"],
        "val_images": val["images"],
        "data_time_fraction": train["data_time_fraction"],
        "epoch_seconds": time.perf_counter() - start,
        **{f"val_ema_{key}": ema[key] for key in ("loss", "acc1", "acc5") if ema},
        **memory_mib(dist.device),
        **(stages["metrics"] if stages else {}),
    }
    plan.log(epoch_line(epoch_metrics))
    for line in stages["lines"] if stages else ():
        plan.log(line)
    if plan.writer:
        plan.writer.write(epoch_metrics)
    return epoch_metrics


def _stage_report(train_loader, timing, machine, cpu_start: float | None,
                  wall_start: float) -> dict | None:
    """:func:`engine.bounds.report` of the training pass just done on this rank: the loader's
    stage figures (``stage_summary()``, None for loaders without), ``timing`` and ``machine``
    with the cores this process and its workers kept busy over the pass; None without a
    ``machine``."""
    if machine is None:
        return None
    cpu_end, wall = tree_cpu_seconds(), time.perf_counter() - wall_start
    busy = None if cpu_start is None or cpu_end is None or wall <= 0 else \
        (cpu_end - cpu_start) / wall
    summary = getattr(train_loader, "stage_summary", None)
    return bounds.report(summary() if summary else None, timing,
                         dataclasses.replace(machine, busy_cores=busy))


def loader_stage_report(loader, machine, stats: dict) -> dict:
    """:func:`engine.bounds.report` of ``--benchmark-data``: ``loader``'s stage figures (None
    for loaders without), no training thread, ``machine`` with the cores busy over the timed
    batches (``stats``: :func:`loaders.measure_throughput`'s ``cpu_seconds`` and
    ``seconds``)."""
    cpu = stats.get("cpu_seconds")
    busy = cpu / stats["seconds"] if cpu is not None and stats["seconds"] > 0 else None
    summary = getattr(loader, "stage_summary", None)
    return bounds.report(summary() if summary else None, None,
                         dataclasses.replace(machine, busy_cores=busy))
