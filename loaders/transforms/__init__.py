"""Transforms: ``crops`` (bytes -> uint8), ``auto_augment``, ``normalize``, ``erasing``."""
from __future__ import annotations

from .crops import (RRC_ATTEMPTS, RRC_RATIO, RRC_SCALE, TrainTransform, ValTransform,
                    center_crop_box, center_crop_plan, random_resized_crop_params,
                    resize_center_crop, split_transform)
