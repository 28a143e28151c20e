"""Stopping on the scheduler's signal with nothing lost: SIGUSR1 and SIGTERM.

SLURM sends SIGUSR1 ahead of a time limit where the job asks for it (``#SBATCH
--signal=B:USR1@120``; the batch script forwards it to the step) and SIGTERM at a time limit or
on preemption, SIGKILL ``KillWait`` seconds later (https://slurm.schedmd.com/sbatch.html#OPT_signal,
https://slurm.schedmd.com/preempt.html). The handler (:func:`catch_stop_signals`) only records
the signal; the training loop asks :class:`engine.distributed.StopAgreement` after every
step, whose all-reduce (MAX) of the recorded signal makes every rank stop after the same step;
rank 0 then writes the ``--save-every`` checkpoint of that position, requeues the SLURM job
(``--requeue``) and exits with :data:`STOP_EXIT` (:func:`finish_stop`). This module does not
import torch: ``main.py`` holds the signals before torch loads.
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager

from engine.slurm import requeue


STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
# sysexits.h EX_TEMPFAIL, "temporary failure; the user is invited to retry": stopped on a
# signal after a checkpoint, to be resumed (--resume auto).
STOP_EXIT = 75
_received = 0  # the highest stop signal number received by this process (0: none)
_catching = False  # inside catch_stop_signals: forked children block the stop signals
_fork_hook = False  # _block_in_child registered


class Stopped(Exception):
    """Training stopped on ``signum`` after checkpointing: the checkpoint resumes at epoch
    ``epoch``, batch ``batch`` (None where this process does not know: a launcher's parent).
    ``exit_status``: what this process exits with (:func:`finish_stop` sets it)."""

    def __init__(self, signum: int, epoch: int | None = None, batch: int | None = None):
        super().__init__(f"stopped by {signal_name(signum)}")
        self.signum, self.epoch, self.batch = signum, epoch, batch
        self.exit_status = STOP_EXIT


def finish_stop(stopped: Stopped, is_main: bool, requeue_job: bool, output_dir: str,
                log) -> None:
    """After the stop's checkpoint was written: say so through ``log`` and, on global rank 0
    with ``requeue_job`` (``--requeue``), requeue the SLURM job. Rank 0 exits with
    :data:`STOP_EXIT`, the other ranks with 0: they are done once the checkpoint's collective
    is, and an early non-zero exit would let ``srun --kill-on-bad-exit`` (or torchrun) end
    rank 0 while it writes; so the step's status (srun's: the highest) is rank 0's, 75."""
    where = os.path.join(output_dir, "checkpoint.pth.tar")
    log(f"{stopped}: checkpoint {where} resumes at epoch {stopped.epoch}, batch "
        f"{stopped.batch} (--resume auto); exit status {STOP_EXIT}")
    if is_main and requeue_job:
        requeue(os.environ.get("SLURM_JOB_ID"), log)
    stopped.exit_status = STOP_EXIT if is_main else 0


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _record(signum, _frame) -> None:
    global _received
    _received = max(_received, signum)


def received() -> int:
    """The stop signal this process received (the highest number if several), 0 if none."""
    return _received


def hold_stop_signals() -> None:
    """From now on SIGUSR1 and SIGTERM are recorded instead of ending the process: for
    ``main.py``'s first lines, before torch loads (seconds; minutes from a busy shared
    filesystem), so a scheduler's signal then is kept for the training loop. A run that does
    not train gets them back by :func:`release_held_signals`."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _record)


def _held() -> list[int]:
    return [sig for sig in STOP_SIGNALS if signal.getsignal(sig) is _record]


def release_held_signals() -> None:
    """A run that does not train (``-e``, ``--benchmark-data``): held stop signals end the
    process again, as by default; one received while held is delivered now."""
    held = _held()
    for sig in held:
        signal.signal(sig, signal.SIG_DFL)
    if held and _received:
        os.kill(os.getpid(), _received)


def ignore_stop_signals() -> None:
    """For a process's last lines, once its run is over (trained, stopped after the checkpoint,
    or failed): SIGUSR1 and SIGTERM are ignored from now on. A time limit's warning that comes
    after the last step needs nothing, yet by default it would kill the process while it exits
    (torch's teardown takes seconds; Python's finalisation puts a Python handler back to the
    default action first), so a finished run, or a stopped one that exits 75 to be requeued,
    would end as a step killed by a signal, which SLURM marks FAILED. Ignored handlers stay
    ignored through finalisation (CPython ``_PySignal_Fini``)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _block_in_child() -> None:
    if _catching:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


@contextmanager
def catch_stop_signals():
    """While inside: SIGUSR1 and SIGTERM are recorded (:func:`received`) instead of ending the
    process (one recorded since :func:`hold_stop_signals` is kept); the previous handlers come
    back on leaving. Processes forked meanwhile (DataLoader workers) block both: SLURM signals
    every process of a step, and torch's workers die of SIGTERM, which the training process
    would report as a crash; the training process ends its workers itself (and a worker whose
    parent is gone exits). Outside the main thread (where Python cannot set handlers) nothing
    changes."""
    global _received, _catching, _fork_hook
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if not _held():
        _received = 0
    if not _fork_hook:
        os.register_at_fork(after_in_child=_block_in_child)
        _fork_hook = True
    previous = {sig: signal.signal(sig, _record) for sig in STOP_SIGNALS}
    _catching = True
    try:
        yield
    finally:
        _catching = False
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def stop_signals(training: bool):
    """A training process's signals: :func:`catch_stop_signals` while ``training``; else
    (``-e``, ``--benchmark-data``) SIGUSR1/SIGTERM end the process as by default
    (:func:`release_held_signals`)."""
    if not training:
        release_held_signals()
        yield
        return
    with catch_stop_signals():
        yield


@contextmanager
def forward_stop_signals(pids: list[int]):
    """While inside: SIGUSR1 and SIGTERM are passed on to ``pids`` (a launcher's training
    processes) and recorded here, instead of ending this process."""
    def forward(signum, frame):
        _record(signum, frame)
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    if _held_before(previous) and _received:
        forward(_received, None)  # held while this process started up
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _held_before(previous: dict) -> bool:
    return any(handler is _record for handler in previous.values())
