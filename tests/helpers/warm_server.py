"""The warm process of :mod:`tests.helpers.warm`: ``python -m tests.helpers.warm_server FD
MODULE...`` imports the modules, says ``ready`` on the Unix socket ``FD``, then forks one process
per request on it until the socket ends (the test session is gone). A request is JSON (``argv``
after the interpreter, ``cwd``, ``env``, ``new_session``) with four file descriptors: a
connection, and the child's stdin, stdout and stderr. On the connection the child sends its pid
once its session, streams and directory are in place (or the OSError that stopped it, as Popen's
exec pipe reports a failed ``chdir``), and the server sends its wait status once it has ended.

A forked child becomes the process a cold start would have made before running the script's first
line: the request's session, standard streams (rebuilt as CPython's start-up builds them),
directory, environment, ``sys.argv`` and ``sys.path[0]``; it runs the script or module as
``__main__`` (runpy, as ``python script.py`` and ``python -m`` do) and ends as the interpreter
ends: non-daemon threads joined, atexit handlers run, streams flushed, the exit status of
``SystemExit``, 1 after an uncaught exception's traceback, killed by SIGINT after an uncaught
KeyboardInterrupt. The server is single-threaded (a fork copies only the calling thread) and
never touches CUDA.
"""
from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import json
import os
import runpy
import select
import signal
import socket
import sys
import tempfile
import threading


def serve(control: socket.socket, preload: list[str]) -> None:
    """Import ``preload``, then fork a process for each request on ``control`` until it ends."""
    for name in preload:
        importlib.import_module(name)
    control.sendall(b"ready")
    running: dict[int, socket.socket] = {}  # pid -> the connection its status goes to
    while True:
        if select.select([control], [], [], 0.02 if running else None)[0]:
            request, fds, _, _ = socket.recv_fds(control, 1 << 20, 4)
            if not request:
                return
            conn = socket.socket(fileno=fds[0])
            pid = os.fork()
            if pid == 0:
                try:
                    for other in (control, *running.values()):
                        other.close()
                    _child(json.loads(request), conn, fds[1:])  # exits
                finally:
                    os._exit(255)  # the test is gone before the child could answer it
            for fd in fds[1:]:
                os.close(fd)
            running[pid] = conn
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            # KeyError: not a request's child; OSError: the test no longer waits
            with contextlib.suppress(KeyError, OSError), running.pop(pid) as conn:
                conn.sendall(str(status).encode())


def _child(request: dict, conn: socket.socket, fds: list[int]) -> None:
    """Become the process ``request`` asks for, say so on ``conn``, run it and exit."""
    try:
        if request["new_session"]:
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds) - {0, 1, 2}:
            os.close(fd)
        os.chdir(request["cwd"])
    except OSError as e:
        conn.sendall(json.dumps({"errno": e.errno, "strerror": e.strerror}).encode())
        os._exit(255)
    with conn:
        conn.sendall(json.dumps({"pid": os.getpid()}).encode())
    code = _run(request)
    with contextlib.suppress(BaseException):  # what the interpreter does at exit
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    if code is None:  # as CPython ends on an uncaught KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(128 + signal.SIGINT if code is None else code & 0xFF)


def _run(request: dict) -> int | None:
    """Set the request's environment, streams, ``sys.argv`` and ``sys.path[0]`` and run its
    script or module as ``__main__``: the exit status, None after an uncaught
    KeyboardInterrupt."""
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # found again from this environment's TMPDIR, as at a cold start
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        sys.stdin, sys.stdout, sys.stderr = (
            _stdio(fd, old, unbuffered)
            for fd, old in enumerate((sys.__stdin__, sys.__stdout__, sys.__stderr__)))
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
        argv = request["argv"]
        if argv[0] == "-m":
            sys.argv = argv[1:]  # runpy puts the module's file in sys.argv[0]
            sys.path[0] = os.getcwd()
            sys.modules.pop(argv[1], None)  # as a cold ``python -m`` has: not imported yet
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException as error:  # noqa: BLE001 - printed as the interpreter would
        sys.excepthook(type(error), error, error.__traceback__)
        return None if isinstance(error, KeyboardInterrupt) else 1
    return 0


def _stdio(fd: int, old: io.TextIOWrapper, unbuffered: bool) -> io.TextIOWrapper:
    """A new ``sys.std*`` for ``fd`` (0, 1 or 2) as CPython's start-up makes it
    (Python/pylifecycle.c ``create_stdio``): under PYTHONUNBUFFERED writes go straight through,
    else stderr is line-buffered and stdout is on a terminal; lines end in ``\\n``."""
    write = fd > 0
    raw = io.FileIO(fd, "wb" if write else "rb", closefd=False)
    buffer = (raw if unbuffered else io.BufferedWriter(raw)) if write else io.BufferedReader(raw)
    return io.TextIOWrapper(buffer, old.encoding, old.errors, "\n",
                            line_buffering=write and not unbuffered and (fd == 2 or raw.isatty()),
                            write_through=write and unbuffered)


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])), sys.argv[2:])
