"""Random draws as functions of their keys (seed, epoch, rank, batch, ...) through NumPy's
``SeedSequence``: a resumed epoch, a rebuilt pipeline or another ``-j`` draws alike."""
from __future__ import annotations

import numpy as np

# SeedSequence takes non-negative integers: a negative --seed enters as its 64-bit two's complement
_WORD = 0xFFFFFFFFFFFFFFFF


def seed_sequence(seed: int, *keys: int) -> np.random.SeedSequence:
    """``SeedSequence([seed mod 2**64, *keys])``; ``keys`` are non-negative integers."""
    return np.random.SeedSequence([seed & _WORD, *keys])


def keyed_rng(seed: int, *keys: int) -> np.random.Generator:
    """``np.random.default_rng([seed mod 2**64, *keys])`` (PCG64)."""
    return np.random.default_rng(seed_sequence(seed, *keys))
