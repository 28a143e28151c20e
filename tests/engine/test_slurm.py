"""srun and sbatch against a real SLURM (tests/helpers/slurm_cluster.py: slurmctld, slurmd and munged
on 127.0.0.1, one node with this machine's cores), running slurm/train.sbatch as users do.

Every run trains the same 2 x 8 steps of 2 ranks (gloo on CPU, one torch thread each, so the
same run is the same bits) and is compared with one uninterrupted torchrun run; the job
resumed at 1 task instead checks the samples each rank trained (the ``tiny`` LMDB). ``make
test-slurm`` installs the packages (as root) and runs this module; ``make test`` leaves it out.
"""
import json
import os
import re
import signal
import sys
import time

import pytest
import torch

from loaders.orders.positions import TRACE_ENV
from tests.helpers.paths import REPO
from engine.distributed.processes import free_port
from tests.helpers.runs import assert_same_training, read_metrics, small_run
from tests.helpers.slurm_cluster import (SlurmCluster, job_fields, missing_commands, module_cluster,
                                         read, wait_until_done)
from tests.helpers.traces import epoch_order, traced_batches

pytestmark = pytest.mark.slurm

RUN = ["--dummy", "-a", "resnet18", "-b", "8", "-j", "0", "--train-crop-size", "32",
       "--val-crop-size", "32", "--val-resize-size", "32", "--epochs", "2",
       "--train-batches", "8", "--val-batches", "2", "--seed", "3", "--lr", "0.01", "-p", "1"]
# the time-limit test's run: long enough (2 x 40 steps, over 10 s) to be training, not exiting,
# when the warning comes 8 s after its submission, on a slow machine as on a fast one
LONG_RUN = [*RUN]
LONG_RUN[RUN.index("--train-batches") + 1] = "40"
# slurm/train.sbatch asks for 8 GPUs of 8 cores each: here 2 CPU tasks of one core
SBATCH = ["--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-node=0"]
SCRIPT = os.path.join(REPO, "slurm", "train.sbatch")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory)


def uninterrupted(cluster, out: str, run: list) -> str:
    """The uninterrupted run: torchrun's 2 processes inside a one-task srun step (`srun
    torchrun` keeps torchrun's variables, which win over SLURM's)."""
    result = cluster.run(
        ["srun", "-n", "1", "-c", "2", sys.executable, "-m", "torch.distributed.run",
         "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
         str(free_port()), "main.py", *run, "--output-dir", out],
        check=False, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("launcher: torchrun (2 processes, 2 on this node)")
    return out


@pytest.fixture(scope="module")
def reference(cluster, tmp_path_factory):
    return uninterrupted(cluster, str(tmp_path_factory.mktemp("reference")), RUN)


@pytest.fixture(scope="module")
def long_reference(cluster, tmp_path_factory):
    return uninterrupted(cluster, str(tmp_path_factory.mktemp("long_reference")), LONG_RUN)


def submit(cluster, out: str, *options: str, args=(), run=RUN, env=None) -> tuple[str, str]:
    """sbatch slurm/train.sbatch (as it is, with this machine's resources) training ``run``
    into ``out``, the job's environment ``env`` (None: the cluster's); returns the job id and
    its log."""
    log = os.path.join(out, "job.log")
    os.makedirs(out, exist_ok=True)
    job = cluster.run(["sbatch", "--parsable", *SBATCH, f"--output={log}", *options, SCRIPT,
                       *run, *args, "--output-dir", out], cwd=REPO,
                      env=env or cluster.env).stdout.strip()
    return job, log


def wait_for(log: str, text: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(log) and text in open(log).read():
            return
        time.sleep(0.2)
    raise AssertionError(f"no {text!r} in {log} after {timeout} s:\n" + read(log)[-3000:])


def test_srun_tasks_train_as_one_job_equal_to_torchrun(cluster, reference, tmp_path):
    out = str(tmp_path / "out")
    result = cluster.run(["srun", "-n", "2", "--kill-on-bad-exit=1", sys.executable, "main.py",
                          *RUN, "--output-dir", out], check=False, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    first = result.stdout.splitlines()[0]
    assert first.startswith("launcher: srun (SLURM job ") and "2 tasks, 2 on this node" in first
    assert "world size 2 (gloo process group)" in result.stdout
    assert result.stdout.count("epoch 1:") == 1  # rank 0 alone prints
    assert_same_training(out, reference, resumed=False)


def test_sbatch_job_sent_usr1_mid_epoch_requeues_itself_and_resumes_exactly(cluster,
                                                                          long_reference,
                                                                          tmp_path):
    """The long run: 37 steps (several seconds) left after the signal is sent, so that it
    arrives mid-epoch however loaded the machine is."""
    out = str(tmp_path / "out")
    job, log = submit(cluster, out, "--time=10", run=LONG_RUN)
    wait_for(log, "0: Epoch: [0][ 3/40]")
    cluster.run(["scancel", "--signal=USR1", job])  # to every task of the job's steps
    fields = wait_until_done(cluster, job, log)
    text = read(log)
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", text[-3000:]
    assert "0: stopped by SIGUSR1: checkpoint" in text and f"requeued SLURM job {job}" in text
    resumed = text[text.index("restart 1"):]
    assert "--resume auto: resuming from" in resumed and "at epoch 0, batch " in resumed
    assert_same_training(out, long_reference)


def test_sbatch_job_at_its_time_limit_requeues_itself_and_resumes_exactly(cluster, long_reference,
                                                                        tmp_path):
    """--time=1 with the script's --signal=B:USR1@N (N=59 here: due 1 s after the start):
    SIGUSR1 to the batch script, which passes it to srun's tasks. slurmctld sends the warning
    at its time-limit check, every 30 s, so the job is submitted 8 s before one: the run
    trains by then (LONG_RUN: still training then). Each restart has the same limit and may be
    stopped again."""
    deadline = time.monotonic() + 40
    while not cluster.time_limit_checks():  # the first comes within 30 s of slurmctld's start
        assert time.monotonic() < deadline, "slurmctld logged no time-limit check"
        time.sleep(0.5)
    lead = 8.0
    next_check = cluster.time_limit_checks()[-1] + 30
    while next_check - time.time() < lead:
        next_check += 30
    time.sleep(next_check - lead - time.time())
    out = str(tmp_path / "out")
    job, log = submit(cluster, out, "--time=1", "--signal=B:USR1@59", run=LONG_RUN)
    fields = wait_until_done(cluster, job, log)
    text = read(log)
    assert fields["JobState"] == "COMPLETED" and int(fields["Restarts"]) >= 1, text[-3000:]
    assert "0: stopped by SIGUSR1: checkpoint" in text and f"requeued SLURM job {job}" in text
    first = text[:text.index("restart 1")]
    assert "0: Epoch: [1][40/40]" not in first  # the first run was stopped before its end
    assert_same_training(out, long_reference)


def test_a_2_task_job_requeued_as_1_task_trains_each_sample_of_the_epoch_once(cluster, tiny,
                                                                              tmp_path):
    """SIGUSR1 mid-epoch 0 at 2 tasks of -b 2 (the ``tiny`` LMDB's 32 images; 2 epochs, so the
    signal lands in epoch 0): the job checkpoints and requeues itself; it comes back as a
    1-task job whose ``--resume auto`` deals the rest of epoch 0's global order to its one
    task (IMAGENET_FAST_TRACE_SAMPLES: what each rank trained). A requeued batch job keeps the
    task count of its submission (srun reads SLURM_NTASKS from the environment sbatch stored;
    ``scontrol update NumTasks=1`` changes the record, not that), so the held requeued job is
    cancelled and the same script resubmitted as 1 task into the same --output-dir, as a user
    whose allocation shrank does."""
    out, trace = str(tmp_path / "out"), str(tmp_path / "trace")
    run = ["--lmdb", tiny.lmdb, *small_run(batch=2, seed=3, print_freq=1), "--epochs", "2"]
    env = {**cluster.env, TRACE_ENV: trace}
    job, log = submit(cluster, out, "--time=10", run=run, env=env)
    wait_for(log, "0: Epoch: [0][1/8]")
    cluster.run(["scancel", "--signal=USR1", job])
    deadline = time.monotonic() + 60
    while job_fields(cluster, job)["JobState"] != "PENDING":  # requeued, held (BeginTime)
        assert time.monotonic() < deadline, read(log)[-3000:]
        time.sleep(0.2)
    cluster.run(["scancel", job])
    assert f"requeued SLURM job {job}" in read(log)
    smaller, _ = submit(cluster, out, "--time=10", "--ntasks-per-node=1", run=run, env=env)
    fields = wait_until_done(cluster, smaller, log)
    text = read(log)
    resumed = text[text.index(f"job {smaller} on"):]
    assert fields["JobState"] == "COMPLETED", resumed[-3000:]
    assert not re.search("^1: ", resumed, re.M) and "dealt to 1 process(es) x -b 2" in resumed
    consumed, start, steps = map(int, re.search(
        r"goes on after (\d+) samples .* step (\d+) of (\d+)", resumed).groups())
    before = [i for b in traced_batches(trace, before=consumed // 4) for i in b]  # both ranks
    with open(f"{trace}.rank0") as f:
        rows = [row for row in map(json.loads, f) if row["epoch"] == 0][start - steps:]
    assert [row["batch"] for row in rows] == list(range(start, steps))  # the 1-task job's
    after = [i for row in rows for i in row["indices"]]
    order = epoch_order("lmdb", os.path.join(tiny.lmdb, "train"), 2, 2)
    assert sorted(before) == sorted(order[:consumed]) and after == order[consumed:]
    assert sorted(before + after) == list(range(32))  # each sample once, no tail at 1 x -b 2
    assert read_metrics(out)[0]["train_images"] == 32


def proc_file(pid: int, name: str) -> bytes:
    """/proc/PID/NAME (``cmdline``, ``environ``), or b"" for a process that has gone."""
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:
        return b""


def task_pid(cluster, job: str, rank: int) -> int:
    """The process id of ``job``'s training task ``rank`` (main.py, SLURM_PROCID=rank)."""
    wanted = {f"SLURM_JOB_ID={job}".encode(), f"SLURM_PROCID={rank}".encode()}
    for pid in cluster.marked_pids():
        if b"main.py" in proc_file(pid, "cmdline") and \
                wanted <= set(proc_file(pid, "environ").split(b"\0")):
            return pid
    raise AssertionError(f"no task {rank} of job {job}")


def test_rank_killed_ends_the_step_and_a_requeue_resumes_from_the_last_checkpoint(
        cluster, reference, tmp_path):
    out = str(tmp_path / "out")
    job, log = submit(cluster, out, "--time=10", args=["--save-every", "3"])
    wait_for(log, "0: Epoch: [1][5/8]")
    killed_at = time.monotonic()
    os.kill(task_pid(cluster, job, 1), signal.SIGKILL)
    while job_fields(cluster, job)["JobState"] in ("RUNNING", "COMPLETING"):
        assert time.monotonic() - killed_at < 30, read(log)[-3000:]
        time.sleep(0.2)
    text = read(log)
    assert "task 1: Killed" in text, text[-3000:]  # srun names the rank
    assert job_fields(cluster, job)["JobState"] == "FAILED"
    saved = torch.load(os.path.join(out, "checkpoint.pth.tar"), weights_only=True)
    assert (saved["epoch"], saved["batch"]) in ((1, 3), (1, 6))  # the last complete one
    cluster.run(["scontrol", "requeue", job])  # as after a node failure, or by hand
    fields = wait_until_done(cluster, job, log)
    text = read(log)
    assert fields["JobState"] == "COMPLETED", text[-3000:]
    resumed = text[text.index("restart 1"):]
    assert f"at epoch 1, batch {saved['batch']}" in resumed
    assert_same_training(out, reference)


def test_a_failing_test_leaves_no_daemon_and_no_job_behind(tmp_path):
    """What the fixture relies on: leaving SlurmCluster's block on an error (a failed
    assertion) cancels the jobs and ends the daemons, slurmstepd and the jobs' processes."""
    if missing_commands():
        pytest.skip("SLURM is not installed (make test-slurm)")
    with pytest.raises(AssertionError, match="a test failed"):
        with SlurmCluster(tmp_path / "slurm") as failing:
            failing.run(["sbatch", "--wrap", "sleep 300", f"--output={tmp_path}/sleep.out"])
            deadline = time.monotonic() + 60
            while not [p for p in failing.marked_pids() if b"sleep" in proc_file(p, "cmdline")]:
                assert time.monotonic() < deadline, "the job never started"
                time.sleep(0.2)
            daemons = list(failing.procs.values())
            raise AssertionError("a test failed")
    assert all(proc.poll() is not None for proc in daemons)
    assert failing.marked_pids() == []
