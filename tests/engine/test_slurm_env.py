"""SLURM's task variables, host lists and GPU checks (engine/distributed/slurm.py), without a cluster; the
real srun/sbatch runs are in tests/engine/test_slurm.py."""
import os
import stat
import sys

import pytest

from engine import ConfigError
from engine.distributed.slurm import (PORT_BASE, PORT_SPAN, SlurmStep, first_host, gpu_for_task,
                                      launcher, rendezvous_port, slurm_step, tasks_on_node)
from tests.helpers import warm
from tests.helpers.paths import REPO

# What srun sets for task 5 of a 2-node step of 4 tasks per node (srun(1), OUTPUT ENVIRONMENT).
SRUN = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_STEP_NODELIST": "gpu[07,09]",
        "SLURM_JOB_NODELIST": "gpu[07,09]"}


@pytest.fixture
def fake_scontrol(tmp_path, monkeypatch):
    """An ``scontrol`` on PATH that expands ``gpu[07,09]`` as SLURM's does (and fails on
    anything else), so no test needs a slurm.conf."""
    script = tmp_path / "scontrol"
    script.write_text('#!/bin/sh\n[ "$1 $2 $3" = "show hostnames gpu[07,09]" ] || '
                      '{ echo "scontrol: error: bad list" >&2; exit 1; }\nprintf "gpu07\\ngpu09\\n"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_launcher_is_read_from_the_environment():
    assert launcher({}) == "none"
    assert launcher({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "4", "SLURM_PROCID": "0"}) == "sbatch"
    assert launcher(SRUN) == "srun"
    assert launcher({**SRUN, "RANK": "0", "WORLD_SIZE": "2"}) == "torchrun"  # srun torchrun


def test_srun_task_variables_place_the_task(fake_scontrol):
    step = slurm_step(SRUN)
    assert (step.rank, step.world_size, step.local_rank, step.tasks_on_node) == (5, 8, 1, 4)
    assert step.master_addr == "gpu07" and step.master_port == rendezvous_port("4242", "0")
    assert step.url == f"tcp://gpu07:{step.master_port}"
    assert step.describe().startswith("srun (SLURM job 4242 step 0: 8 tasks, 4 on this node")
    mine = slurm_step({**SRUN, "MASTER_ADDR": "gpu07-ib", "MASTER_PORT": "29500"})
    assert (mine.master_addr, mine.master_port) == ("gpu07-ib", 29500)
    assert slurm_step({"SLURM_JOB_ID": "1"}) is None  # a batch script: no step


def test_rendezvous_port_is_the_jobs_and_below_the_ephemeral_range():
    ports = {rendezvous_port(str(job), "0") for job in range(100000, 100100)}
    assert len(ports) == 100 and all(PORT_BASE <= p < PORT_BASE + PORT_SPAN for p in ports)
    assert rendezvous_port("7", "1") != rendezvous_port("7", "0")  # two steps of one job
    assert rendezvous_port("7", "batch") == rendezvous_port("7", "0")


def test_tasks_per_node_syntax():
    assert tasks_on_node("4(x2),3", 0) == 4 and tasks_on_node("4(x2),3", 2) == 3
    assert tasks_on_node("2", 0) == 2
    with pytest.raises(ValueError):
        tasks_on_node("4(x2)", 2)


def test_host_lists_are_expanded_by_scontrol(fake_scontrol):
    assert first_host("gpu[07,09]") == "gpu07"
    assert first_host("node12") == "node12"  # nothing to expand: scontrol not asked
    with pytest.raises(ConfigError, match="bad list"):
        first_host("gpu[")


def test_gpu_per_task_or_one_line_on_a_mismatch():
    step = SlurmStep(rank=5, world_size=8, local_rank=1, tasks_on_node=4, master_addr="h",
                     master_port=1, job_id="1", step_id="0")
    assert gpu_for_task(step, 4) == 1  # the node's 4 GPUs visible to each of its 4 tasks
    assert gpu_for_task(step, 1) == 0  # --gpus-per-task=1: SLURM bound one GPU to each
    with pytest.raises(SystemExit):  # 8 tasks on 4 GPUs: local rank 0 alone says so
        gpu_for_task(SlurmStep(5, 8, 1, 8, "h", 1, "1", "0"), 4)
    with pytest.raises(ConfigError, match="8 tasks on this node but 4 visible GPUs"):
        gpu_for_task(SlurmStep(4, 8, 0, 8, "h", 1, "1", "0"), 4)


@pytest.mark.parametrize("env, message", [
    ({}, "--requeue: not in a SLURM job"),
    ({**SRUN, "SLURM_PROCID": "x", "SLURM_JOB_ID": "1"}, "SLURM variables are not what srun"),
])
def test_bad_slurm_settings_are_one_line_errors(tmp_path, env, message):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    result = warm.run(
        [sys.executable, "main.py", "--dummy", "--epochs", "1", "--output-dir", str(tmp_path),
         *(["--requeue"] if not env else [])],
        cwd=REPO, capture_output=True, text=True, timeout=300, env={**clean, **env})
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("main.py: error:") and message in lines[0]
