"""The batch-decode pipeline (``--decode-device cuda`` or ``cpu-nvimgcodec``): ``loader``
(:class:`BatchDecodeLoader`), ``windows`` (its workers' part) and ``ahead`` (decoding ahead)."""
from __future__ import annotations

from .loader import BatchDecodeLoader, build_loaders, make_decoder, refusal

__all__ = ["BatchDecodeLoader", "build_loaders", "make_decoder", "refusal"]
