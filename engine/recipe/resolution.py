"""Progressive resizing, as FFCV trains ImageNet (ffcv-imagenet ``train_imagenet.py``,
``get_resolution``): low-resolution epochs cost fewer FLOPs and decode smaller crops; the last
epochs at a higher resolution, and testing above it, recover the accuracy (Touvron et al. 2019,
"Fixing the train-test resolution discrepancy")."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from engine import ConfigError

FFCV_RES_STEP = 32  # ffcv-imagenet get_resolution rounds sizes to a multiple of 32 px


@dataclass(frozen=True)
class ResolutionSchedule:
    """The RandomResizedCrop side (px) of every training epoch, as FFCV's ``get_resolution``:
    ``min_res`` up to epoch ``start_ramp`` (0-based), ``max_res`` from ``end_ramp`` on, in between
    linear, rounded to a multiple of ``step`` and clamped to ``[min_res, max_res]`` (FFCV does
    not clamp; the loaders' batch slots are sized for ``max_res``)."""

    min_res: int
    max_res: int
    start_ramp: float = 0.0
    end_ramp: float = 0.0
    step: int = FFCV_RES_STEP

    @property
    def progressive(self) -> bool:
        return self.min_res != self.max_res

    def at(self, epoch: int) -> int:
        """The training crop side (px) of ``epoch`` (0-based)."""
        if not self.progressive or epoch <= self.start_ramp:
            return self.min_res
        if epoch >= self.end_ramp:
            return self.max_res
        share = (epoch - self.start_ramp) / (self.end_ramp - self.start_ramp)
        size = round((self.min_res + share * (self.max_res - self.min_res)) / self.step) * self.step
        return min(self.max_res, max(self.min_res, size))


def resolution_schedule(args: argparse.Namespace) -> ResolutionSchedule:
    """The run's :class:`ResolutionSchedule`. Raises :class:`ConfigError` for sizes below 1 px,
    a validation crop above its resize, ``--max-res`` below ``--min-res``, or a bad ramp."""
    low = args.min_res if args.min_res is not None else args.train_crop_size
    high = args.max_res if args.max_res is not None else low
    schedule = ResolutionSchedule(low, high, args.start_ramp,
                                  args.end_ramp if args.end_ramp is not None else 0, args.res_step)
    problems = [
        (low < 1 or high < 1 or args.val_crop_size < 1 or args.val_resize_size < 1,
         "--min-res/--max-res/--train-crop-size/--val-*-size must be >= 1 px"),
        (args.val_crop_size > args.val_resize_size, f"--val-crop-size {args.val_crop_size} "
         f"exceeds --val-resize-size {args.val_resize_size}"),
        (high < low, f"--max-res {high} is below --min-res {low}"),
        (args.res_step < 1, "--res-step must be >= 1"),
        (schedule.progressive and args.end_ramp is None,
         f"--min-res {low} --max-res {high} needs --end-ramp (the first epoch at --max-res)"),
        (schedule.progressive and args.end_ramp is not None
         and not 0 <= args.start_ramp < args.end_ramp,
         f"--start-ramp {args.start_ramp:g} --end-ramp {args.end_ramp or 0:g}: expected "
         "0 <= start < end"),
    ]
    for bad, message in problems:
        if bad:
            raise ConfigError(message)
    return schedule
