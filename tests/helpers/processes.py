"""Ports and process trees, for tests that start servers and kill processes."""
from __future__ import annotations

import os


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """The process ids of ``pid``'s children, theirs, and so on (from /proc)."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            for child in map(int, f.read().split()):
                found += [child, *descendants(child)]
    return found


def cmdline(pid: int) -> bytes:
    """``pid``'s command line, NUL-separated as /proc has it."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()
