"""A distributed ``main.py`` job started the way torchrun starts one (one process per rank with
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``;
``main.py`` then meets at ``env://``), each rank forked warm (:mod:`tests.helpers.warm`): for tests
of what a world size does (orders, positions, shards, resume), not of how a launcher starts its
processes. Those (``--multiprocessing-distributed``'s forkserver, torchrun itself, two nodes)
stay in tests/engine/test_distributed.py; a launch there costs a cold interpreter per process
or forkserver, 3-7 s of CPU each on the 2-core development machine."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time

from tests.helpers import warm
from tests.helpers.paths import REPO
from engine.distributed.processes import free_port
from tests.helpers.runs import main_cmd


def rank_env(rank: int, world: int, port: int, env: dict | None = None) -> dict:
    """``env`` (default: this process's) with torchrun's variables for ``rank`` of ``world``
    processes on this node, meeting at ``127.0.0.1:port``."""
    return {**(os.environ if env is None else env), "RANK": str(rank), "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


class Ranks:
    """``main.py ARGS`` in ``world`` processes (one plain process when ``world`` is 1), each in
    its own session, its stdout and stderr in files (a pipe nobody reads could stall a rank that
    the others wait for in a collective). A context manager: leaving it kills what still runs."""

    def __init__(self, args: list[str], world: int, env: dict | None = None):
        self.dir = tempfile.mkdtemp(prefix="ranks-")
        port = free_port()
        self.procs = []
        for rank in range(world):
            with open(self._path(rank, "out"), "w") as out, \
                    open(self._path(rank, "err"), "w") as err:
                self.procs.append(warm.Popen(
                    main_cmd(*args), cwd=REPO, stdout=out, stderr=err,
                    start_new_session=True,
                    env=rank_env(rank, world, port, env) if world > 1 else env))

    def _path(self, rank: int, stream: str) -> str:
        return os.path.join(self.dir, f"rank{rank}.{stream}")

    def output(self, rank: int = 0, stream: str = "out") -> str:
        """What rank ``rank`` wrote to ``stream`` (``out`` or ``err``) so far."""
        with open(self._path(rank, stream)) as f:
            return f.read()

    def wait_for_line(self, prefix: str | tuple[str, ...], timeout: float = 300) -> bool:
        """Wait until rank 0 printed a line starting with ``prefix`` (one of them, a tuple)
        (True), or a rank ended or ``timeout`` passed first (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and all(p.poll() is None for p in self.procs):
            if any(line.startswith(prefix) for line in self.output().splitlines()):
                return True
            time.sleep(0.02)
        return False

    def kill(self) -> None:
        """SIGKILL every rank's session (the rank and its DataLoader workers)."""
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float = 300) -> list[int]:
        """Every rank's exit status; a rank that fails ends the others (they would wait for it
        in a collective until ``--dist-timeout``); past ``timeout`` all are killed."""
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in self.procs):
            if any(p.poll() for p in self.procs) or time.monotonic() > deadline:
                self.kill()
            time.sleep(0.05)
        return [p.returncode for p in self.procs]

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *_exc) -> None:
        self.kill()
        for proc in self.procs:
            proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def run_ranks(args: list[str], world: int, env: dict | None = None,
              timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``main.py ARGS`` on ``world`` ranks (:class:`Ranks`); every rank must exit 0. The
    result holds rank 0's stdout and stderr."""
    with Ranks(args, world, env) as ranks:
        codes = ranks.wait(timeout)
        out, errors = ranks.output(), [ranks.output(r, "err") for r in range(world)]
    assert codes == [0] * world, (codes, [e[-2000:] for e in errors])
    return subprocess.CompletedProcess(main_cmd(*args), 0, out, errors[0])
