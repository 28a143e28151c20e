"""Transforms on uint8 images: ``crops`` (bytes -> a uint8 crop), ``auto_augment`` (its ops in
``_uint8_ops``), ``normalize`` (to model inputs) and ``erasing`` (on the device batch)."""
from __future__ import annotations

from .crops import (RRC_ATTEMPTS, RRC_RATIO, RRC_SCALE, TrainTransform, ValTransform,
                    center_crop_box, center_crop_plan, random_resized_crop_params,
                    resize_center_crop, split_transform)
