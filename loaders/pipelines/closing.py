"""Stopping the DataLoader workers a loader started, on every way out of a run.

Why not torch's own shutdown alone: our workers block SIGTERM and SIGUSR1 (forked while the
training process catches SLURM's stop signals, ``engine.distributed.preempt``), so ``Process.terminate``
does nothing to them, and a worker can be busy where torch's shutdown message never reaches it
(waiting for a batch slot the training process will not release, ``workers.slots``; a
streamed shard's read). torch then joins it for 5 s and leaves it running, and at exit
``multiprocessing`` joins it forever: a run that failed with one line never exited. Here a
loader's :meth:`ClosingDataLoader.close` asks every worker of every iterator it made to stop,
waits :data:`STOP_GRACE_S` for all of them together, and kills (SIGKILL) those still alive;
an ``atexit`` hook, run before torch's and ``multiprocessing``'s, does the same for any worker
a loader left behind, so no worker outlives the training process's exit.
"""
from __future__ import annotations

import atexit
import time
import weakref

import torch
from torch.utils.data import DataLoader

# Seconds every worker of an iterator is given to leave its loop on the shutdown message
# before it is killed: an idle worker leaves in milliseconds (it polls its index queue).
STOP_GRACE_S = 2.0
_KILL_JOIN_S = 5.0  # a SIGKILLed process is reaped at once; the bound only guards the join
FEEDER_JOIN_S = 2.0  # a closed queue's feeder thread ends in milliseconds

_iterators: weakref.WeakSet = weakref.WeakSet()  # every multi-process iterator made here
_workers: weakref.WeakSet = weakref.WeakSet()  # and every worker process of those


class ClosingDataLoader(DataLoader):
    """``torch.utils.data.DataLoader`` (same arguments) whose :meth:`close` stops the worker
    processes of every iterator it made: persistent ones kept between passes, and those of a
    pass left part-way. A later ``iter()`` starts new workers."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._made: weakref.WeakSet = weakref.WeakSet()

    def _get_iterator(self):
        if self.num_workers > 0:
            join_exiting_feeders()  # before this iterator forks its workers
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
        """Stop (join, else kill after ``grace_s`` seconds) the workers of every iterator this
        DataLoader made; the persistent iterator is forgotten."""
        made = list(self._made)  # held first: a dropped iterator's __del__ is torch's slow path
        self._iterator = None
        stop_iterators(made, grace_s)


def stop_iterators(iterators: list, grace_s: float = STOP_GRACE_S) -> None:
    """Stop the workers of ``iterators`` (torch ``_MultiProcessingDataLoaderIter`` s): each is
    sent torch's shutdown message, all get ``grace_s`` seconds together to leave, survivors
    are killed with SIGKILL and reaped, then torch's own shutdown closes the queues."""
    live = [it for it in iterators if not getattr(it, "_shutdown", True)]
    for iterator in live:
        iterator._workers_done_event.set()
        for queue in iterator._index_queues:
            try:
                queue.put(None)  # torch's message to leave the worker loop
            except (OSError, ValueError):  # a closed queue: that worker is gone
                pass
    deadline = time.monotonic() + grace_s
    for iterator in live:
        for worker in iterator._workers:
            worker.join(max(0.0, deadline - time.monotonic()))
    for iterator in iterators:
        # Out of torch's SIGCHLD watch before anything is killed: a killed worker is not a
        # crash to report in the middle of closing.
        if getattr(iterator, "_worker_pids_set", False):
            torch._C._remove_worker_pids(id(iterator))  # as torch's _shutdown_workers does
            iterator._worker_pids_set = False
        kill_workers(getattr(iterator, "_workers", ()))
    for iterator in live:
        iterator._shutdown_workers()  # the queues' feeder threads; every join returns at once


def join_exiting_feeders(timeout_s: float = FEEDER_JOIN_S) -> None:
    """Wait (at most ``timeout_s`` seconds in all) for the queue feeder threads of every
    iterator already shut down to end, so that no thread is ending while workers are forked.

    Why: a thread that ends takes CPython's runtime lock (HEAD_LOCK) to remove its thread
    state, and a ``fork()`` at that moment gave the child the lock held: before 3.11.8 and
    3.12 the child deadlocked in ``PyOS_AfterFork_Child`` (CPython gh-112275, fixed by
    GH-112336). torch's ``_shutdown_workers`` closes an iterator's queues without joining
    their feeder threads (``cancel_join_thread``), so they end just as the next pass forks
    its workers: a 2-process test run's validation worker hung so, in a fork that never
    returned, on Python 3.11.7."""
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
    """Every worker a :class:`ClosingDataLoader` started and no loader stopped: stopped as
    :func:`stop_iterators` does, and any left alive killed (``atexit``; also safe to call
    any time from the training thread). Never raises: it runs on the way out."""
    try:
        stop_iterators(list(_iterators))
    except Exception:  # noqa: BLE001 - a half-closed iterator: its workers are killed below
        pass
    kill_workers(list(_workers))
