"""The DataLoader-workers pipeline (``--decode-device cpu``)."""
from __future__ import annotations

from .loader import DeviceLoader, build_loaders
