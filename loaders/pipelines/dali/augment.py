"""``--auto-augment`` inside DALI pipelines: DALI's ``nvidia.dali.auto_aug`` operators selected
per sample (``auto_aug.core.select``) after the GPU graph's resize and flip, every draw made on
the host from (seed, epoch, rank, batch) (:meth:`DaliAugment.host_draws`: DALI's random state
would not survive a resumed epoch or a rebuilt pipeline). The suites carry torchvision's op
lists, magnitude ranges, bins and black fill (``loaders.transforms.auto_augment``), not DALI's
defaults; the pixels are DALI's (equalize as OpenCV's, contrast about the unfloored mean, warps
about pixel corners). CPU-only, torch finishes the crops."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ...draws import keyed_rng
from ...errors import DataError
from ...transforms.auto_augment import AA_SPACE, RA_SPACE, TA_WIDE_SPACE, make_auto_augment

_TAG = 0x41554741  # "AUGA": these draws' stream, apart from the crops' of the same batch


@dataclass(frozen=True)
class DaliAugment:
    """One run's ``--auto-augment`` ``policy`` (``auto_augment.POLICIES``) for DALI, with the
    warps' ``interpolation``, RandAugment's bin and AugMix's severity (the CPU-only finish's)."""

    policy: str
    interpolation: str = "bilinear"
    ra_magnitude: int = 9
    augmix_severity: int = 3

    def check(self, cuda: bool) -> None:
        """Raise :class:`DataError` where the GPU graph's DALI operators cannot run the policy."""
        if not cuda:
            return
        if self.policy == "augmix":
            raise DataError("--auto-augment augmix: DALI has no AugMix; train it without "
                            "--dali (DataLoader workers), or on DALI without a GPU")
        if self.interpolation == "bicubic":
            raise DataError("--interpolation bicubic with --auto-augment on DALI: its warps "
                            "resample linear or nearest only; leave out --dali")

    @cached_property
    def torch_policy(self):
        """The CPU-only finish's policy (torchvision's pixels)."""
        return make_auto_augment(self.policy, self.interpolation, self.ra_magnitude,
                                 self.augmix_severity)

    @property
    def names(self) -> list[str]:
        """The suite's torchvision op ids, index = the op number of :meth:`host_draws`."""
        return ["Identity"] + [name for name in self._space if name != "Identity"]

    @property
    def bins(self) -> int:
        return 10 if self.policy in ("imagenet", "cifar10", "svhn") else 31

    def host_draws(self, seed: int, epoch: int, rank: int, batch: int, count: int) -> list:
        """Batch ``batch``'s draws: per sample an int32 ``(slots, 3)`` array of (op number in
        :attr:`names`, magnitude bin, negate 0/1). ``ta_wide``: one slot, op, bin and sign
        uniform; ``ra``: two slots at bin ``ra_magnitude``; AutoAugment: one of torchvision's 25
        sub-policies, each op kept with its probability (else Identity). Signs as torchvision."""
        rng = keyed_rng(seed, epoch, rank, batch, _TAG)
        space, names = self._space, self.names
        ops = list(space)
        out = []
        for _ in range(count):
            slots = []
            if self.policy in ("ta_wide", "ra"):
                for _ in range(1 if self.policy == "ta_wide" else 2):
                    name = ops[int(rng.integers(len(ops)))]
                    slots.append((name, int(rng.integers(self.bins))
                                  if self.policy == "ta_wide" else self.ra_magnitude))
            else:
                policies = self.torch_policy.policies  # torchvision's 25 sub-policies
                for name, probability, bin_ in policies[int(rng.integers(len(policies)))]:
                    kept = rng.random() <= probability
                    slots.append((name, bin_ or 0) if kept else ("Identity", 0))
            out.append(np.array([[names.index(name), bin_,
                                  int(space.get(name, (None, False))[1] and rng.random() <= 0.5)]
                                 for name, bin_ in slots], dtype=np.int32))
        return out

    @property
    def _space(self) -> dict:
        return {"ta_wide": TA_WIDE_SPACE, "ra": RA_SPACE}.get(self.policy, AA_SPACE)

    def graph(self, images, draws):
        """DALI graph: uint8 HWC ``images`` (one square size) through the ops drawn in ``draws``
        (:meth:`host_draws`' node); needs ``enable_conditionals=True``."""
        from nvidia.dali import types
        from nvidia.dali.auto_aug.core import select, signed_bin

        suite = self._suite()
        interp = types.INTERP_NN if self.interpolation == "nearest" else types.INTERP_LINEAR
        extra = {} if self.policy == "ta_wide" else {"shape": images.shape()}
        for k in range(1 if self.policy == "ta_wide" else 2):
            images = select(suite, draws[k, 0], data=images,
                            magnitude_bin=signed_bin(draws[k, 1], draws[k, 2]),
                            num_magnitude_bins=self.bins, fill_value=0, interp_type=interp,
                            **extra)
        return images

    def _suite(self) -> list:
        """DALI augmentations in :attr:`names` order with torchvision's magnitude ranges."""
        from nvidia.dali.auto_aug import augmentations as a

        wide = self.policy == "ta_wide"
        shear, rotate, enhance = (0.99, 135, 0.99) if wide else (0.3, 30, 0.9)
        if wide:  # whole pixels, 0..32
            shifts, most = (a.translate_x_no_shape, a.translate_y_no_shape), 32
        else:  # 150/331 of the side
            shifts, most = (a.translate_x, a.translate_y), 150 / 331
        translate = [shift.augmentation((0, most), True) for shift in shifts]
        ops = {
            "Identity": a.identity, "ShearX": a.shear_x.augmentation((0, shear), True),
            "ShearY": a.shear_y.augmentation((0, shear), True),
            "TranslateX": translate[0], "TranslateY": translate[1],
            "Rotate": a.rotate.augmentation((0, rotate), True),
            "Brightness": a.brightness.augmentation((0, enhance), True, a.shift_enhance_range),
            "Color": a.color.augmentation((0, enhance), True, a.shift_enhance_range),
            "Contrast": a.contrast.augmentation((0, enhance), True, a.shift_enhance_range),
            "Sharpness": a.sharpness.augmentation((0, enhance), True, a.sharpness_kernel),
            "Posterize": a.posterize.augmentation((8, 2 if wide else 4), False,
                                                  a.poster_mask_uint8),
            "Solarize": a.solarize.augmentation((255, 0)), "AutoContrast": a.auto_contrast,
            "Equalize": a.equalize, "Invert": a.invert,
        }
        return [ops[name] for name in self.names]
