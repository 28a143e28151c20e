"""SLURM: a training process's place in an ``srun`` step, and requeueing the job. Each task
reads its place from SLURM's variables (https://slurm.schedmd.com/srun.html), as torchvision's
``init_distributed_mode`` and timm do; the rendezvous is the step's first host at a port
derived from the job id. torchrun's variables, where set, win."""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from engine import ConfigError

PORT_BASE, PORT_SPAN = 15000, 16384  # 15000-31383: below Linux's ephemeral ports (32768-)


@dataclass(frozen=True)
class SlurmStep:
    """This task's place in an ``srun`` step, ranks as torchrun would give them."""

    rank: int
    world_size: int
    local_rank: int
    tasks_on_node: int
    master_addr: str
    master_port: int
    job_id: str
    step_id: str

    @property
    def url(self) -> str:
        return f"tcp://{self.master_addr}:{self.master_port}"

    def describe(self) -> str:
        """The launcher, as the run's first log line names it."""
        return (f"srun (SLURM job {self.job_id} step {self.step_id}: {self.world_size} tasks, "
                f"{self.tasks_on_node} on this node; rendezvous {self.master_addr}:"
                f"{self.master_port})")


def launcher(environ=os.environ) -> str:
    """``torchrun``, ``srun`` (in a step), ``sbatch`` (a batch script: one process) or ``none``."""
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return "torchrun"
    if "SLURM_STEP_ID" in environ and "SLURM_PROCID" in environ and "SLURM_NTASKS" in environ:
        return "srun"
    return "sbatch" if "SLURM_JOB_ID" in environ else "none"


def slurm_step(environ=os.environ) -> SlurmStep | None:
    """This task's :class:`SlurmStep` under ``srun``, else None; ``MASTER_ADDR``/``MASTER_PORT``
    win. Raises :class:`ConfigError` for variables that are not numbers or a bad node list."""
    if launcher(environ) != "srun":
        return None
    try:
        rank, world = int(environ["SLURM_PROCID"]), int(environ["SLURM_NTASKS"])
        local_rank = int(environ.get("SLURM_LOCALID", 0))
        tasks = tasks_on_node(environ.get("SLURM_STEP_TASKS_PER_NODE")
                              or environ.get("SLURM_TASKS_PER_NODE", "1"),
                              int(environ.get("SLURM_NODEID", 0)))
        port = int(environ.get("MASTER_PORT") or rendezvous_port(environ.get("SLURM_JOB_ID", "0"),
                                                                 environ["SLURM_STEP_ID"]))
    except ValueError as exc:
        raise ConfigError(f"SLURM variables are not what srun sets ({exc})") from None
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", "")
    addr = environ.get("MASTER_ADDR") or first_host(nodelist)
    return SlurmStep(rank, world, local_rank, tasks, addr, port,
                     environ.get("SLURM_JOB_ID", "?"), environ["SLURM_STEP_ID"])


def rendezvous_port(job_id: str, step_id: str) -> int:
    """The step's rendezvous port, the same on every task and apart for two steps of one job:
    ``15000 + (job id + step id) mod 16384``. Raises ``ValueError`` for a non-numeric job id."""
    step = int(step_id) if step_id.isdigit() else 0  # "batch"/"extern" steps run no srun tasks
    return PORT_BASE + (int(job_id) + step) % PORT_SPAN


def tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """Node ``node_id``'s task count from ``SLURM_STEP_TASKS_PER_NODE`` (``"4(x2),3"``). Raises
    ``ValueError`` for another syntax or a node beyond the list."""
    counts = []
    for item in tasks_per_node.split(","):
        count, _, repeat = item.partition("(x")
        counts += [int(count)] * (int(repeat.rstrip(")")) if repeat else 1)
    if not 0 <= node_id < len(counts):
        raise ValueError(f"SLURM_NODEID {node_id} beyond SLURM_TASKS_PER_NODE {tasks_per_node}")
    return counts[node_id]


def first_host(nodelist: str) -> str:
    """The first host of a SLURM host list (``gpu[01-04,07],cpu1`` -> ``gpu01``), by scontrol or
    python-hostlist. Raises :class:`ConfigError` if neither can, or the list is empty."""
    if not nodelist:
        raise ConfigError("srun set no SLURM_STEP_NODELIST/SLURM_JOB_NODELIST: set MASTER_ADDR")
    if not any(c in nodelist for c in "[],"):
        return nodelist  # one plain host name: nothing to expand
    problem = "scontrol (slurm-client) is not on PATH"
    if shutil.which("scontrol"):
        result = subprocess.run(["scontrol", "show", "hostnames", nodelist],
                                capture_output=True, text=True, timeout=60)
        if result.returncode == 0 and result.stdout.split():
            return result.stdout.split()[0]
        problem = (result.stderr.strip().splitlines() or ["no host"])[-1]
    try:
        import hostlist  # python-hostlist
    except ImportError:
        raise ConfigError(f"node list {nodelist}: scontrol show hostnames: {problem}; "
                          "`pip install python-hostlist` or set MASTER_ADDR") from None
    try:
        return hostlist.expand_hostlist(nodelist)[0]
    except (hostlist.BadHostlist, IndexError) as exc:
        raise ConfigError(f"node list {nodelist}: {exc or 'no host'}; set MASTER_ADDR") from None


def gpu_for_task(step: SlurmStep, visible_gpus: int) -> int:
    """This task's CUDA device index: its local rank when every task sees the node's GPUs, 0
    when SLURM bound one to each. When the node's tasks and GPUs disagree, local rank 0 raises
    :class:`ConfigError` and the others exit with status 1, silent."""
    if visible_gpus == 1 or visible_gpus == step.tasks_on_node:
        return 0 if visible_gpus == 1 else step.local_rank
    if step.local_rank != 0:
        raise SystemExit(1)
    raise ConfigError(
        f"{step.tasks_on_node} tasks on this node but {visible_gpus} visible GPUs: start one task "
        f"per GPU (--ntasks-per-node={visible_gpus}, or --gpus-per-task=1), or --no-accel")


def check_requeue_flag(requeue_flag: bool, environ=os.environ) -> None:
    """Raise :class:`ConfigError` for ``--requeue`` outside a SLURM job."""
    if requeue_flag and "SLURM_JOB_ID" not in environ:
        raise ConfigError("--requeue: not in a SLURM job (SLURM_JOB_ID is not set); it asks "
                          "SLURM to restart the job after a stop signal")


def requeue(job_id: str | None, log) -> bool:
    """``scontrol requeue job_id`` (https://slurm.schedmd.com/scontrol.html#OPT_requeue: the job
    restarts from its batch script), logged in one line. Returns whether SLURM accepted."""
    if not job_id:
        log("--requeue: not in a SLURM job (no SLURM_JOB_ID): nothing to requeue")
        return False
    try:
        result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True,
                                timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log(f"--requeue: scontrol requeue {job_id} failed ({exc}); resubmit the job by hand")
        return False
    if result.returncode != 0:
        log(f"--requeue: scontrol requeue {job_id}: {result.stderr.strip() or 'failed'}; "
            "resubmit the job by hand")
        return False
    log(f"requeued SLURM job {job_id}: it restarts from its batch script (--resume auto)")
    return True
