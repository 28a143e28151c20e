"""The check's commands, run from the repository root, output in ``logs/NAME.out|.err``. A
record: ``name``, ``command``, ``status`` (passed / failed / timed out / skipped: a check
slower than its limit proves nothing either way), ``reason`` unless passed, ``seconds`` (wall),
``cpu_seconds`` (of the process tree), ``returncode``, unless passed the output's tails."""
import json
import os
import pathlib
import resource
import shlex
import signal
import subprocess
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRACE = 10.0  # s a command started within the time budget may run past it


class InputError(Exception):
    """Bad input to the check, the bundle or the dry run: one line, exit status 2."""


class Runner:
    """Runs commands in ``cwd``, each with a timeout, within ``budget`` s (None: no end; one
    started near its end may run :data:`GRACE` s). Dry, one OpenMP thread unless set (on a few
    shared cores threads wait at every barrier: ResNet-18 at 32 px trains at 1.1 images/s with
    2, 10 with 1)."""

    def __init__(self, out: str, budget: float | None = None, dry_run: bool = False,
                 cwd: str = REPO):
        self.logs, self.budget, self.cwd = os.path.join(out, "logs"), budget, cwd
        os.makedirs(self.logs, exist_ok=True)
        self.start = time.monotonic()
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if dry_run:
            self.env.setdefault("OMP_NUM_THREADS", "1")

    def left(self) -> float:
        """Seconds left in the time budget, by the wall clock."""
        return float("inf") if self.budget is None else self.budget + self.start - time.monotonic()

    def add_path(self, folder: str) -> None:
        """Put ``folder`` first on the commands' ``PYTHONPATH``."""
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [folder, self.env.get("PYTHONPATH")]))

    def run(self, name: str, cmd: list[str], timeout: float, env: dict | None = None) -> dict:
        """``cmd``'s record, run (``env`` added) for at most ``timeout`` s and the budget."""
        record = {"name": name, "command": shlex.join(cmd)}
        if self.left() <= 0:
            return {**record, "status": "skipped", "reason": "time budget"}
        limit = min(timeout, max(self.left(), GRACE))
        start, used = time.monotonic(), cpu_seconds(resource.RUSAGE_CHILDREN)
        with open(self.log(name, "out"), "w") as out, open(self.log(name, "err"), "w") as err:
            # its own session: main.py's loader workers and spawned ranks end with it
            proc = subprocess.Popen(cmd, cwd=self.cwd, env={**self.env, **(env or {})},
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    start_new_session=True)
            try:
                code = proc.wait(limit)
            except subprocess.TimeoutExpired:
                code = None
            finally:  # the timeout, or Ctrl-C in this process
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        record.update(seconds=round(time.monotonic() - start, 2), returncode=code,
                      cpu_seconds=round(cpu_seconds(resource.RUSAGE_CHILDREN) - used, 2),
                      status="passed" if code == 0 else "failed")
        if code is None and limit < timeout:
            record.update(status="skipped", reason=f"time budget: stopped after {limit:.0f} s")
        elif code is None:
            record.update(status="timed out", reason=f"still running after its {limit:.0f} s "
                          "limit (slow, not failed)")
        elif code:
            record["reason"] = f"exit status {code}"
        return self.attach_tails(record) if code != 0 else record

    def log(self, name: str, stream: str) -> str:
        return os.path.join(self.logs, f"{name}.{stream}")

    def text(self, name: str, stream: str = "out") -> str:
        path = pathlib.Path(self.log(name, stream))
        return path.read_text(errors="replace") if path.is_file() else ""

    def attach_tails(self, record: dict, chars: int = 3000) -> dict:
        record["stdout_tail"] = self.text(record["name"], "out")[-chars:]
        record["stderr_tail"] = self.text(record["name"], "err")[-chars:]
        return record


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    """User + system CPU seconds of this process, or of its finished children (whose delta
    around one command is its work, whatever else shares the cores)."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def fail(record: dict, reason: str) -> dict:
    return {**record, "status": "failed", "reason": reason}


def skipped(name: str, reason: str, **fields) -> dict:
    return {"name": name, **fields, "status": "skipped", "reason": reason}


def crashed(name: str, exc: BaseException) -> dict:
    """Row ``name`` failed by this script's own exception, with its traceback's tail."""
    return {"name": name, "status": "failed", "reason": f"{type(exc).__name__}: {exc}",
            "stderr_tail": traceback.format_exc()[-3000:]}


def json_lines(text: str) -> list[dict]:
    """The lines of ``text`` that are JSON objects, parsed (the others skipped)."""
    found = []
    for line in text.splitlines():
        try:
            found.append(json.loads(line) if line.strip().startswith("{") else None)
        except ValueError:
            continue
    return [x for x in found if isinstance(x, dict)]


def last_json(text: str) -> dict | None:
    return (json_lines(text) or [None])[-1]
