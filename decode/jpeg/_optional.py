"""A native library the loaders use where it is present, loaded once per process on first use."""
from __future__ import annotations

import os
from typing import Any, Callable


class OptionalLibrary:
    """``load() -> (library, None) | (None, why)``, called once per process on first use;
    ``IMAGENET_FAST_FULL_DECODE=1`` keeps it off. ``reason``: why it is off, else None."""

    def __init__(self, load: Callable[[], tuple[Any, str | None]]):
        self._load = load
        self._library = None
        self._loaded = False
        self.reason: str | None = None

    def get(self):
        """The library, or ``None`` (``reason`` says why)."""
        if not self._loaded:
            self._loaded = True
            if os.environ.get("IMAGENET_FAST_FULL_DECODE") == "1":
                self._library, self.reason = None, "IMAGENET_FAST_FULL_DECODE=1"
            else:
                self._library, self.reason = self._load()
        return self._library

    def available(self) -> bool:
        """True if the library is present and turned on in this process."""
        return self.get() is not None

    def set_enabled(self, enabled: bool) -> None:
        """Load it again (if present) or turn it off in this process."""
        self._loaded, self._library = False, None
        if enabled:
            self.get()
        else:
            self._loaded, self.reason = True, "turned off in this process"
