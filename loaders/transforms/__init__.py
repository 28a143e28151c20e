"""Transforms on uint8 images: ``crops`` (encoded bytes -> a uint8 crop: training's
RandomResizedCrop + flip, validation's resize + centre crop, and the windows other pipelines
decode), ``auto_augment`` (torchvision's ``--auto-augment`` policies on the uint8 crop, their
ops in ``_uint8_ops``) and ``normalize`` (uint8 batches to model inputs with the ImageNet
mean/std), as timm's and FFCV's transforms packages.
"""
from __future__ import annotations

from .crops import (RRC_ATTEMPTS, RRC_RATIO, RRC_SCALE, TrainTransform, ValTransform,
                    center_crop_box, center_crop_plan, random_resized_crop_params,
                    resize_center_crop, split_transform)

__all__ = ["RRC_ATTEMPTS", "RRC_RATIO", "RRC_SCALE", "TrainTransform", "ValTransform",
           "center_crop_box", "center_crop_plan", "random_resized_crop_params",
           "resize_center_crop", "split_transform"]
