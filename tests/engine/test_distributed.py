"""Distributed runs on CPU with gloo: mp.spawn, torchrun, two 'nodes' on localhost, failures."""
import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from engine.distributed.processes import use_default_start_method
from tests.helpers import warm
from tests.helpers.paths import REPO
from engine.distributed.processes import free_port
from tests.helpers.processes import descendants, training_processes
from tests.helpers.runs import (SMALL_DISTRIBUTED, assert_same_training, main_cmd, only_record,
                                run, run_cli)
from tests.helpers.traces import kill_at_step, saved_position, traced_batches, traced_env

# -b is split among the processes by --multiprocessing-distributed (as pytorch/examples).
SMALL = SMALL_DISTRIBUTED


def single_process_top1(data, out):
    result = run(main_cmd(*data, *SMALL, "-b", "4", "-e",
                          "--resume", os.path.join(out, "checkpoint.pth.tar")))
    line = [l for l in result.stdout.splitlines() if l.startswith("val top-1")][0]
    return float(line.split()[2]), int(line.split("(")[1].split()[0])


def check_distributed_run(data, out):
    record = only_record(out)
    assert record["val_images"] == 16  # each validation image exactly once, none padded
    assert record["train_images"] == 32  # the ranks' disjoint shards cover all 32
    top1, images = single_process_top1(data, out)
    assert images == 16 and top1 == pytest.approx(record["val_acc1"], abs=1e-9)


# 2 spawned processes of -b 2 (8 steps of the 32 images), a checkpoint at every step
MPD = [*SMALL, "-b", "4", "--multiprocessing-distributed", "--nproc-per-node", "2",
       "--save-every", "1"]


@pytest.fixture(scope="module")
def mpd_lmdb(tiny, tmp_path_factory):
    """An uninterrupted LMDB run of :data:`MPD` (the resume test's reference too): its ``out``
    folder, sample ``trace`` and ``stdout``."""
    root = tmp_path_factory.mktemp("mpd-lmdb")
    out, trace = str(root / "out"), str(root / "trace")
    result = run_cli("--lmdb", tiny.lmdb, *MPD, "--output-dir", out, env=traced_env(trace))
    assert result.returncode == 0, result.stderr[-2000:]
    return SimpleNamespace(out=out, trace=trace, stdout=result.stdout)


def test_multiprocessing_distributed_two_cpu_processes(tiny, mpd_lmdb):
    """The launcher (one reader: every reader's world-size behaviour is tested through
    tests.helpers.ranks in test_resume_layouts.py)."""
    assert "world size 2" in mpd_lmdb.stdout
    assert mpd_lmdb.stdout.count("epoch 0:") == 1  # only global rank 0 prints
    check_distributed_run(["--lmdb", tiny.lmdb], mpd_lmdb.out)


def test_one_launched_process_still_joins_a_process_group(tiny, tmp_path):
    """As pytorch/examples: --multiprocessing-distributed on one GPU (here one CPU process)
    trains with DDP over a process group of one, so `make gpu-check` exercises NCCL there."""
    out = str(tmp_path / "out")
    result = run(main_cmd(tiny.root, *SMALL, "-b", "8", "--multiprocessing-distributed",
                          "--nproc-per-node", "1", "--output-dir", out))
    assert "world size 1 (gloo process group)" in result.stdout
    assert only_record(out)["val_images"] == 16


def test_torchrun_two_cpu_processes(tiny, tmp_path):
    """torchrun itself (its ranks start cold); the readers under torchrun's variables are
    tested at several world sizes through tests.helpers.ranks (test_resume_layouts.py)."""
    data = ["--lmdb", tiny.lmdb]
    out = str(tmp_path / "out")
    run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), "main.py", *data, *SMALL, "-b", "4",
         "--dist-url", "env://", "--output-dir", out])
    check_distributed_run(data, out)


def test_two_nodes_on_localhost_agree(tiny, tmp_path):
    url = f"tcp://127.0.0.1:{free_port()}"
    outs = [str(tmp_path / f"node{r}") for r in (0, 1)]
    procs = [warm.Popen(
        main_cmd("--lmdb", tiny.lmdb, *SMALL, "-b", "4", "--multiprocessing-distributed",
                 "--nproc-per-node", "1", "--world-size", "2", "--rank", str(r),
                 "--dist-url", url, "--output-dir", outs[r]),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        results = [p.communicate(timeout=240) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:  # no rank left running; both nodes' output says which one stopped
            for pid in descendants(p.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            p.kill()
        outs = [p.communicate() for p in procs]
        pytest.fail("two nodes still running after 240 s:\n" + "\n".join(
            f"node {r} stdout: {o[-1500:]}\nnode {r} stderr: {e[-1500:]}"
            for r, (o, e) in enumerate(outs)))
    assert [p.returncode for p in procs] == [0, 0], results[0][1][-2000:] + results[1][1][-2000:]
    record = only_record(outs[0])
    assert record["train_images"] == 32 and record["val_images"] == 16
    assert not os.path.exists(os.path.join(outs[1], "metrics.jsonl"))  # node 1 writes nothing


def test_killed_rank_ends_the_job_quickly(tmp_path):
    proc = warm.Popen(
        main_cmd("--dummy", *SMALL, "-b", "4", "--epochs", "1000", "--train-batches", "1000",
                 "--multiprocessing-distributed", "--nproc-per-node", "2", "-j", "0",
                 "--output-dir", str(tmp_path)),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:  # wait until training runs
            if line.startswith("Epoch:"):
                break
        workers = training_processes(proc.pid)
        assert len(workers) == 2
        killed_at = time.monotonic()
        os.kill(workers[1], signal.SIGKILL)  # spawned second: local rank 1
        proc.wait(timeout=60)
        assert time.monotonic() - killed_at < 30
        assert proc.returncode != 0
        assert "process 1" in proc.stderr.read()
    finally:
        proc.kill()


def test_bad_path_in_distributed_run_is_reported_once(tmp_path):
    result = warm.run(main_cmd(str(tmp_path / "missing"), *SMALL, "-b", "8",
                                     "--multiprocessing-distributed", "--nproc-per-node", "2"),
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"main.py: error: {tmp_path / 'missing' / 'train'}: no such file or directory"]


@pytest.mark.slow
def test_mid_epoch_resume_in_a_distributed_run(tiny, mpd_lmdb, tmp_path):
    """Kill a 2-process job mid-epoch; resuming from its --save-every checkpoint trains the
    remaining batches only (the killed run's batches before its checkpoint and the resumed
    run's are the uninterrupted run's samples, each once), the epoch's global sums carry over
    (checkpointed by rank 0), and the weights end bit for bit as the uninterrupted run's."""
    args = ["--lmdb", tiny.lmdb, *MPD]
    out = str(tmp_path / "out")
    traces = {name: str(tmp_path / f"trace-{name}") for name in ("killed", "resumed")}
    kill_at_step([*args, "--output-dir", out], traces["killed"], 5)  # of 8 (2 ranks, -b 2 each)
    position = saved_position(out)
    checkpoint = os.path.join(out, "checkpoint.pth.tar")
    result = run_cli(*args, "--output-dir", out, "--resume", checkpoint,
                     env=traced_env(traces["resumed"]))
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"resumed from {checkpoint} at epoch 0, batch {position['batch']}" in result.stdout
    before = traced_batches(traces["killed"], before=position["batch"])
    after = traced_batches(traces["resumed"])
    whole = [i for batch in traced_batches(mpd_lmdb.trace) for i in batch]
    trained = [i for batch in before + after for i in batch]
    assert before and after and sorted(trained) == sorted(whole)
    assert len(whole) == len(set(whole)) == 32
    assert_same_training(out, mpd_lmdb.out)


def _start_methods(_rank: int, path: str) -> None:
    inherited = multiprocessing.get_start_method()
    use_default_start_method()
    with open(path, "w") as f:
        f.write(f"{inherited} {multiprocessing.get_start_method()}")


def test_spawned_processes_start_loader_workers_as_one_process_does(tmp_path):
    """--multiprocessing-distributed's processes (torch.multiprocessing.spawn) inherit
    ``spawn``; main.spawned_worker resets it, so their DataLoader workers start the way one
    process's do (fork on Linux) instead of importing torch again, each of them."""
    import torch.multiprocessing as mp

    path = str(tmp_path / "methods")
    mp.spawn(_start_methods, args=(path,), nprocs=1)
    with open(path) as f:
        inherited, used = f.read().split()
    assert inherited == "spawn"
    assert used == multiprocessing.get_all_start_methods()[0]  # the platform's default
    if sys.platform == "linux":
        assert used != "spawn"
