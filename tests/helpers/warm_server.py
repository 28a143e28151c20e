"""The warm process of :mod:`tests.helpers.warm`: ``python -m tests.helpers.warm_server SOCKET
MODULE...`` imports the modules, then forks one process per request on the Unix socket (a command
line, directory, environment and three file descriptors) and reports each one's exit status.

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

import importlib
import json
import os
import select
import signal
import socket
import struct
import sys
import tempfile
import threading


def serve(path: str, preload: list[str]) -> None:
    """Import ``preload``, say ``ready`` on stdout, then fork one process per connection to the
    Unix socket at ``path`` until stdin reaches its end (the test session is gone)."""
    for name in preload:
        importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    os.write(1, b"ready\n")
    running: dict[int, socket.socket] = {}
    while True:
        ready, _, _ = select.select([listener, 0], [], [], 0.02)
        if 0 in ready and not os.read(0, 1):
            break  # the test session is gone
        if listener in ready:
            conn, _ = listener.accept()
            request, fds = _receive(conn)
            started_r, started_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other in running.values():
                    other.close()
                conn.close()
                os.close(started_r)
                _child(request, fds, started_w)  # never returns
            os.close(started_w)
            for fd in fds:
                os.close(fd)
            error = _read_all(started_r).decode(errors="replace")  # as Popen's exec pipe
            conn.sendall(json.dumps({"pid": pid, "error": error}).encode() + b"\n")
            running[pid] = conn
        _reap(running)


def _read_all(fd: int) -> bytes:
    data = b""
    while part := os.read(fd, 4096):
        data += part
    os.close(fd)
    return data


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    (size,) = struct.unpack("!I", data[:4])
    data = data[4:]
    while len(data) < size:
        data += conn.recv(size - len(data))
    return json.loads(data), list(fds)


def _reap(running: dict) -> None:
    while running:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = running.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(json.dumps({"status": status}).encode() + b"\n")
            except OSError:
                pass  # the test no longer waits
            conn.close()


def _stdio(fd: int, write: bool, unbuffered: bool, old, stderr: bool = False):
    """A new ``sys.std*`` for ``fd`` as CPython's start-up makes it (Python/pylifecycle.c
    ``create_stdio``): under PYTHONUNBUFFERED writes go straight through, else stderr is
    line-buffered and stdout is on a terminal."""
    import io

    raw = io.FileIO(fd, "wb" if write else "rb", closefd=False)
    if write:
        buffer = raw if unbuffered else io.BufferedWriter(raw)
    else:
        buffer = io.BufferedReader(raw)
    line = write and not unbuffered and (stderr or raw.isatty())
    return io.TextIOWrapper(buffer, encoding=old.encoding, errors=old.errors,
                            line_buffering=line, write_through=write and unbuffered)


def _child(request: dict, fds: list[int], started: int) -> None:
    """Become the process ``request`` asks for, tell the server through ``started`` (empty: the
    session, file descriptors and directory are in place; else the error, as Popen's exec pipe
    reports a failed ``chdir``), run it, and exit as the interpreter would."""
    import atexit as child_atexit
    import runpy
    import traceback

    try:
        if request["new_session"]:
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds) - {0, 1, 2}:
            os.close(fd)
        os.chdir(request["cwd"])
    except OSError as e:
        os.write(started, f"{type(e).__name__}:{e.errno}:{e.strerror}".encode())
        os._exit(255)
    os.close(started)
    code = 0
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # found again from this environment's TMPDIR, as at a cold start
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        sys.stdin = sys.__stdin__ = _stdio(0, False, unbuffered, sys.__stdin__)
        sys.stdout = sys.__stdout__ = _stdio(1, True, unbuffered, sys.__stdout__)
        sys.stderr = sys.__stderr__ = _stdio(2, True, unbuffered, sys.__stderr__, stderr=True)
        kind, target = request["kind"], request["target"]
        if kind == "script":
            sys.argv = request["argv"]
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")
        else:
            sys.argv = [target, *request["argv"][2:]]
            sys.path[0] = os.getcwd()
            sys.modules.pop(target, None)  # run as a cold ``python -m`` would: not imported yet
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:  # noqa: BLE001 - printed as the interpreter would
        sys.excepthook(*sys.exc_info())
        code = 1
    try:  # what the interpreter does at exit: join threads, atexit, flush
        threading._shutdown()
        child_atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    except BaseException:  # noqa: BLE001
        pass
    if code == -signal.SIGINT:  # as CPython ends on an uncaught KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


def _exit_code(value) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
