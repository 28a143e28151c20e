"""SIGUSR1/SIGTERM mid-epoch: the ranks agree on a step, rank 0 checkpoints it, the run exits
with status 75, and ``--resume auto`` goes on from there as if nothing happened
(engine/distributed/preempt.py, StopAgreement in engine/distributed/processes.py). Under a real SLURM:
tests/engine/test_slurm.py."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from engine.checkpoint import newest_checkpoint
from engine.distributed.preempt import STOP_EXIT
from tests.helpers import warm
from tests.helpers.paths import REPO
from engine.distributed.processes import free_port
from tests.helpers.processes import cmdline, descendants
from tests.helpers.runs import assert_same_training

# Synthetic data, 2 epochs of 6 steps; one torch thread: the same run is the same bits.
RUN = ["--dummy", "-a", "resnet18", "-b", "8", "-j", "0", "--train-crop-size", "32",
       "--val-crop-size", "32", "--val-resize-size", "32", "--epochs", "2",
       "--train-batches", "6", "--val-batches", "2", "--seed", "3", "--lr", "0.01", "-p", "1"]
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},
       "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def running(pid: int) -> bool:
    """Whether ``pid`` is alive and not a zombie (/proc/PID/stat's state)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def start(cmd, out):
    return warm.Popen([*cmd, *RUN, "--output-dir", out, "--resume", "auto"], cwd=REPO,
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_until(proc, prefix: str, act) -> str:
    """Read ``proc``'s output; at the first line starting with ``prefix`` call ``act()``.
    Returns the whole output once ``proc`` ended."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(prefix) and act:
            act()
            act = None
    proc.wait(timeout=300)
    return "".join(lines)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("uninterrupted"))
    output = run_until(start([sys.executable, "main.py"], out), "", None)
    assert "--resume auto: no checkpoint in" in output and "starting fresh" in output
    return out


def test_sigusr1_mid_epoch_saves_exits_75_and_resume_auto_matches(uninterrupted, tmp_path):
    out = str(tmp_path / "out")
    proc = start([sys.executable, "main.py"], out)
    output = run_until(proc, "Epoch: [1][3/6]", lambda: proc.send_signal(signal.SIGUSR1))
    assert proc.returncode == STOP_EXIT, output[-3000:]
    # one process: it stops after the step it was in (step 4 of epoch 1, or a later one)
    assert "stopped by SIGUSR1: checkpoint" in output and "exit status 75" in output
    saved = torch.load(os.path.join(out, "checkpoint.pth.tar"), weights_only=True)
    assert saved["epoch"] == 1 and 4 <= saved["batch"] < 6, output[-2000:]
    resumed = run_until(start([sys.executable, "main.py"], out), "", None)
    assert f"--resume auto: resuming from {out}" in resumed
    assert f"at epoch 1, batch {saved['batch']}" in resumed
    assert_same_training(out, uninterrupted)


@pytest.mark.slow
def test_a_signal_to_one_rank_stops_every_rank_after_the_same_step(tmp_path):
    """torchrun, 2 processes: SIGTERM to rank 1 alone; rank 0 stops after the same step (the
    all-reduce of the signal), saves it and exits with status 75 (rank 1 with 0)."""
    out = str(tmp_path / "out")
    proc = start([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                  "--master-port", str(free_port()), "main.py"], out)

    def signal_rank_1():
        workers = sorted(p for p in descendants(proc.pid) if b"main.py" in cmdline(p))
        assert len(workers) == 2
        os.kill(workers[1], signal.SIGTERM)  # started second: rank 1

    output = run_until(proc, "Epoch: [0][2/6]", signal_rank_1)
    assert "stopped by SIGTERM: checkpoint" in output, output[-3000:]
    failures = output[output.index("Failures:"):]  # torchrun's report: rank 0 alone
    assert "rank      : 0" in failures and "exitcode  : 75" in failures, failures
    assert "rank      : 1" not in failures
    saved = torch.load(os.path.join(out, "checkpoint.pth.tar"), weights_only=True)
    assert saved["epoch"] == 0 and 3 <= saved["batch"] < 6
    assert saved["partial"]["images"] == saved["batch"] * 8 * 2  # both ranks' batches counted


@pytest.mark.parametrize("at, status", [("Epoch: [0][2/6]", STOP_EXIT), ("epoch 1:", 0)])
def test_stop_signals_until_the_process_has_gone_never_kill_it(tmp_path, at, status):
    """SLURM warns, then signals again at the limit: signals every 10 ms from ``at`` on, through
    the stop's checkpoint (exit 75) or a finished run's teardown (exit 0), until the process
    has gone. Neither may end as killed by the signal (status -10: a FAILED step for SLURM)."""
    proc = start([sys.executable, "main.py"], str(tmp_path / "out"))
    delivered = []  # signals sent while the process was still running (not yet a zombie)

    def flood():
        while proc.poll() is None:
            try:
                proc.send_signal(signal.SIGUSR1)
            except ProcessLookupError:
                return
            if running(proc.pid):
                delivered.append(time.monotonic())
            time.sleep(0.01)

    thread = threading.Thread(target=flood, daemon=True)
    output = run_until(proc, at, thread.start)
    thread.join(timeout=60)
    assert proc.returncode == status, output[-3000:]
    assert delivered, f"no signal reached the process after {at!r}"  # the flood took place


def test_resume_auto_takes_the_newest_whole_checkpoint(tmp_path, capsys):
    from engine.checkpoint import resume_path

    assert newest_checkpoint(str(tmp_path)) == (None, [])
    assert resume_path("auto", str(tmp_path), print) is None
    assert "no checkpoint in" in capsys.readouterr().out
    best, last = tmp_path / "model_best.pth.tar", tmp_path / "checkpoint.pth.tar"
    torch.save({"epoch": 1}, best)
    torch.save({"epoch": 2}, str(last) + ".tmp.123")  # a write that was killed: never a candidate
    assert newest_checkpoint(str(tmp_path)) == (str(best), [])
    torch.save({"epoch": 3}, last)
    os.utime(best, (time.time() - 60, time.time() - 60))
    assert resume_path("auto", str(tmp_path), print) == str(last)
    last.write_bytes(last.read_bytes()[:100])  # torn (a copy cut short): passed over, said so
    assert newest_checkpoint(str(tmp_path)) == (str(best), [str(last)])
    assert resume_path("", str(tmp_path), print) is None
    assert resume_path("x.pth.tar", str(tmp_path), print) == "x.pth.tar"


def test_sigterm_to_every_process_with_loader_workers_is_a_clean_stop(tiny, tmp_path):
    """SLURM signals every process of a step, loader workers too: torch's workers die of
    SIGTERM (a crash for the training process) unless, as here, they block it."""
    out = str(tmp_path / "out")
    proc = warm.Popen(
        [sys.executable, "main.py", tiny.root, "-j", "2", "-b", "4", "--epochs", "1",
         "--train-crop-size", "32", "--val-crop-size", "32", "--val-resize-size", "32",
         "-p", "1", "--seed", "0", "--output-dir", out], cwd=REPO, env=ENV,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    output = run_until(proc, "Epoch: [0][3/8]", lambda: os.killpg(proc.pid, signal.SIGTERM))
    assert proc.returncode == STOP_EXIT, output[-3000:]
    assert "stopped by SIGTERM" in output and "DataLoader worker" not in output
    saved = torch.load(os.path.join(out, "checkpoint.pth.tar"), weights_only=True)
    assert saved["epoch"] == 0 and 4 <= saved["batch"] < 8


def test_training_stop_agreement_prints_its_costs():
    result = warm.run([sys.executable, "-m", "benchmarks.training.stop_agreement", "--ranks",
                             "2", "--steps", "5", "--step-ms", "1"], cwd=REPO, env=ENV,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["ranks"] == 2 and report["steps"] == 5
    assert report["after_step_us"] > 0 and report["blocking_us"] > 0
