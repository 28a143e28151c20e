"""The batch-decode pipeline (``--decode-device cuda`` or ``cpu-nvimgcodec``): ``loader``
(:class:`BatchDecodeLoader`, decoding each batch in the training process), ``windows`` (what
its DataLoader workers do: read the bytes, draw the windows) and ``ahead`` (decoding ahead of
the training thread)."""
from __future__ import annotations

from .loader import BatchDecodeLoader, build_loaders, make_decoder, refusal

__all__ = ["BatchDecodeLoader", "build_loaders", "make_decoder", "refusal"]
