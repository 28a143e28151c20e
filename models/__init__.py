"""Model construction: torchvision classification models by name, plus our own registered ones.

``build_model(arch, num_classes, pretrained)`` is the one entry point main.py uses.
"""
from __future__ import annotations

import os
from typing import Callable

import torch
import torchvision
from torch import nn

# name -> factory(num_classes=...) for architectures that are not in torchvision
_REGISTRY: dict[str, Callable[..., nn.Module]] = {}


class ModelError(Exception):
    """Unknown architecture or unavailable pretrained weights: one-line message."""


def register(name: str):
    """Decorator adding ``factory(num_classes: int) -> nn.Module`` under ``name``."""
    def wrap(factory):
        _REGISTRY[name] = factory
        return factory
    return wrap


def model_names() -> list[str]:
    """Sorted names accepted by ``-a/--arch``: torchvision classification models and ours."""
    return sorted(set(torchvision.models.list_models(module=torchvision.models)) | set(_REGISTRY))


def check_arch(arch: str) -> None:
    """Raise :class:`ModelError` unless ``arch`` is a known architecture name."""
    if arch not in model_names():
        raise ModelError(f"unknown architecture {arch!r}; choose one of torchvision.models.list_models()")


def cached_weights_path(arch: str) -> str:
    """Where torch.hub keeps ``arch``'s default torchvision weights (``$TORCH_HOME/hub/checkpoints``)."""
    weights = torchvision.models.get_model_weights(arch).DEFAULT
    return os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(weights.url))


def build_model(arch: str, num_classes: int, pretrained: bool = False,
                blurpool: bool = False) -> nn.Module:
    """A classification model ``arch`` with a ``num_classes``-way output.

    Input float ``(N, 3, H, W)``, output float logits ``(N, num_classes)``. With ``pretrained``,
    torchvision's default ImageNet weights are loaded from the torch.hub cache only (never
    downloaded at run time); if ``num_classes`` differs from the weights' 1000 classes, the
    final linear layer is replaced by a freshly initialised one. With ``blurpool`` (FFCV's
    ``use_blurpool``), strided convolutions get a blur in front (:mod:`models.blurpool`).

    Raises :class:`ModelError` for an unknown ``arch`` or pretrained weights not on disk.
    """
    model = _build(arch, num_classes, pretrained)
    if blurpool:
        from models.blurpool import apply_blurpool

        apply_blurpool(model)
    return model


def _build(arch: str, num_classes: int, pretrained: bool) -> nn.Module:
    if arch in _REGISTRY:
        if pretrained:
            raise ModelError(f"--pretrained: no pretrained weights for {arch}")
        return _REGISTRY[arch](num_classes=num_classes)
    check_arch(arch)
    if not pretrained:
        return torchvision.models.get_model(arch, weights=None, num_classes=num_classes)
    path = cached_weights_path(arch)
    if not os.path.isfile(path):
        raise ModelError(
            f"--pretrained: {arch} weights are not on disk at {path} (no download at run time); "
            "copy the file there or set TORCH_HOME")
    weights = torchvision.models.get_model_weights(arch).DEFAULT
    model = torchvision.models.get_model(arch, weights=weights)
    if num_classes != len(weights.meta["categories"]):
        _replace_classifier(model, num_classes)
    return model


def _replace_classifier(model: nn.Module, num_classes: int) -> None:
    """Swap the last ``nn.Linear`` (the classifier in torchvision's models) for a new one."""
    name, last = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)][-1]
    parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
    setattr(parent, name.rpartition(".")[2], nn.Linear(last.in_features, num_classes))
