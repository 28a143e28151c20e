"""Iterators run ahead, so the training process decodes batch ``k + 1`` during step ``k``: in a
thread (:func:`run_ahead`) or, with ``-j 0``, on the training thread (:func:`one_ahead`)."""
from __future__ import annotations

import queue
import threading
from typing import Iterator

_END = object()
_POLL_S = 0.1
# Seconds leaving early waits for the thread; one stuck in ``items`` is left behind (a daemon)
_JOIN_S = 5.0


class _Failed:
    def __init__(self, exc: BaseException):
        self.exc = exc


def run_ahead(items: Iterator, depth: int = 2) -> Iterator:
    """The items of ``items`` (a generator), computed in a daemon thread up to ``depth`` ahead, in
    order; an exception from ``items`` is raised here, in its place. Closing this iterator stops
    the thread and closes ``items`` in it, or after :data:`_JOIN_S` leaves it stuck in ``items``
    (a daemon never blocks the exit). ``items`` must not draw from torch's global RNG."""
    ready: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(_END)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            put(_Failed(exc))
        finally:
            items.close()

    thread = threading.Thread(target=work, name="batch-decode", daemon=True)
    thread.start()
    try:
        while True:
            item = ready.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.exc
            yield item
    finally:
        stop.set()
        thread.join(_JOIN_S)


def one_ahead(items: Iterator) -> Iterator:
    """``items``, each yielded once the next one is made (one batch ahead, on this thread)."""
    ahead = None
    try:
        for item in items:
            if ahead is not None:
                yield ahead
            ahead = item
        if ahead is not None:
            yield ahead
    finally:
        items.close()
