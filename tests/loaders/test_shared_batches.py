"""Shared-memory batch slots (loaders/pipelines/workers/slots.py) and their use by DeviceLoader."""
import re
import shlex
import shutil
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

import loaders
from loaders import DataError, DistInfo
from loaders.orders import ShardOrder
from loaders.pipelines import batches as nb
from loaders.pipelines.bad_samples import BadSamples
from loaders.pipelines.workers import slots as sb
from loaders.pipelines.workers import step
from tests.helpers.loading import loader_settings
from tests.helpers.paths import REPO


def test_batches_are_numbered_per_pass():
    sampler = nb.NumberedBatchSampler(ShardOrder(10), 4, drop_last=False)
    batches = list(sampler)
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] and len(sampler) == 3
    assert [b.number for b in batches] == [0, 1, 2]
    assert [b.number for b in nb.NumberedBatchSampler(ShardOrder(10), 4, True)] == [0, 1]
    assert len(nb.NumberedBatchSampler(ShardOrder(10), 4, drop_last=True)) == 2


def test_a_worker_waits_until_the_slot_is_released(monkeypatch):
    pool = sb.SharedBatches(2, 4, (3, 8, 8), shared=False)
    assert pool.acquire(0) == 0 and pool.acquire(1) == 1  # first use of each slot: no wait
    polls = []

    def sleep(seconds):  # acquire's poll: batch 2 needs slot 0, still holding batch 0
        polls.append(seconds)
        if len(polls) == 3:
            pool.release(0, 0)

    monkeypatch.setattr(sb, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep))
    assert pool.acquire(2) == 0
    assert len(polls) == 3  # it waited until the release, and no longer


def test_a_wait_that_never_ends_is_a_data_error(monkeypatch):
    monkeypatch.setattr(sb, "_WAIT_LIMIT_S", 0.05)
    pool = sb.SharedBatches(2, 4, (3, 8, 8), shared=False)
    with pytest.raises(DataError, match="stopped reading"):
        pool.acquire(2)


def test_too_little_shared_memory_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(sb.os, "statvfs", lambda path: SimpleNamespace(f_bavail=16, f_frsize=4096))
    with pytest.raises(DataError, match=r"^/dev/shm: cannot reserve 368 MiB for this "
                       r"process's batch slots \(0\.1 MiB free now, .* --ipc=host"):
        sb.SharedBatches(10, 256, (3, 224, 224))


def test_a_transform_of_the_wrong_size_is_named():
    class Reader:
        def __len__(self):
            return 4

        def read(self, index):
            return b"not an image", 0

    def wrong(data, frame):
        return torch.zeros(3, 9, 8, dtype=torch.uint8)

    writer = step.SlotWriter(Reader(), wrong, BadSamples(4), 0)
    writer.pool = sb.SharedBatches(2, 4, (3, 8, 8), shared=False)
    with pytest.raises(DataError, match=r"sample 0: .*\(3, 9, 8\), expected uint8 \(3, 8, 8\)"):
        writer.__getitems__(nb.NumberedBatch([0, 1], 0))


def test_slots_are_reused_after_a_pass_and_not_shared_with_a_suspended_one(tiny):
    train, _ = loaders.build_loaders(loader_settings("folder", data=tiny.root, workers=2),
                                     DistInfo())
    held = []
    for images, labels in train:  # batches are copies: holding them all is safe
        held.append((images, labels))
    first_loader, first_pool = train._idle
    assert first_pool is not None and len(held) == len(train)
    suspended = iter(train)
    next(suspended)  # a pass left half-way keeps its workers and slots ...
    assert train._idle is None
    fresh = list(train)  # ... so this pass gets new ones, and both stay correct
    assert len(fresh) == len(train)
    assert train._idle[1] is not first_pool and train._idle[0] is not first_loader
    suspended.close()
    assert train._idle == (first_loader, first_pool)
    train.close()


# Run under `unshare -rm` with a tiny tmpfs on /dev/shm: RANKS processes on one node each check
# the free space (all see it whole), wait until every one has checked, then make and fill their
# slots. Each prints ok, or its error line; none may die of a signal.
RANKS_ON_ONE_NODE = r"""
import multiprocessing as mp, os, sys
sys.path.insert(0, sys.argv[1])
from loaders import DataError
from loaders.pipelines import batches
from loaders.pipelines.bad_samples import BadSamples
from loaders.pipelines.workers import slots as sb
from loaders.pipelines.workers import step

def rank(checked, done, ranks):
    real_check = sb._check_shm_space
    def check_then_wait(nbytes, path=sb.SHM):
        real_check(nbytes, path)
        checked.wait()
    sb._check_shm_space = check_then_wait
    try:
        pool = sb.SharedBatches(3, 4, (3, 256, 256))  # 2.25 MiB
        pool.memory.fill_(1)  # every page written, as workers would
        line = "ok"
    except DataError as exc:
        line = f"DataError: {exc}"
    os.write(1, (line + "\n").encode())  # one write: the ranks' lines never interleave
    done.wait()  # keep the slots until every rank has made its own

ctx = mp.get_context("fork")
ranks = int(sys.argv[2])
# bounded waits: a rank that died leaves the others a BrokenBarrierError, not a hang
checked, done = ctx.Barrier(ranks, timeout=60), ctx.Barrier(ranks, timeout=60)
procs = [ctx.Process(target=rank, args=(checked, done, ranks)) for _ in range(ranks)]
for p in procs:
    p.start()
for p in procs:
    p.join(120)
print("exitcodes", *[p.exitcode for p in procs], flush=True)
"""


def test_every_process_on_the_node_is_accounted_for(tmp_path):
    """4 ranks x 2.25 MiB of slots on an 8 MiB /dev/shm: each rank alone fits and all pass the
    free-space check together; the reservation gives a rank that does not fit a DataError
    naming the sizes and the fix, and no process dies of SIGBUS. Usually 3 keep their slots;
    ranks reserving at the same moment can each hold part of the last free pages, and then
    more than one gets the error (the job ends on it either way)."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) not installed")
    script = tmp_path / "ranks.py"
    script.write_text(RANKS_ON_ONE_NODE)
    shell = (f"mount -t tmpfs -o size=8m tmpfs /dev/shm && "
             f"exec {shlex.quote(sys.executable)} {script} {shlex.quote(REPO)} 4")
    result = subprocess.run(["unshare", "-rm", "sh", "-c", shell], capture_output=True,
                            text=True, timeout=300)
    if "exitcodes" not in result.stdout and ("unshare" in result.stderr
                                             or "mount" in result.stderr):
        pytest.skip(f"cannot mount a private tmpfs here: {result.stderr.strip()[:200]}")
    lines = result.stdout.splitlines()
    assert lines[-1] == "exitcodes 0 0 0 0", result.stdout + result.stderr
    kinds = [line.split(":")[0] for line in lines[:-1]]
    assert len(kinds) == 4 and "DataError" in kinds and set(kinds) <= {"DataError", "ok"}, \
        result.stdout
    shortage = (r"DataError: /dev/shm: cannot reserve 2\.2 MiB for this process's batch slots "
                r"\([\d.]+ MiB free now, shared by every loader of every process on this node\): "
                r"give the container more shared memory \(docker run --shm-size=\.\.\. or "
                r"--ipc=host\), or lower -j/--workers or -b/--batch-size")
    for error in [line for line in lines if line.startswith("DataError")]:
        assert re.fullmatch(shortage, error), error
