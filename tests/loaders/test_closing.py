"""``ClosingDataLoader.close()`` (issue 46) with real worker processes: idle kept workers leave
on torch's shutdown message; a worker stuck in a sample, blocking SIGTERM as ours do, is
killed after the grace period instead of holding the run's exit; a later pass starts new
workers."""
import signal
import time

import torch
from torch.utils.data import Dataset

from loaders.pipelines._closing import ClosingDataLoader


class _StuckAfterFirst(Dataset):
    """Sample 0 at once; every later one never returns (a read that hangs)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        if index > 0:
            time.sleep(3600)
        return index


def _block_stop_signals(_worker_id: int) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGUSR1})


def test_a_stuck_worker_that_blocks_sigterm_is_killed_after_the_grace():
    loader = ClosingDataLoader(_StuckAfterFirst(), batch_size=1, num_workers=1,
                               persistent_workers=True, worker_init_fn=_block_stop_signals)
    batches = iter(loader)
    assert next(batches).tolist() == [0]
    (worker,) = batches._workers
    started = time.monotonic()
    loader.close(grace_s=0.5)
    assert time.monotonic() - started < 5.0
    assert not worker.is_alive() and worker.exitcode == -signal.SIGKILL


def test_idle_kept_workers_leave_by_themselves_and_a_later_pass_starts_new_ones():
    loader = ClosingDataLoader(list(range(8)), batch_size=4, num_workers=2,
                               persistent_workers=True)
    first = [batch.tolist() for batch in loader]
    workers = list(loader._iterator._workers)
    loader.close()
    assert [w.exitcode for w in workers] == [0, 0]  # joined, not killed
    assert [batch.tolist() for batch in loader] == first == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert not set(loader._iterator._workers) & set(workers)
    loader.close()
    loader.close()  # again: nothing left to stop


def test_a_pass_left_part_way_is_stopped_too():
    loader = ClosingDataLoader(torch.arange(64), batch_size=4, num_workers=2)
    batches = iter(loader)  # not persistent: the DataLoader does not hold this iterator
    next(batches)
    workers = list(batches._workers)
    loader.close()
    assert all(not w.is_alive() for w in workers)
