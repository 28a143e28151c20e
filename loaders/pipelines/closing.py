"""Stopping a loader's workers on every way out of a run: ours block SIGTERM and SIGUSR1, and one
waiting for a slot or a stream misses torch's shutdown message, so each is asked, given
:data:`STOP_GRACE_S`, then SIGKILLed (also ``atexit``, or ``multiprocessing`` joins it forever)."""
from __future__ import annotations

import atexit
import contextlib
import gc
import time
import weakref

import torch
from torch.utils.data import DataLoader

# Seconds an iterator's workers get to leave on the shutdown message (an idle one: ms)
STOP_GRACE_S = 2.0
_KILL_JOIN_S = 5.0  # a SIGKILLed process is reaped at once; the bound only guards the join
FEEDER_JOIN_S = 2.0  # a closed queue's feeder thread ends in milliseconds

_iterators: weakref.WeakSet = weakref.WeakSet()  # every multi-process iterator made here
_workers: weakref.WeakSet = weakref.WeakSet()  # and every worker process of those


class ClosingDataLoader(DataLoader):
    """``DataLoader`` whose :meth:`close` stops the workers of every iterator it made."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._made: weakref.WeakSet = weakref.WeakSet()

    def _get_iterator(self):
        if self.num_workers > 0:
            join_exiting_feeders()  # before this iterator forks its workers
            # Garbage in a cycle is freed here, where its threads live: freed in a forked
            # worker, a DALI pipeline's shutdown waits for threads the worker lacks and the
            # worker hangs. Every pass (~0.1-0.2 s of CPU), not only once DALI is imported: what
            # else frees threads on collection is not known, and a hung worker stalls the run.
            gc.collect()
        iterator = super()._get_iterator()
        workers = getattr(iterator, "_workers", None)
        if workers:
            self._made.add(iterator)
            _iterators.add(iterator)
            _workers.update(workers)
            # Registered (again) after torch's own atexit hook, so it runs before it.
            atexit.unregister(stop_all_workers)
            atexit.register(stop_all_workers)
        return iterator

    def close(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop the workers of every iterator made here (:func:`stop_iterators`)."""
        made = list(self._made)  # held first: a dropped iterator's __del__ is torch's slow path
        self._iterator = None
        stop_iterators(made, grace_s)


def stop_iterators(iterators: list, grace_s: float = STOP_GRACE_S) -> None:
    """torch's shutdown message to ``iterators``' workers, ``grace_s`` s in all, then SIGKILL."""
    live = [it for it in iterators if not getattr(it, "_shutdown", True)]
    for iterator in live:
        iterator._workers_done_event.set()
        for queue in iterator._index_queues:
            with contextlib.suppress(OSError, ValueError):  # a closed queue: that worker is gone
                queue.put(None)  # torch's message to leave the worker loop
    deadline = time.monotonic() + grace_s
    for iterator in live:
        for worker in iterator._workers:
            worker.join(max(0.0, deadline - time.monotonic()))
    for iterator in iterators:
        # out of torch's SIGCHLD watch first: a worker killed here is no crash to report
        if getattr(iterator, "_worker_pids_set", False):
            torch._C._remove_worker_pids(id(iterator))  # as torch's _shutdown_workers does
            iterator._worker_pids_set = False
        kill_workers(getattr(iterator, "_workers", ()))
    for iterator in live:
        iterator._shutdown_workers()  # the queues' feeder threads; every join returns at once


def join_exiting_feeders(timeout_s: float = FEEDER_JOIN_S) -> None:
    """Wait (``timeout_s`` in all) for the queue feeder threads torch leaves ending: one ending
    as workers fork deadlocks the child before Python 3.11.8/3.12 (CPython gh-112275)."""
    deadline = time.monotonic() + timeout_s
    for iterator in list(_iterators):
        if not getattr(iterator, "_shutdown", False):
            continue  # its queues are open: their feeder threads wait, they do not end
        queues = [*getattr(iterator, "_index_queues", ()),
                  getattr(iterator, "_worker_result_queue", None)]
        for queue in queues:
            thread = getattr(queue, "_thread", None)  # multiprocessing.Queue's feeder
            if thread is not None and thread.is_alive():
                thread.join(max(0.0, deadline - time.monotonic()))


def kill_workers(workers) -> None:
    """SIGKILL each process of ``workers`` still alive and reap it."""
    alive = [w for w in workers if w.is_alive()]
    for worker in alive:
        worker.kill()
    for worker in alive:
        worker.join(_KILL_JOIN_S)


def stop_all_workers() -> None:
    """Stop, then kill, every worker left of a ClosingDataLoader (``atexit``). Never raises."""
    with contextlib.suppress(Exception):  # a half-closed iterator: its workers are killed below
        stop_iterators(list(_iterators))
    kill_workers(list(_workers))
