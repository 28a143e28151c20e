"""torchvision 0.29's ``--auto-augment`` policies on uint8 crops, its draws in its order and its
pixels: ``ta_wide`` (Mueller & Hutter 2021), ``ra`` (Cubuk et al. 2020), ``augmix`` (Hendrycks
et al. 2020), AutoAugment's ``imagenet``, ``cifar10``, ``svhn`` (Cubuk et al. 2019)."""
from __future__ import annotations

from typing import Callable

import torch
from torchvision.transforms import v2

from ._uint8_ops import OPS

# --auto-augment values, as torchvision's presets.py accepts them (AutoAugmentPolicy's values too)
POLICIES = ("ta_wide", "ra", "augmix", "imagenet", "cifar10", "svhn")
# --interpolation values (torchvision's InterpolationMode names the flag takes)
INTERPOLATIONS = ("nearest", "bilinear", "bicubic")
_NONE = (lambda bins, height, width: None, False)


def _upto(top: float):
    return lambda bins, height, width: torch.linspace(0.0, top, bins)


def _space(shear: float, translate, rotate: float, enhance: float, bits: int, step: int,
           enhance_last: bool = False) -> dict:
    """torchvision 0.29's ``_AUGMENTATION_SPACE`` of a policy, in its order: op -> ``(magnitudes(
    bins, height, width) or None, signed)``; ``translate(side)``: the largest shift (px)."""
    geometry = {"ShearX": (_upto(shear), True), "ShearY": (_upto(shear), True),
                "TranslateX": (lambda bins, h, w: torch.linspace(0.0, translate(w), bins), True),
                "TranslateY": (lambda bins, h, w: torch.linspace(0.0, translate(h), bins), True),
                "Rotate": (_upto(rotate), True)}
    enhancing = {op: (_upto(enhance), True) for op in ("Brightness", "Color", "Contrast",
                                                        "Sharpness")}
    tone = {"Posterize": (lambda bins, h, w: (bits - (torch.arange(bins) / ((bins - 1) / step)))
                          .round().int(), False),
            "Solarize": (lambda bins, h, w: torch.linspace(1.0, 0.0, bins), False),
            "AutoContrast": _NONE, "Equalize": _NONE}
    return {**geometry, **tone, **enhancing} if enhance_last else {**geometry, **enhancing, **tone}


# The policies' tables (torchvision's own are private): AugMix's with all_ops=True, the default
RA_SPACE = {"Identity": _NONE, **_space(0.3, lambda side: 150.0 / 331.0 * side, 30.0, 0.9, 8, 4)}
TA_WIDE_SPACE = {"Identity": _NONE, **_space(0.99, lambda side: 32.0, 135.0, 0.99, 8, 6)}
AA_SPACE = {**_space(0.3, lambda side: 150.0 / 331.0 * side, 30.0, 0.9, 8, 4), "Invert": _NONE}
AUGMIX_SPACE = _space(0.3, lambda side: side / 3.0, 30.0, 0.9, 4, 4, enhance_last=True)


class _Policy:
    """Shared by the policies: magnitude tables cached per image size (torchvision's: per call)."""

    space: dict = {}

    def __init__(self, interpolation: str = "bilinear"):
        if interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation {interpolation!r}: expected one of {INTERPOLATIONS}")
        self.interpolation = interpolation
        self._tables: dict = {}

    def pick_op(self) -> str:
        return list(self.space)[int(torch.randint(len(self.space), ()))]

    def apply(self, image: torch.Tensor, op: str, bins: int, index: int | None = None,
              drawn: int = 0) -> torch.Tensor:
        """``op`` at magnitude bin ``index`` of ``bins`` (None: uniform of the first ``drawn``),
        negated with probability 0.5 where signed; an op without magnitudes draws neither."""
        height, width = image.shape[-2:]
        key = (op, bins, height, width)
        if key not in self._tables:
            values = self.space[op][0](bins, height, width)
            self._tables[key] = None if values is None else values.tolist()
        table, magnitude = self._tables[key], 0.0
        if table is not None:
            magnitude = float(table[int(torch.randint(drawn, ())) if index is None else index])
            if self.space[op][1] and torch.rand(()) <= 0.5:
                magnitude = -magnitude
        return OPS[op](image, magnitude, self.interpolation)


class RandAugment(_Policy):
    """torchvision's ``v2.RandAugment`` (``magnitude`` None: a uniform bin each); with ``(None,
    1)`` and ``TA_WIDE_SPACE``, its ``v2.TrivialAugmentWide``."""

    def __init__(self, interpolation: str = "bilinear", magnitude: int | None = 9,
                 num_ops: int = 2, num_magnitude_bins: int = 31, space: dict = RA_SPACE):
        super().__init__(interpolation)
        self.space = space
        if magnitude is not None and not 0 <= magnitude < num_magnitude_bins:
            raise ValueError(f"RandAugment magnitude {magnitude}: expected "
                             f"0..{num_magnitude_bins - 1}")
        self.magnitude, self.num_ops, self.bins = magnitude, num_ops, num_magnitude_bins

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        for _ in range(self.num_ops):
            image = self.apply(image, self.pick_op(), self.bins, self.magnitude, self.bins)
        return image


class AutoAugment(_Policy):
    """torchvision's ``v2.AutoAugment(policy)``: one of its 25 sub-policies."""

    space = AA_SPACE

    def __init__(self, policy: str = "imagenet", interpolation: str = "bilinear"):
        super().__init__(interpolation)
        self.policies = v2.AutoAugment(v2.AutoAugmentPolicy(policy))._policies

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        policy = self.policies[int(torch.randint(len(self.policies), ()))]
        for op, probability, magnitude_idx in policy:
            if torch.rand(()) <= probability:
                image = self.apply(image, op, 10, magnitude_idx)
        return image


class AugMix(_Policy):
    """torchvision's ``v2.AugMix(severity)`` (``--augmix-severity``, 1..10): width 3, depth 1-3,
    alpha 1, all ops."""

    space = AUGMIX_SPACE

    def __init__(self, interpolation: str = "bilinear", severity: int = 3,
                 mixture_width: int = 3, alpha: float = 1.0):
        super().__init__(interpolation)
        if not 1 <= severity <= 10:
            raise ValueError(f"AugMix severity {severity}: expected 1..10")
        self.severity, self.width, self.alpha = severity, mixture_width, alpha

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        m = torch._sample_dirichlet(torch.tensor([self.alpha, self.alpha]).expand(1, -1))
        weights = torch._sample_dirichlet(
            torch.tensor([self.alpha] * self.width).expand(1, -1)) * m[:, 1].reshape([1, -1])
        mix = m[:, 0].reshape([1, 1, 1, 1]) * image.unsqueeze(0)
        for i in range(self.width):
            aug = image
            for _ in range(int(torch.randint(low=1, high=4, size=(1,)).item())):
                aug = self.apply(aug, self.pick_op(), 10, drawn=self.severity)
            mix.add_(weights[:, i].reshape([1, 1, 1, 1]) * aug.unsqueeze(0))
        return mix[0].to(torch.uint8)


def make_auto_augment(policy: str | None, interpolation: str = "bilinear",
                      ra_magnitude: int = 9, augmix_severity: int = 3
                      ) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The ``--auto-augment`` policy on uint8 ``(3, H, W)`` crops, or None, as torchvision's
    presets choose it. ``ValueError``: an unknown policy, magnitude or severity out of range."""
    makers = {"ta_wide": lambda: RandAugment(interpolation, None, 1, space=TA_WIDE_SPACE),
              "ra": lambda: RandAugment(interpolation, ra_magnitude),
              "augmix": lambda: AugMix(interpolation, augmix_severity)}
    if policy is None:
        return None
    if policy not in POLICIES:
        raise ValueError(f"--auto-augment {policy!r}: expected one of {', '.join(POLICIES)}")
    return makers.get(policy, lambda: AutoAugment(policy, interpolation))()
