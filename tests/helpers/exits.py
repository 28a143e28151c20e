"""A ``main.py`` run watched from outside, for tests of how runs end: started in its
own process group, its output read line by line with times, every process of its group seen
while it ran, and what it leaves behind (processes of the group, ``/dev/shm`` segments); and
an HTTP file server in a process of its own, to stop and start again."""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

from tests.helpers import warm
from tests.helpers.paths import REPO
from engine.distributed.processes import free_port

SHM = "/dev/shm"


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes whose process group is ``pgid`` (from /proc)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            found.append(int(name))
    return found


class WatchedRun:
    """``python main.py *args`` from the repository root in a new session (its pid is its
    process group's id), stdout and stderr merged into :attr:`lines` as ``(seconds since
    start, text)``; :attr:`seen` collects every process of its group while it runs."""

    def __init__(self, *args: str, env: dict | None = None):
        self.shm_before = set(os.listdir(SHM)) if os.path.isdir(SHM) else set()
        self.started = time.monotonic()
        env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}  # lines as made
        self.proc = warm.Popen([sys.executable, "main.py", *args], cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True,
                               preexec_fn=warm.default_sigint)
        self.lines: list[tuple[float, str]] = []
        self.seen: set[int] = {self.proc.pid}
        self._new: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._watch, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            item = (time.monotonic() - self.started, line.rstrip("\n"))
            self.lines.append(item)
            self._new.put(item)
        self._new.put(None)

    def _watch(self) -> None:
        while self.proc.poll() is None:
            self.seen.update(group_members(self.proc.pid))
            time.sleep(0.1)

    def wait_for(self, predicate, timeout: float) -> tuple[float, str] | None:
        """The next output line for which ``predicate(text)`` holds, or None if the output
        ends or ``timeout`` seconds pass first."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                item = self._new.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if item is None:
                return None
            if predicate(item[1]):
                return item

    def finish(self, timeout: float) -> int | None:
        """The exit status once the run ended within ``timeout`` seconds, else None (the whole
        group is then killed, so that nothing outlives the test)."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to every process of the run's group (as SLURM signals a step)."""
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        self.signal_group(signal.SIGKILL)
        self.proc.wait(30)

    def left_behind(self, wait: float = 2.0) -> list[int]:
        """Processes of the run's group still alive ``wait`` seconds after it ended at most
        (orphans are reaped by init meanwhile)."""
        deadline = time.monotonic() + wait
        while (members := group_members(self.proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return members

    def shm_left(self) -> list[str]:
        """``/dev/shm`` entries made since the run started that carry the pid of one of its
        processes (torch names its segments ``torch_<pid>_...``)."""
        if not os.path.isdir(SHM):
            return []
        new = set(os.listdir(SHM)) - self.shm_before
        pids = {str(pid) for pid in self.seen}
        return sorted(n for n in new if pids & set(n.replace(".", "_").split("_")))

    def text(self) -> str:
        return "\n".join(text for _, text in self.lines)

    def errors(self) -> list[str]:
        return [text for _, text in self.lines if text.startswith("main.py: error:")]


class FileServer:
    """``python -m http.server`` for ``directory`` on 127.0.0.1 in a process of its own (not in
    any run's group): :meth:`stop` ends it (connections refused), :meth:`start` serves again
    on the same port."""

    def __init__(self, directory: str):
        self.directory, self.port = directory, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "http.server", str(self.port), "--bind", "127.0.0.1",
             "--directory", self.directory], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        import socket

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"http.server on port {self.port} did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None
