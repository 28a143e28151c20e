"""Stopping on the scheduler's signal with nothing lost. SLURM sends SIGUSR1 ahead of a time
limit if asked (``#SBATCH --signal=B:USR1@120``) and SIGTERM at a time limit or on preemption,
SIGKILL ``KillWait`` later (https://slurm.schedmd.com/sbatch.html#OPT_signal). The handler only
records the signal; :class:`engine.distributed.processes.StopAgreement` stops every rank after the same
step, then rank 0 checkpoints, requeues and exits with :data:`STOP_EXIT`. No torch import here:
``main.py`` holds the signals before torch loads."""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager

from engine.distributed.slurm import requeue


STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
STOP_EXIT = 75  # sysexits.h EX_TEMPFAIL ("the user is invited to retry"): checkpointed
_received = 0  # the highest stop signal number received by this process (0: none)
_catching = False  # inside catch_stop_signals: forked children block the stop signals
_fork_hook = False  # _block_in_child registered


class Stopped(Exception):
    """Training stopped on ``signum`` after a checkpoint that resumes at ``epoch``, ``batch``
    (None in a launcher's parent); ``exit_status`` is set by :func:`finish_stop`."""

    def __init__(self, signum: int, epoch: int | None = None, batch: int | None = None):
        super().__init__(f"stopped by {signal_name(signum)}")
        self.signum, self.epoch, self.batch = signum, epoch, batch
        self.exit_status = STOP_EXIT


def finish_stop(stopped: Stopped, is_main: bool, requeue_job: bool, output_dir: str,
                log) -> None:
    """After the stop's checkpoint: log it, requeue on rank 0 with ``requeue_job``. Rank 0 exits
    with :data:`STOP_EXIT` (srun's step status), the others 0: an early non-zero exit would let
    ``srun --kill-on-bad-exit`` (or torchrun) end rank 0 while it writes."""
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
    """Record SIGUSR1 and SIGTERM instead of ending the process, from ``main.py``'s first
    lines: torch's import takes seconds (minutes on a busy shared filesystem), and a signal
    meanwhile is kept for the training loop."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _record)


def _held() -> list[int]:
    return [sig for sig in STOP_SIGNALS if signal.getsignal(sig) is _record]


def release_held_signals() -> None:
    """Let held stop signals end the process again, as by default; deliver one already held."""
    held = _held()
    for sig in held:
        signal.signal(sig, signal.SIG_DFL)
    if held and _received:
        os.kill(os.getpid(), _received)


def ignore_stop_signals() -> None:
    """Ignore SIGUSR1 and SIGTERM once the run is over: a late signal would kill the exiting
    process (torch's teardown takes seconds), which SLURM marks FAILED. Ignored handlers stay
    ignored through finalisation (CPython ``_PySignal_Fini``)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _block_in_child() -> None:
    if _catching:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


@contextmanager
def catch_stop_signals():
    """While inside, record SIGUSR1 and SIGTERM (one held before is kept). Processes forked
    meanwhile (DataLoader workers) block both: SLURM signals a step's every process, and a
    worker's death would be reported as a crash. A no-op outside the main thread."""
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
    """:func:`catch_stop_signals` while ``training``, else :func:`release_held_signals`."""
    if not training:
        release_held_signals()
        yield
        return
    with catch_stop_signals():
        yield


@contextmanager
def forward_stop_signals(pids: list[int]):
    """While inside, pass SIGUSR1 and SIGTERM on to ``pids`` and record them here."""
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
