"""folder2shards.py as a SLURM job array (slurm/convert.sbatch, as users submit it) on the real
daemons of tests/helpers/slurm_cluster.py: 20,000 generated JPEGs (8-12 px, so it is quick) in
1,000 classes, 500 per shard (40 shards), converted by arrays of 4, of 3, of 4 with a task
requeued mid-shard, and of 4 stopped and finished by one of 2: each time the shards, their
indexes, index.json and skipped.tsv equal the one-process conversion's byte for byte. Training
from the array's output, read locally and over HTTP, takes each record once in the epoch.
``make test-slurm`` runs it; the module shares one generated set and one reference."""
import json
import os
import re
import subprocess
import sys
import time

import pytest

import folder2shards
from loaders.orders.positions import TRACE_ENV
from tests.helpers.exits import FileServer
from tests.helpers.paths import REPO
from tests.helpers.slurm_cluster import job_fields, module_cluster, read, wait_until_done
from tests.helpers.traces import traced_batches

pytestmark = pytest.mark.slurm

IMAGES, PER_SHARD = 20_000, 500
SCRIPT = os.path.join(REPO, "slurm", "convert.sbatch")
SBATCH = ["--cpus-per-task=1", "--time=10"]  # convert.sbatch asks for 32 cores
# folder2shards.py with each record slowed by 2 ms (1 s a shard): a signal lands inside a shard
_SLOW = """
import sys, time
import folder2shards
from formats.shards import _convert as _writing
write = _writing.ShardWriter.write
_writing.ShardWriter.write = lambda self, *a: (time.sleep(0.002), write(self, *a))[1]
sys.exit(folder2shards.main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from module_cluster(tmp_path_factory)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The generated set: ``train`` (20 images per class) and ``val`` (1 per class)."""
    root = str(tmp_path_factory.mktemp("generated"))
    subprocess.run([sys.executable, "-m", "tools.datagen", root, "--classes", "1000",
                    "--train-per-class", str(IMAGES // 1000), "--val-per-class", "1",
                    "--min-size", "8", "--max-size", "12", "--shapes", "1"],
                   cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return root


@pytest.fixture(scope="module")
def reference(generated, tmp_path_factory):
    """The one-process conversion of the train split."""
    out = str(tmp_path_factory.mktemp("reference") / "train")
    assert folder2shards.main(["-d", os.path.join(generated, "train"), "-o", out,
                               "--max-per-shard", str(PER_SHARD), "-j", "2"]) == 0
    return out


def slow_python(folder: str) -> dict:
    """An environment whose ``$PYTHON`` (convert.sbatch's) runs :data:`_SLOW`."""
    path = os.path.join(folder, "slow-python")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nexec {sys.executable} -c '{_SLOW}' \"$@\"\n")
    os.chmod(path, 0o755)
    return {"PYTHON": path}


def submit(cluster, generated: str, out: str, array: str, *args: str, env=None) -> str:
    """``sbatch --array=ARRAY slurm/convert.sbatch`` of the train split into ``out``; the job
    id. Each task logs to ``out.log/TASK``."""
    os.makedirs(out + ".log", exist_ok=True)
    return cluster.run(
        ["sbatch", "--parsable", f"--array={array}", *SBATCH, f"--output={out}.log/%a",
         SCRIPT, "--dataset", os.path.join(generated, "train"), "-o", out,
         "--max-per-shard", str(PER_SHARD), *args],
        cwd=REPO, env={**cluster.env, **(env or {})}).stdout.strip()


def wait_for_tasks(cluster, job: str, out: str, tasks: int) -> None:
    for task in range(tasks):
        fields = wait_until_done(cluster, f"{job}_{task}", f"{out}.log/{task}")
        assert fields["JobState"] == "COMPLETED", read(f"{out}.log/{task}")[-3000:]


def assert_same_files(out: str, reference: str) -> None:
    """Shards, their ``.idx``, ``index.json`` and ``skipped.tsv`` equal the reference's."""
    ours = sorted(n for n in os.listdir(out) if n.endswith((".tar", ".idx", ".json", ".tsv")))
    theirs = sorted(os.listdir(reference))
    assert ours == theirs and len([n for n in ours if n.endswith(".tar")]) == 40
    for name in theirs:
        if name != "progress.json":  # also the array's settings: by design not the same
            with open(os.path.join(out, name), "rb") as a, \
                    open(os.path.join(reference, name), "rb") as b:
                assert a.read() == b.read(), name


def finished_blocks(out: str, ending: str = ".done") -> set[int]:
    """The blocks with a file ending in ``ending`` in ``out`` (``train-000012.done``: 12)."""
    names = os.listdir(out) if os.path.isdir(out) else []
    return {int(n[6:12]) for n in names if n.endswith(ending)}


def train_epoch(train: str, val: str, out: str) -> list[int]:
    """One traced epoch of main.py over ``train``: the records it took, in order."""
    trace = os.path.join(out, "trace")
    result = subprocess.run(
        [sys.executable, "main.py", "--loader", "shards", "--train", train, "--val", val,
         "-a", "resnet18", "-b", "500", "-j", "1", "--train-crop-size", "16",
         "--val-resize-size", "16", "--val-crop-size", "16", "--epochs", "1", "--seed", "3",
         "--val-batches", "1", "--output-dir", out],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, TRACE_ENV: trace, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    return [i for batch in traced_batches(trace) for i in batch]


def test_an_array_of_4_writes_the_one_process_files_and_trains_each_record_once(
        cluster, generated, reference, tmp_path):
    out = str(tmp_path / "train")
    job = submit(cluster, generated, out, "0-3")
    wait_for_tasks(cluster, job, out, 4)
    assert_same_files(out, reference)
    logs = [read(f"{out}.log/{task}") for task in range(4)]
    assert all("files to convert (-j 1)" in log for log in logs)  # SLURM_CPUS_PER_TASK
    assert sum("wrote index.json" in log for log in logs) == 1, logs
    assert folder2shards.main(["--verify", out]) == 0
    val = str(tmp_path / "val")
    assert folder2shards.main(["-d", os.path.join(generated, "val"), "-o", val,
                               "--max-per-shard", str(PER_SHARD), "-j", "2"]) == 0
    assert sorted(train_epoch(out, val, str(tmp_path / "local"))) == list(range(IMAGES))
    server = FileServer(str(tmp_path))
    try:
        taken = train_epoch(f"{server.url}/train", f"{server.url}/val", str(tmp_path / "http"))
    finally:
        server.stop()
    assert sorted(taken) == list(range(IMAGES))


def test_a_task_requeued_mid_shard_resumes_after_its_last_finished_shard(
        cluster, generated, reference, tmp_path):
    """The time limit's warning (SIGUSR1 to the batch script, as --signal=B:USR1 sends it) while
    the task writes a shard: the script requeues the task, SLURM ends it, and the task comes
    back to redo only its unfinished shards."""
    out = str(tmp_path / "train")
    job = submit(cluster, generated, out, "0-3", env=slow_python(str(tmp_path)))
    deadline = time.monotonic() + 300
    while True:  # a task with a finished shard and one half-written
        done = finished_blocks(out)
        partial = [b for b in finished_blocks(out, ".tar.tmp") if b - 1 in done and b % 10]
        if partial:
            break
        assert time.monotonic() < deadline, done
        time.sleep(0.05)
    task = partial[0] // 10  # 40 shards, 10 per task
    # ended once the signal has landed: with tasks of the array pending, this scancel (SLURM
    # 22.05) does not return, and signals the task again when it comes back
    signal = subprocess.Popen(["scancel", "--batch", "--signal=USR1", f"{job}_{task}"],
                              env=cluster.env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        while "time limit near: requeued" not in read(f"{out}.log/{task}"):
            assert time.monotonic() < deadline and signal.poll() in (None, 0)
            time.sleep(0.05)
    finally:
        signal.kill()
        signal.wait()
    wait_for_tasks(cluster, job, out, 4)
    log = read(f"{out}.log/{task}")
    assert "time limit near: requeued" in log and "restart 1" in log, log[-3000:]
    resumed = int(re.findall(r"blocks \d+-\d+, (\d+) already done", log)[-1])
    assert 0 < resumed < 10, log[-3000:]
    assert_same_files(out, reference)


def test_an_array_of_3_and_its_dependent_index_step_write_the_files_of_4(
        cluster, generated, reference, tmp_path):
    out = str(tmp_path / "train")
    job = submit(cluster, generated, out, "0-2")
    finish = cluster.run(
        ["sbatch", "--parsable", f"--dependency=afterok:{job}", *SBATCH,
         f"--output={out}.log/finish", SCRIPT, "--dataset", os.path.join(generated, "train"),
         "-o", out, "--max-per-shard", str(PER_SHARD), "--finish"],
        cwd=REPO, env=cluster.env).stdout.strip()
    wait_for_tasks(cluster, job, out, 3)
    fields = wait_until_done(cluster, finish, f"{out}.log/finish")
    assert fields["JobState"] == "COMPLETED", read(f"{out}.log/finish")[-3000:]
    assert f"complete: {IMAGES} images in 40 shards" in read(f"{out}.log/finish")
    assert_same_files(out, reference)


def test_an_unfinished_array_of_4_is_finished_by_an_array_of_2(cluster, generated, reference,
                                                               tmp_path):
    out = str(tmp_path / "train")
    job = submit(cluster, generated, out, "0-3%1", env=slow_python(str(tmp_path)))
    deadline = time.monotonic() + 300
    while len(finished_blocks(out)) < 13:  # task 0 done and task 1 begun
        assert time.monotonic() < deadline
        time.sleep(0.05)
    cluster.run(["scancel", job])
    deadline = time.monotonic() + 120
    while any(job_fields(cluster, f"{job}_{t}")["JobState"] in ("RUNNING", "PENDING",
                                                                  "COMPLETING")
              for t in range(4)):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert not os.path.exists(os.path.join(out, "index.json"))
    refused = subprocess.run([sys.executable, "main.py", "--loader", "shards", "--train", out,
                              "--val", out], cwd=REPO, capture_output=True, text=True,
                             timeout=300)
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines()[-1].startswith(f"main.py: error: {out}: no "
                                                              "index.json"), refused.stderr
    again = submit(cluster, generated, out, "0-1")
    wait_for_tasks(cluster, again, out, 2)
    assert re.search(r"blocks 0-19, (1[0-9]|20) already done", read(f"{out}.log/0"))
    assert_same_files(out, reference)
    with open(os.path.join(out, "progress.json")) as f:
        assert len(json.load(f)["shards"]) == 40
