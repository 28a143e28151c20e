"""Process trees, for tests that kill processes and count the training ones."""
from __future__ import annotations

import os


def descendants(pid: int) -> list[int]:
    """The process ids of ``pid``'s children, theirs, and so on (from /proc)."""
    found = []
    for child in children(pid):
        found += [child, *descendants(child)]
    return found


def cmdline(pid: int) -> bytes:
    """``pid``'s command line, NUL-separated as /proc has it."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def children(pid: int) -> list[int]:
    """``pid``'s child processes (from /proc)."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += map(int, f.read().split())
    return found


def training_processes(pid: int) -> list[int]:
    """The training processes of ``main.py --multiprocessing-distributed`` running as ``pid``,
    in the order they were started: the children of its multiprocessing forkserver (its child
    that runs ``multiprocessing.forkserver``; the training processes are its forks)."""
    servers = [p for p in children(pid) if b"multiprocessing.forkserver" in cmdline(p)]
    return sorted(rank for server in servers for rank in children(server))


def value_in_another_process(setup: str, expression: str):
    """``expression`` evaluated after ``setup`` in a new Python process started cold from the
    repository (its own string-hash seed, unlike this one's, its own addresses and RNG states):
    the JSON of it, read back. For determinism across processes, which one process comparing
    a value with itself cannot show."""
    import json
    import subprocess
    import sys

    from tests.helpers.paths import REPO

    seed = "1" if os.environ.get("PYTHONHASHSEED") != "1" else "2"
    code = f"import json\n{setup}\nprint(json.dumps({expression}))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=120, env={**os.environ, "PYTHONHASHSEED": seed})
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
