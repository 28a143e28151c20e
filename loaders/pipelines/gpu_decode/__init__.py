"""The batch-decode pipeline (``--decode-device cuda`` or ``cpu-nvimgcodec``): ``loader``
(:class:`BatchDecodeLoader`) and ``windows`` (its workers' part)."""
from __future__ import annotations

from .loader import BatchDecodeLoader, build_loaders, make_decoder, refusal

__all__ = ["BatchDecodeLoader", "build_loaders", "make_decoder", "refusal"]
