"""Processes that start warm: ``python main.py ...`` (any ``script.py``, or ``-m module``) run in
a new process forked from one that has already imported torch, torchvision and the project
(:data:`PRELOAD`), so a test's run skips the seconds of CPU those imports cost.

The fork is a real process: its own pid, stdin/stdout/stderr (the caller's pipes or files, passed
over a Unix socket), working directory, environment, ``sys.argv``, exit status or the signal that
killed it, a new session when asked; signals reach it and it starts its own workers and ranks.
What it does not redo is what happens before the script's first line: the interpreter's start and
the imports. So a command runs cold (a plain :class:`subprocess.Popen`) whenever that could show:

- its environment differs from the warm process's in a variable read at start-up or import
  (``PYTHON*`` but ``PYTHONUNBUFFERED``, ``OMP_*``/``MKL_*``/``KMP_*``/``GOMP_*``, ``LD_*``,
  ``MALLOC_*``, ``TORCH*``/``PYTORCH*``, ``IMAGENET_FAST_FULL_DECODE``);
- it is not ``sys.executable`` with a ``.py`` script or ``-m`` (``-c`` code stays cold: tests use
  it for a fresh interpreter), or uses ``shell``, ``pass_fds``, another user, ``executable``, or a
  ``preexec_fn`` other than :func:`default_sigint`;
- a GPU is present (``/dev/nvidiactl``): a process forked after torch's import is safe for CUDA,
  but the GPU tests are the proof the project lacks, so they start as users start them;
- ``IMAGENET_TESTS_COLD=1`` (every command cold).

The warm process (:mod:`tests.helpers.warm_server`, the pattern of multiprocessing's forkserver
and Android's zygote) is reached through a socket pair, not a socket file, so it leaves nothing
on disk, and it ends when this process closes its end or exits. This module keeps
:mod:`subprocess`'s interface, so code can be given it in place of ``subprocess``.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
# what code given this module in place of ``subprocess`` also uses (benchmarks.runner, the GPU
# check's runner)
from subprocess import (DEVNULL, PIPE, STDOUT, CalledProcessError, CompletedProcess,
                        TimeoutExpired)

from tests.helpers.paths import REPO
from tests.helpers.processes import descendants

__all__ = ["Popen", "run", "default_sigint", "DEVNULL", "PIPE", "STDOUT", "CalledProcessError",
           "CompletedProcess", "TimeoutExpired"]

PRELOAD = ("main", "formats.cli", "formats.lmdb", "formats.shards")
_STARTUP_PREFIXES = ("PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "LD_", "MALLOC_", "TORCH",
                     "PYTORCH", "IMAGENET_FAST_FULL_DECODE")
_HANDLED = ("PYTHONUNBUFFERED",)  # the warm child sets its streams up from it
_disabled = os.environ.get("IMAGENET_TESTS_COLD") == "1" or os.path.exists("/dev/nvidiactl")


def default_sigint() -> None:
    """A ``preexec_fn`` that gives the child SIGINT's default disposition, so that Python raises
    KeyboardInterrupt on Ctrl-C even when the test runs as a shell's background job (which
    ignores SIGINT). Warm children get the same."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _startup_env(env) -> dict:
    return {k: v for k, v in env.items()
            if k.startswith(_STARTUP_PREFIXES) and k not in _HANDLED}


def _pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


class _Zygote:
    """The warm process with :data:`PRELOAD` imported, and the socket that asks it for forks."""

    def __init__(self):
        self.startup = _startup_env(os.environ)
        self.control, theirs = _pair()
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.helpers.warm_server", str(theirs.fileno()),
                 *PRELOAD], cwd=REPO, stdin=DEVNULL, stdout=DEVNULL,
                pass_fds=[theirs.fileno()], preexec_fn=default_sigint)
        if self.control.recv(16) != b"ready":
            self.close()
            raise RuntimeError("warm process did not start")
        atexit.register(self.close)

    def accepts(self, env) -> bool:
        return self.proc.poll() is None and _startup_env(env) == self.startup

    def start(self, request: dict, fds: list[int]) -> tuple[socket.socket, int]:
        """Fork ``request``'s process with ``fds`` as its stdin, stdout and stderr: the
        connection its exit status will come on, and its pid."""
        conn, theirs = _pair()
        with theirs:
            socket.send_fds(self.control, [json.dumps(request).encode()],
                            [theirs.fileno(), *fds])
        reply = json.loads(conn.recv(4096) or "{}")
        if "pid" in reply:
            return conn, reply["pid"]
        conn.close()
        if "errno" in reply:  # as Popen raises a failed chdir (OSError picks FileNotFoundError...)
            raise OSError(reply["errno"], reply["strerror"], request["cwd"])
        raise ConnectionError("the warm process did not start the command")

    def close(self) -> None:
        self.control.close()  # the server ends at the end of its socket
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


_zygote: _Zygote | None = None
_zygote_lock = threading.Lock()


def _get_zygote() -> _Zygote | None:
    global _zygote, _disabled
    with _zygote_lock:
        if _zygote is None and not _disabled:
            try:
                _zygote = _Zygote()
            except (OSError, RuntimeError) as e:
                print(f"tests.helpers.warm: starting cold ({e})", file=sys.stderr)
                _disabled = True
        return _zygote


def _may_fork(args, kwargs: dict) -> bool:
    """Whether Popen(args, **kwargs) is ``[sys.executable, script.py or -m module, ...]`` with
    nothing that changes how the process is made."""
    if isinstance(args, (str, bytes)) or len(args) < 2 or args[0] != sys.executable:
        return False
    first = os.fsdecode(args[1])
    runs = (first == "-m" and len(args) >= 3) or (first.endswith(".py")
                                                  and not first.startswith("-"))
    return (runs and not kwargs.get("shell") and not kwargs.get("pass_fds")
            and kwargs.get("preexec_fn") in (None, default_sigint)
            and all(kwargs.get(k) is None for k in ("executable", "user", "group",
                                                    "extra_groups")))


class Popen(subprocess.Popen):
    """:class:`subprocess.Popen` that starts a command warm when it may (the module's docstring
    says when not) and cold otherwise; ``warm`` says which. Waiting, polling, ``communicate``,
    signals and timeouts behave as Popen's: the warm process reaps its children and sends each
    one's wait status on the connection that started it."""

    def __init__(self, args, **kwargs):
        zygote = _get_zygote() if _may_fork(args, kwargs) else None
        env = kwargs.get("env")
        self.warm = zygote is not None and zygote.accepts(os.environ if env is None else env)
        if self.warm:
            self._zygote = zygote
            self._new_session = bool(kwargs.get("start_new_session"))
            kwargs.pop("preexec_fn", None)
        super().__init__(args, **kwargs)

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, *rest):
        if not self.warm:
            return super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds, cwd,
                                          env, *rest)
        pipes = rest[3:9]  # after startupinfo, creationflags, shell
        p2cread, _, _, c2pwrite, _, errwrite = pipes
        request = {"argv": [os.fsdecode(a) for a in args[1:]],
                   "cwd": os.path.abspath(os.fsdecode("." if cwd is None else cwd)),
                   "env": dict(os.environ) if env is None else
                   {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()},
                   "new_session": self._new_session}
        fds = [std if fd == -1 else fd for std, fd in enumerate((p2cread, c2pwrite, errwrite))]
        try:
            self._conn, self.pid = self._zygote.start(request, fds)
            self._child_created = True
        finally:
            self._close_pipe_fds(*pipes)

    def _try_wait(self, wait_flags):
        """``(pid, wait status)`` from the warm process, ``(0, 0)`` while the child runs under
        WNOHANG; killed (SIGKILL) if the warm process is gone."""
        if not self.warm:
            return super()._try_wait(wait_flags)
        try:
            reply = self._conn.recv(64, socket.MSG_DONTWAIT if wait_flags & os.WNOHANG else 0)
        except BlockingIOError:
            return 0, 0
        self._conn.close()
        return self.pid, (int(reply) if reply else signal.SIGKILL)

    def _internal_poll(self, _deadstate=None, **kwargs):
        if not self.warm:
            return super()._internal_poll(_deadstate, **kwargs)
        try:  # a wait that does not wait: Popen's own lock and returncode checks, no waitpid
            return self._wait(timeout=0)
        except subprocess.TimeoutExpired:
            return None


def run(args, *, input=None, capture_output=False, timeout=None, check=False, **kwargs):
    """:func:`subprocess.run` through :class:`Popen` (warm when it may); past ``timeout`` the
    process and all its descendants are killed (SIGKILL) before TimeoutExpired is raised."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = PIPE
    if input is not None:
        kwargs["stdin"] = PIPE
    with Popen(args, **kwargs) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except TimeoutExpired as exc:
            # the whole tree: a training process left alive would hold the output pipes open
            # and the communicate below would wait for ever (subprocess.run kills only proc)
            for pid in [*descendants(proc.pid), proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            exc.stdout, exc.stderr = proc.communicate()
            raise
        except BaseException:
            proc.kill()
            raise
        code = proc.poll()
    if check and code:
        raise CalledProcessError(code, proc.args, output=out, stderr=err)
    return CompletedProcess(proc.args, code, out, err)
