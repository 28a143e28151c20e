"""A real one-node SLURM cluster on the loopback interface, for tests/engine/test_slurm.py.

:class:`SlurmCluster` starts ``munged``, ``slurmctld`` and ``slurmd`` (Debian's ``munge``,
``slurmctld``, ``slurmd`` and ``slurm-client`` packages) in the foreground as children of this
process, with a generated munge key and ``slurm.conf`` in a temporary directory: free
unprivileged ports on 127.0.0.1, one node with this machine's cores, no cgroups. Clients get
the cluster through :attr:`SlurmCluster.env` (``SLURM_CONF``). :meth:`SlurmCluster.stop`
cancels the jobs and ends every process the cluster started by its process id: the daemons
(their ``Popen``) and whatever they or its jobs left (found by a marker variable in their
environment), also when a test failed. ``python -m tests.helpers.slurm_cluster`` starts one, prints
``sinfo`` and stops it.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time

from engine.distributed.processes import free_port

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("srun", "sbatch", "scontrol", "scancel", "squeue", "sinfo")
PACKAGES = "slurmctld slurmd slurm-client munge"
MARKER = "IMAGENET_FAST_TEST_SLURM"  # in the environment of every process the cluster starts


def missing_commands() -> list[str]:
    """The SLURM and munge commands not on ``PATH`` (daemons are looked up in sbin too)."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [cmd for cmd in DAEMONS + CLIENTS if shutil.which(cmd, path=path) is None]


def _die_with_parent() -> None:
    """In a child before exec: SIGTERM when the process that started it dies (a killed pytest
    must not leave daemons behind)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _node_line(hostname: str) -> str:
    """``NodeName=...`` as ``slurmd -C`` detects this machine, on 127.0.0.1, with room left in
    memory for the daemons."""
    detected = subprocess.run([_sbin("slurmd"), "-C"], capture_output=True, text=True,
                              check=True).stdout.split("\n")[0].split()
    fields = dict(item.split("=", 1) for item in detected)
    fields["NodeName"] = hostname
    fields["RealMemory"] = str(max(1024, int(fields.get("RealMemory", 4096)) // 2))
    return " ".join(f"{k}={v}" for k, v in fields.items()) + " NodeAddr=127.0.0.1 State=UNKNOWN"


def _sbin(name: str) -> str:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") or name


class SlurmCluster:
    """One node (this machine, ``hostname``), partition ``debug``, under ``root`` (a fresh
    directory). ``kill_wait``: SLURM's ``KillWait``, seconds between SIGTERM and SIGKILL at a
    time limit or cancel. Raises ``RuntimeError`` (with the daemons' logs' tails) if the node
    does not come up within ``timeout`` seconds."""

    def __init__(self, root: str, kill_wait: int = 15):
        self.root, self.kill_wait = str(root), kill_wait
        self.hostname = socket.gethostname()
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = os.path.join(self.root, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf, **{MARKER: self.root})
        for key in [k for k in self.env if k.startswith(("SLURM_", "SBATCH_", "SRUN_"))]:
            if key != "SLURM_CONF":  # a test run inside a SLURM job must not leak its job
                del self.env[key]

    def __enter__(self) -> "SlurmCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def start(self, timeout: float = 60.0) -> None:
        """Write the configuration, start the daemons, wait until the node is idle."""
        for sub in ("state", "spool", "log"):
            os.makedirs(self.path(sub), exist_ok=True)
        self._start_munge()
        self._write_conf()
        self._spawn("slurmctld", [_sbin("slurmctld"), "-D", "-i", "-f", self.conf])
        self._spawn("slurmd", [_sbin("slurmd"), "-D", "-N", self.hostname, "-f", self.conf])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False).stdout.strip()
            if state == "idle":
                return
            dead = [name for name, proc in self.procs.items() if proc.poll() is not None]
            if dead:
                break
            time.sleep(0.5)
        raise RuntimeError(f"SLURM test cluster did not come up (node state {state!r})\n"
                           + self.logs())

    def _start_munge(self) -> None:
        key = self.path("munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o600)
        self.munge_socket = self.path("munge.socket")
        self._spawn("munged", [
            _sbin("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
            f"--key-file={key}", f"--pid-file={self.path('munged.pid')}",
            f"--log-file={self.path('log', 'munged.log')}",
            f"--seed-file={self.path('munged.seed')}"])
        deadline = time.monotonic() + 20
        while not os.path.exists(self.munge_socket):
            if time.monotonic() > deadline or self.procs["munged"].poll() is not None:
                raise RuntimeError("munged did not start\n" + self.logs())
            time.sleep(0.1)

    def _write_conf(self) -> None:
        ctld_port, slurmd_port = free_port(), free_port()
        settings = {
            "ClusterName": f"ifast{os.getpid()}",
            "SlurmctldHost": f"{self.hostname}(127.0.0.1)",
            "SlurmctldPort": ctld_port, "SlurmdPort": slurmd_port,
            "SlurmUser": "root", "SlurmdUser": "root",
            "AuthType": "auth/munge", "CredType": "cred/munge",
            "AuthInfo": f"socket={self.munge_socket}",
            "StateSaveLocation": self.path("state"), "SlurmdSpoolDir": self.path("spool"),
            "SlurmctldPidFile": self.path("slurmctld.pid"),
            "SlurmdPidFile": self.path("slurmd.pid"),
            "SlurmctldLogFile": self.path("log", "slurmctld.log"),
            "SlurmdLogFile": self.path("log", "slurmd.log"),
            # debug2: slurmctld logs its periodic time-limit checks (time_limit_checks)
            "SlurmctldDebug": "debug2", "SlurmdDebug": "info",
            "ProctrackType": "proctrack/linuxproc", "TaskPlugin": "task/none",
            "JobAcctGatherType": "jobacct_gather/none",
            "AccountingStorageType": "accounting_storage/none", "JobCompType": "jobcomp/none",
            "SelectType": "select/cons_tres", "SelectTypeParameters": "CR_Core",
            "SchedulerType": "sched/backfill", "MpiDefault": "none", "SwitchType": "switch/none",
            "SlurmdParameters": "config_overrides", "ReturnToService": 2,
            "KillWait": self.kill_wait, "MinJobAge": 300, "JobRequeue": 1,
            # job ids (and so the rendezvous ports main.py derives from them) differ per cluster
            "FirstJobId": 1000 + (os.getpid() * 7919 + int(time.time())) % 9000,
        }
        lines = [f"{k}={v}" for k, v in settings.items()]
        lines += [_node_line(self.hostname),
                  f"PartitionName=debug Nodes={self.hostname} Default=YES MaxTime=INFINITE "
                  "State=UP"]
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.path("log", f"{name}.stdout"), "wb")
        self.procs[name] = subprocess.Popen(cmd, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            preexec_fn=_die_with_parent)
        log.close()

    def run(self, cmd: list[str], check: bool = True, timeout: float = 60,
            **kwargs) -> subprocess.CompletedProcess:
        """Run a client command (``sinfo``, ``sbatch``...) against this cluster."""
        result = subprocess.run(cmd, env=kwargs.pop("env", self.env), capture_output=True,
                                text=True, timeout=timeout, **kwargs)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: exit {result.returncode}: "
                               f"{result.stderr.strip()}")
        return result

    def logs(self, lines: int = 20) -> str:
        """The last ``lines`` of each daemon's log, for a failure's message."""
        text = []
        for name in sorted(os.listdir(self.path("log"))) if os.path.isdir(self.path("log")) else []:
            with open(self.path("log", name), errors="replace") as f:
                tail = f.read().splitlines()[-lines:]
            text.append(f"--- {name}\n" + "\n".join(tail))
        return "\n".join(text)

    def time_limit_checks(self) -> list[float]:
        """When slurmctld checked time limits (and sent ``--signal`` warnings), in
        ``time.time()`` seconds: it does so every 30 seconds, and a test that needs a warning
        soon after its job starts submits it just before the next check."""
        import datetime

        with open(self.path("log", "slurmctld.log")) as f:
            stamps = [line[1:24] for line in f if "Testing job time limits" in line]
        return [datetime.datetime.fromisoformat(stamp).timestamp() for stamp in stamps]

    def stop(self) -> None:
        """Cancel every job, then end the daemons and every process left with the cluster's
        marker, each by its process id: SIGTERM, then SIGKILL after a few seconds."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run(["scancel", "--full", "--user", str(os.getuid())], check=False)
            self._wait_no_jobs(10)
        for name in reversed(DAEMONS):
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        for pid in self.marked_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _wait_no_jobs(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            queued = self.run(["squeue", "-h", "-o", "%i"], check=False)
            if queued.returncode != 0 or not queued.stdout.strip():
                return
            time.sleep(0.5)

    def marked_pids(self) -> list[int]:
        """Processes (other than this one) whose environment holds this cluster's marker:
        slurmstepd and the jobs' processes, which outlive slurmd."""
        marker = f"{MARKER}={self.root}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if marker in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
        return found


if __name__ == "__main__":
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="slurm-") as tmp, SlurmCluster(tmp) as cluster:
        print(cluster.run(["sinfo"]).stdout, end="")
        args = sys.argv[1:] or ["srun", "-n", "2", "hostname"]
        print(cluster.run(args, check=False).stdout, end="")


def module_cluster(tmp_path_factory):
    """A test module's cluster fixture's body: a started :class:`SlurmCluster` whose jobs run
    one torch thread each, unbuffered, with ``$PYTHON`` this interpreter (skips the module
    where SLURM is missing)."""
    import sys

    import pytest

    missing = missing_commands()
    if missing:
        pytest.skip(f"SLURM is not installed ({', '.join(missing)} missing): `make test-slurm` "
                    f"installs Debian's {PACKAGES} as root")
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as started:
        started.env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHON=sys.executable)
        yield started


def read(path: str) -> str:
    return open(path).read() if os.path.exists(path) else ""


def job_fields(cluster, job: str) -> dict:
    """``scontrol show job`` as a dict (JobState, Reason, Restarts, ExitCode...)."""
    shown = cluster.run(["scontrol", "show", "job", "-o", job]).stdout.split()
    return dict(item.split("=", 1) for item in shown if "=" in item)


def wait_until_done(cluster, job: str, log: str, timeout: float = 480) -> dict:
    """Wait for ``job`` to end, restarting each requeued incarnation at once: SLURM holds a
    requeued batch job about two minutes (Reason=BeginTime) before it may start again."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fields = job_fields(cluster, job)
        if fields["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return fields
        if fields["JobState"] == "PENDING" and fields.get("Reason") == "BeginTime":
            cluster.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
        time.sleep(0.5)
    raise AssertionError(f"job {job} still {fields['JobState']} after {timeout} s:\n"
                         + read(log)[-3000:])
