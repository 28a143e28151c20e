"""Iterators run ahead of their consumer, in a thread or (``-j 0``) on the training thread."""
from __future__ import annotations

import contextlib
import queue
import threading
from typing import Iterator

_POLL_S = 0.1
# Seconds close() waits for the thread; one stuck in ``items`` is left behind (a daemon)
JOIN_S = 5.0
_END = object()


class RunAhead:
    """``items`` (a generator not drawing from torch's global RNG) made in a daemon thread up to
    ``depth`` ahead; an exception from it is raised by ``next()`` in its place, then
    ``StopIteration``. :meth:`close` stops the thread and closes ``items`` in it."""

    def __init__(self, items: Iterator, depth: int = 2, name: str = "batch-decode"):
        self._ready: queue.Queue = queue.Queue(depth)
        self._stop = threading.Event()
        self._ended = False
        self._thread = threading.Thread(target=self._work, args=(items,), name=name, daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            with contextlib.suppress(queue.Full):
                self._ready.put(item, timeout=_POLL_S)
                return True
        return False

    def _work(self, items: Iterator) -> None:
        try:
            for item in items:
                if not self._put((item, None)):
                    return
            self._put((_END, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            self._put((_END, exc))
        finally:
            items.close()

    def __iter__(self) -> RunAhead:
        return self

    def __next__(self):
        if self._ended:
            raise StopIteration
        item, exc = self._ready.get()
        self._ended = item is _END
        if exc is not None:
            raise exc
        if self._ended:
            raise StopIteration
        return item

    def close(self, wait_s: float | None = JOIN_S) -> None:
        """Stop the thread, dropping what it made ahead; one still in ``items`` after ``wait_s``
        seconds (None: no limit) is left behind (a daemon never blocks the exit)."""
        self._stop.set()
        self._thread.join(wait_s)


def one_ahead(items: Iterator) -> Iterator:
    """``items``, each yielded once the next one is made (one batch ahead, on this thread)."""
    try:
        ahead = next(items, _END)
        for item in items:
            yield ahead
            ahead = item
        if ahead is not _END:
            yield ahead
    finally:
        items.close()
