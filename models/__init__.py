"""Model construction: torchvision classification models by name, plus our registered ones;
:func:`build_model` is main.py's entry point."""
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


def cached_weights_path(arch: str, weights=None) -> str:
    """Where torch.hub keeps ``arch``'s torchvision ``weights`` (an enum member; default the arch's
    ``DEFAULT``): ``$TORCH_HOME/hub/checkpoints/<file>``."""
    weights = weights or torchvision.models.get_model_weights(arch).DEFAULT
    return os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(weights.url))


def resolve_weights(arch: str, name: str):
    """``arch``'s torchvision weights named ``name`` (``IMAGENET1K_V2``,
    ``ResNet50_Weights.IMAGENET1K_V2``, ``DEFAULT``). Raises :class:`ModelError`."""
    check_arch(arch)
    if arch in _REGISTRY:
        raise ModelError(f"--weights {name}: {arch} has no torchvision weights")
    enum = torchvision.models.get_model_weights(arch)
    try:
        return enum.verify(name)
    except (KeyError, ValueError, TypeError):
        names = ", ".join(w.name for w in enum)
        raise ModelError(f"--weights {name}: not one of {arch}'s weights ({names}, DEFAULT)"
                         ) from None


def weights_eval_sizes(arch: str, name: str) -> tuple[int, int, str]:
    """``(resize, crop, interpolation)`` of the weights' ``transforms()`` (pixels, an
    ``--interpolation`` name). Raises :class:`ModelError`."""
    preset = resolve_weights(arch, name).transforms()
    return preset.resize_size[0], preset.crop_size[0], preset.interpolation.value


def build_model(arch: str, num_classes: int, pretrained: bool = False,
                blurpool: bool = False, weights: str | None = None) -> nn.Module:
    """Model ``arch``: float ``(N, 3, H, W)`` -> logits ``(N, num_classes)``. ``pretrained``
    (torchvision's default) or ``weights`` (:func:`resolve_weights`) load from the torch.hub cache
    only, never downloaded; another ``num_classes`` gets a new last linear layer. ``blurpool``:
    FFCV's (:mod:`models.blurpool`). Raises :class:`ModelError` for an unknown ``arch`` or weights,
    or weights not on disk."""
    model = _build(arch, num_classes, pretrained, weights)
    if blurpool:
        from models.blurpool import apply_blurpool

        apply_blurpool(model)
    return model


def _build(arch: str, num_classes: int, pretrained: bool, name: str | None = None) -> nn.Module:
    flag = f"--weights {name}" if name else "--pretrained"
    if arch in _REGISTRY:
        if pretrained or name:
            raise ModelError(f"{flag}: no pretrained weights for {arch}")
        return _REGISTRY[arch](num_classes=num_classes)
    check_arch(arch)
    if not pretrained and not name:
        return torchvision.models.get_model(arch, weights=None, num_classes=num_classes)
    weights = resolve_weights(arch, name or "DEFAULT")
    path = cached_weights_path(arch, weights)
    if not os.path.isfile(path):
        raise ModelError(
            f"{flag}: {arch} weights are not on disk at {path} (no download at run time); "
            "copy the file there or set TORCH_HOME")
    model = torchvision.models.get_model(arch, weights=weights)
    if num_classes != len(weights.meta["categories"]):
        _replace_classifier(model, num_classes)
    return model


def _replace_classifier(model: nn.Module, num_classes: int) -> None:
    """Swap the last ``nn.Linear`` (torchvision's classifier) for a new one."""
    name, last = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)][-1]
    parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
    setattr(parent, name.rpartition(".")[2], nn.Linear(last.in_features, num_classes))
