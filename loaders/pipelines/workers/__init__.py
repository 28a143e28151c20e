"""The DataLoader-workers pipeline (``--decode-device cpu``): :class:`DeviceLoader` (``loader``),
its shared-memory batch slots (``slots``) and the side-stream copy to a GPU (``cuda_feed``)."""
from __future__ import annotations

from .loader import DeviceLoader, build_loaders
