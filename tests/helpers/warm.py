"""Processes that start warm: ``python main.py ...`` (any ``script.py``, or ``-m module``) run in
a new process forked from one that has already imported torch, torchvision and the project, so a
test's run skips the 3-7 s of CPU that importing them costs on the 2-core development machine
(issue 47: about 1,000 of the suite's 2,354 test-seconds were those imports).

The fork is a real process: its own pid, stdin/stdout/stderr (the caller's pipes or files, passed
over a Unix socket), working directory, environment, ``sys.argv``, exit status or the signal that
killed it, a new session when asked; signals reach it and it starts its own workers and ranks.
What it does not redo is what happens before ``main.py``'s first line: the interpreter's start and
the imports. So a command runs cold (a plain :class:`subprocess.Popen`) whenever that could show:

- its environment differs from the warm process's in a variable read at start-up or import
  (``PYTHON*`` but ``PYTHONUNBUFFERED``, ``OMP_*``/``MKL_*``/``KMP_*``/``GOMP_*``, ``LD_*``,
  ``MALLOC_*``, ``TORCH*``/``PYTORCH*``, ``IMAGENET_FAST_FULL_DECODE``);
- it is not ``sys.executable`` with a ``.py`` script or ``-m`` (``-c`` code stays cold: tests use
  it for a fresh interpreter), or uses ``shell``, ``pass_fds``, another
  user, ``executable``, or a ``preexec_fn`` other than :func:`default_sigint`;
- a GPU is present (``/dev/nvidiactl``): a process forked after torch's import is safe for CUDA,
  but the GPU tests are the proof the project lacks, so they start as users start them;
- ``IMAGENET_TESTS_COLD=1`` (every command cold: the suite as it ran before this helper).

The forking server is the pattern of multiprocessing's forkserver (``set_forkserver_preload``)
and Android's zygote; this one keeps subprocess.Popen's interface so tests change one name.
"""
from __future__ import annotations

import atexit
import builtins
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
# what code given this module in place of ``subprocess`` also uses (benchmarks.runner, the GPU
# check's runner: their tests hand them this module, so their main.py processes start warm)
from subprocess import (DEVNULL, PIPE, STDOUT, CalledProcessError, CompletedProcess,
                        TimeoutExpired)

from tests.helpers.paths import REPO
from tests.helpers.processes import descendants

__all__ = ["Popen", "run", "default_sigint", "DEVNULL", "PIPE", "STDOUT", "CalledProcessError",
           "CompletedProcess", "TimeoutExpired"]

PRELOAD = ("main", "formats.cli", "formats.lmdb", "formats.shards")
_STARTUP_PREFIXES = ("PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "LD_", "MALLOC_", "TORCH",
                     "PYTORCH", "IMAGENET_FAST_FULL_DECODE")
_HANDLED = ("PYTHONUNBUFFERED",)


def default_sigint() -> None:
    """A ``preexec_fn`` that gives the child SIGINT's default disposition, so that Python raises
    KeyboardInterrupt on Ctrl-C even when the test runs as a shell's background job (which
    ignores SIGINT). Warm children get the same."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _startup_env(env: dict) -> dict:
    return {k: v for k, v in env.items()
            if k.startswith(_STARTUP_PREFIXES) and k not in _HANDLED}


class _Zygote:
    """The warm process (:mod:`tests.helpers.warm_server`) with :data:`PRELOAD` imported."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="warm-")
        self.path = os.path.join(self.dir, "socket")
        self.env = dict(os.environ)
        self.startup = _startup_env(self.env)
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.warm_server",
                                      self.path, *PRELOAD],
                                     cwd=REPO, env=self.env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, preexec_fn=default_sigint)
        ready = self.proc.stdout.readline()
        if ready.strip() != b"ready":
            self.proc.kill()
            raise RuntimeError(f"warm process did not start: {ready!r}")
        atexit.register(self.close)

    def accepts(self, env: dict) -> bool:
        return self.proc.poll() is None and _startup_env(env) == self.startup

    def start(self, request: dict, fds: list[int]) -> tuple[socket.socket, int, bytes]:
        """Fork ``request``'s process: its connection (the exit status comes on it), its pid,
        and what already came after the pid's line (the status of a process that ended)."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        payload = json.dumps(request).encode()
        socket.send_fds(conn, [struct.pack("!I", len(payload)) + payload], fds)
        line, rest = _read_line(conn)
        reply = json.loads(line)
        if reply["error"]:  # as subprocess raises a failed chdir: FileNotFoundError etc.
            conn.close()
            name, number, text = reply["error"].split(":", 2)
            raise getattr(builtins, name, OSError)(int(number), text, request["cwd"])
        return conn, reply["pid"], rest

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # the server ends at EOF on its stdin
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)  # the socket's folder


_zygote: _Zygote | None = None
_zygote_lock = threading.Lock()
_disabled = os.environ.get("IMAGENET_TESTS_COLD") == "1" or os.path.exists("/dev/nvidiactl")


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


def _read_line(conn: socket.socket) -> tuple[bytes, bytes]:
    """The first line from ``conn``, and what came after it."""
    data = b""
    while b"\n" not in data:
        part = conn.recv(4096)
        if not part:
            raise ConnectionError("warm process closed the connection")
        data += part
    line, rest = data.split(b"\n", 1)
    return line, rest


def _what_runs(args) -> tuple[str, str] | None:
    """``("script", path)`` or ``("module", name)`` for ``[sys.executable, X, ...]``, or None."""
    if isinstance(args, (str, bytes)) or len(args) < 2 or args[0] != sys.executable:
        return None
    first = str(args[1])
    if first == "-m" and len(args) >= 3:
        return "module", str(args[2])
    if first.endswith(".py") and not first.startswith("-"):
        return "script", first
    return None


class Popen(subprocess.Popen):
    """:class:`subprocess.Popen` that starts ``[sys.executable, script-or--m, ...]`` warm when it
    may (the module's docstring says when not) and cold otherwise; ``warm`` says which. Waiting,
    polling, ``communicate``, signals and timeouts behave as Popen's: the exit status comes from
    the warm process, which reaps its children, over the connection that started it."""

    def __init__(self, args, **kwargs):
        self._conn = None
        what = _what_runs(args)
        env = kwargs.get("env")
        preexec = kwargs.get("preexec_fn")
        plain = (what is not None and not kwargs.get("shell") and not kwargs.get("pass_fds")
                 and kwargs.get("executable") is None and preexec in (None, default_sigint)
                 and all(kwargs.get(k) is None for k in ("user", "group", "extra_groups")))
        zygote = _get_zygote() if plain else None
        self.warm = zygote is not None and zygote.accepts(os.environ if env is None else env)
        if self.warm:
            self._zygote, self._what = zygote, what
            self._new_session = bool(kwargs.get("start_new_session"))
            kwargs.pop("preexec_fn", None)
        super().__init__(args, **kwargs)

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                       startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite,
                       errread, errwrite, *rest):
        if not self.warm:
            return super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds, cwd,
                                          env, startupinfo, creationflags, shell, p2cread,
                                          p2cwrite, c2pread, c2pwrite, errread, errwrite, *rest)
        env = dict(os.environ if env is None else
                   {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()})
        request = {"kind": self._what[0], "target": self._what[1],
                   "argv": [os.fsdecode(a) for a in args[1:]],
                   "cwd": os.path.abspath(os.fsdecode(cwd) if cwd is not None else os.getcwd()),
                   "env": env, "new_session": self._new_session}
        fds = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1,
               errwrite if errwrite != -1 else 2]
        try:
            self._conn, self.pid, self._status_buffer = self._zygote.start(request, fds)
            self._child_created = True
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _warm_status(self, block: bool) -> int | None:
        """The child's wait status once the warm process reported it, else None."""
        if self._conn is None:
            return None
        self._conn.setblocking(block)
        while not self._status_buffer.endswith(b"\n"):
            try:
                part = self._conn.recv(4096)
            except BlockingIOError:
                return None
            if not part:  # the warm process is gone: report the child as killed
                self._conn.close()
                self._conn = None
                return signal.SIGKILL
            self._status_buffer += part
        self._conn.close()
        self._conn = None
        return json.loads(self._status_buffer)["status"]

    def _internal_poll(self, _deadstate=None, **_kwargs):
        if not self.warm:
            return super()._internal_poll(_deadstate, **_kwargs)
        if self.returncode is None:
            status = self._warm_status(block=False)
            if status is not None:
                self._handle_exitstatus(status)
        return self.returncode

    def _try_wait(self, wait_flags):
        if not self.warm:
            return super()._try_wait(wait_flags)
        status = self._warm_status(block=not wait_flags & os.WNOHANG)
        return (0, 0) if status is None else (self.pid, status)


def run(args, *, input=None, capture_output=False, timeout=None, check=False, **kwargs):
    """:func:`subprocess.run` through :class:`Popen` (warm when it may); past ``timeout`` the
    process and all its descendants are killed (SIGKILL) before TimeoutExpired is raised."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with Popen(args, **kwargs) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            # the whole tree: a training process left alive would hold the output pipes open
            # and the communicate below would wait for ever (subprocess.run kills only proc)
            for pid in [*descendants(proc.pid), proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            exc.stdout, exc.stderr = proc.communicate()
            raise
        except BaseException:
            proc.kill()
            raise
        code = proc.poll()
    if check and code:
        raise subprocess.CalledProcessError(code, proc.args, output=out, stderr=err)
    return subprocess.CompletedProcess(proc.args, code, out, err)
