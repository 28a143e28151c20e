"""What a run shows and records: per-step progress and timing, the epoch's metrics
(``metrics.jsonl`` and TensorBoard) and the data-bound warning."""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Callable, Iterable, Iterator

import torch

from engine import ConfigError
from loaders.timing.stages import read_event_pairs

_FORMATS = {"loss": "loss {:.4f}", "acc1": "Acc@1 {:.2f}", "acc5": "Acc@5 {:.2f}",
            "lr": "lr {:.4g}", "images_per_sec": "{:.1f} images/s", "data_time_fraction": "data {:.0%}"}


def device_clock(device: torch.device) -> float:
    """``time.perf_counter()`` (seconds) once the work queued on ``device`` has finished."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def memory_mib(device: torch.device) -> dict:
    """``host_rss_mib`` (this process's RSS) and ``device_memory_mib`` (the CUDA device's use,
    DALI's included: growing memory is its most reported problem), MiB or None."""
    rss = None
    try:
        with open("/proc/self/status") as f:
            rss = next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError):
        pass
    used = None
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        used = (total - free) / 2**20
    return {"host_rss_mib": rss, "device_memory_mib": used}


class Progress:
    """One pass over a loader (as torchvision's ``MetricLogger.log_every``): its timing, and
    every ``print_freq`` steps ``figures()`` (a device sync) shown on rank 0, as a tqdm bar on a
    terminal, else pytorch/examples' ``ProgressMeter`` lines, and sent to TensorBoard."""

    def __init__(self, total: int, header: str, tag: str, print_freq: int, enabled: bool,
                 writer=None, first_step: int = 0):
        self.total, self.header, self.tag, self.print_freq = total, header, tag, print_freq
        self.enabled, self.writer, self.first_step = enabled, writer, first_step
        self.images, self.data_time = 0, 0.0  # images delivered; seconds waited for them
        self.waits: list[float] = []  # this pass's seconds waited per batch (engine.report.bounds)
        self.start = time.perf_counter()
        self.steady_from = None  # (device clock, images) once the warm-up steps are done

    def carry(self, images: int, data_time: float, seconds: float) -> None:
        """Continue the counts of an interrupted pass (a mid-epoch checkpoint's sums)."""
        self.images, self.data_time = images, data_time
        self.start = time.perf_counter() - seconds

    def elapsed(self) -> float:
        """Seconds since the pass started (including carried seconds)."""
        return time.perf_counter() - self.start

    def log_every(self, iterable: Iterable, figures: Callable[[], dict], start_step: int = 0,
                  warmup: int | None = None, device: torch.device | None = None) -> Iterator:
        """Yield ``(step, batch)`` from ``start_step``; start the steady clock after ``warmup``."""
        bar = None
        if self.enabled and sys.stdout.isatty():
            from tqdm import tqdm

            bar = tqdm(total=self.total, desc=self.header, unit="batch", leave=False,
                       dynamic_ncols=True)
        try:
            end = time.perf_counter()
            for step, batch in enumerate(iterable, start=start_step):
                waited = time.perf_counter() - end
                self.data_time += waited
                self.waits.append(waited)
                self.images += batch[1].size(0)
                yield step, batch
                if bar is not None:
                    bar.update(1)
                if self.enabled and self.print_freq > 0 and (
                        step % self.print_freq == 0 or step + 1 == self.total):
                    self._show(step, figures(), bar)
                if warmup is not None and step + 1 - start_step == warmup:
                    self.steady_from = (device_clock(device), self.images)
                end = time.perf_counter()
        finally:
            if bar is not None:
                bar.close()

    def steady_images_per_sec(self, now: float) -> float:
        """Images/s from the warm-up's end to ``now`` (:func:`device_clock`), else 0.0."""
        if self.steady_from is None or self.images <= self.steady_from[1]:
            return 0.0
        return (self.images - self.steady_from[1]) / (now - self.steady_from[0])

    def _show(self, step: int, figures: dict, bar) -> None:
        elapsed = self.elapsed()
        figures = {**figures, "images_per_sec": self.images / elapsed,
                   "data_time_fraction": self.data_time / elapsed}
        text = "  ".join(_FORMATS[key].format(value) for key, value in figures.items())
        if bar is not None:
            bar.set_postfix_str(text, refresh=False)
        else:
            print(f"{self.header}[{step + 1:>{len(str(self.total))}}/{self.total}]  {text}",
                  flush=True)
        if self.writer:
            for key, value in figures.items():
                self.writer.scalar(f"step/{self.tag}_{key}", value, self.first_step + step)


class StepTimer:
    """Seconds of each training step between :meth:`start` and :meth:`stop`: wall time on the
    CPU, CUDA events on the current stream on a GPU (no synchronisation: read once done)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.done: list[float] = []
        self._pending: list = []
        self._started = None

    def start(self) -> None:
        if self.cuda:
            self._started = torch.cuda.Event(enable_timing=True)
            self._started.record()
        else:
            self._started = time.perf_counter()

    def stop(self) -> None:
        if not self.cuda:
            self.done.append(time.perf_counter() - self._started)
            return
        ended = torch.cuda.Event(enable_timing=True)
        ended.record()
        self._pending.append((self._started, ended))
        if len(self._pending) >= 64:  # read the finished pairs now and then: no long list
            self._read(wait=False)

    def _read(self, wait: bool) -> None:
        self._pending = read_event_pairs(self._pending, self.done, wait)

    def seconds(self) -> list[float]:
        """Every step's seconds so far (waits for the GPU's last ones)."""
        self._read(wait=True)
        return self.done


class EventFile:
    """A TensorBoard event file of scalars, written in the calling thread (a DataLoader worker
    forked while ``SummaryWriter``'s thread holds a lock can hang), flushed at most every
    ``flush_secs``. Raises ``OSError`` if ``logdir`` cannot be written."""

    def __init__(self, logdir: str, flush_secs: float = 10.0):
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        os.makedirs(logdir, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
        self._records = RecordWriter(open(os.path.join(logdir, name), "ab"))
        self._flush_secs, self._flushed = flush_secs, time.monotonic()
        self._write(self._event(wall_time=time.time(), file_version="brain.Event:2"))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        """Record ``value`` under ``tag`` at global step ``step``."""
        summary = self._summary(value=[self._summary.Value(tag=tag, simple_value=float(value))])
        self._write(self._event(wall_time=time.time(), step=step, summary=summary))

    def _write(self, event) -> None:
        self._records.write(event.SerializeToString())
        if time.monotonic() - self._flushed > self._flush_secs:
            self.flush()

    def flush(self) -> None:
        self._records.flush()
        self._flushed = time.monotonic()

    def close(self) -> None:
        self._records.close()


class MetricsWriter:
    """One JSON object per epoch appended to ``OUTPUT/metrics.jsonl``, its numbers mirrored to
    ``OUTPUT/tensorboard``. Raises :class:`ConfigError` if ``OUTPUT`` cannot be written."""

    def __init__(self, output_dir: str):
        try:
            os.makedirs(output_dir, exist_ok=True)
            self.file = open(os.path.join(output_dir, "metrics.jsonl"), "a")
        except OSError as exc:
            raise ConfigError(f"--output-dir {output_dir}: cannot write ({exc.strerror})") from None
        self.tb = EventFile(os.path.join(output_dir, "tensorboard"))

    def write(self, epoch_metrics: dict) -> None:
        """Append ``epoch_metrics``; TensorBoard gets its numbers at step ``epoch``,
        ``stages_X`` as ``stages/X``, the rest as ``epoch/KEY``."""
        self.file.write(json.dumps(epoch_metrics) + "\n")
        self.file.flush()
        for key, value in epoch_metrics.items():
            if key == "epoch" or value is None or isinstance(value, (str, list)):
                continue
            tag = f"stages/{key[7:]}" if key.startswith("stages_") else f"epoch/{key}"
            self.tb.add_scalar(tag, value, epoch_metrics["epoch"])
        self.tb.flush()

    def scalar(self, tag: str, value: float, step: int) -> None:
        self.tb.add_scalar(tag, value, step)

    def close(self) -> None:
        self.file.close()
        self.tb.close()


def epoch_line(m: dict) -> str:
    """The line printed per epoch from its ``metrics.jsonl`` object ``m``."""
    ema = f" EMA top-1 {m['val_ema_acc1']:.2f}" if "val_ema_acc1" in m else ""
    res = f" at {m['train_res']} px" if m.get("train_res") else ""
    return (f"epoch {m['epoch']}: train{res} loss {m['train_loss']:.4f} "
            f"top-1 {m['train_acc1']:.2f} | "
            f"val loss {m['val_loss']:.4f} top-1 {m['val_acc1']:.2f} "
            f"top-5 {m['val_acc5']:.2f}{ema} | {m['train_images_per_sec']:.1f} images/s, "
            f"data {100 * m['data_time_fraction']:.0f}% | {m['epoch_seconds']:.1f} s")


def report_epoch(epoch_metrics: dict, stages: dict | None, writer: MetricsWriter | None,
                 workers: int, log: Callable) -> None:
    """Log the epoch and its ``stages`` and record it with ``writer`` (if any)."""
    log(epoch_line(epoch_metrics))
    for line in stages["lines"] if stages else ():
        log(line)
    if writer:
        writer.write(epoch_metrics)
    warn_if_data_bound(epoch_metrics, workers, log)


def warn_if_data_bound(epoch_metrics: dict, workers: int, log, threshold: float = 0.25) -> None:
    """Warn when the epoch waited on data for more than ``threshold`` of its wall time,
    pointing at the ``stages_advice``, or general suggestions without a stage rate (DALI)."""
    share = epoch_metrics["data_time_fraction"]
    if share <= threshold:
        return
    head = (f"warning: {share:.0%} of training time went to waiting for data: the loader is "
            "the bottleneck.")
    advice = epoch_metrics.get("stages_advice")
    if advice:
        log(head + " The 'try' lines above are estimated from this epoch's stages")
    elif epoch_metrics.get("stages_loader_images_per_sec") is not None:
        log(head + " No flag change is estimated to help on this machine (the stages above "
            "say where the time goes)")
    else:
        log(head + f" Try more workers (-j, now {workers} per process), --lmdb or --dali, a "
            "local copy of the dataset, or measure with --benchmark-data")
