"""``ClosingDataLoader.close()`` with real worker processes: idle kept workers leave
on torch's shutdown message; a worker stuck in a sample, blocking SIGTERM as ours do, is
killed after the grace period instead of holding the run's exit; a later pass starts new
workers."""
import signal
import time

import torch
from torch.utils.data import DataLoader, Dataset

from loaders.pipelines.closing import ClosingDataLoader


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


def test_no_queue_feeder_thread_is_ending_when_the_next_pass_forks_its_workers(monkeypatch):
    """CPython before 3.11.8 (gh-112275): a fork while a thread ends can deadlock the child.
    torch closes a finished pass's queues without joining their feeder threads; the next
    ``iter()`` waits for them before torch forks its workers (``join_exiting_feeders``)."""
    loader = ClosingDataLoader(list(range(8)), batch_size=2, num_workers=2)
    first = iter(loader)
    assert [b.tolist() for b in first] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert first._shutdown  # finished: its queues are closed
    feeders = [q._thread for q in first._index_queues if q._thread is not None]
    assert feeders  # the indices went through them
    alive_at_fork = []
    torch_get_iterator = DataLoader._get_iterator

    def spy(self):  # where torch starts forking the workers
        alive_at_fork.append([thread.is_alive() for thread in feeders])
        return torch_get_iterator(self)

    monkeypatch.setattr(DataLoader, "_get_iterator", spy)
    second = iter(loader)
    assert alive_at_fork == [[False] * len(feeders)]
    assert [b.tolist() for b in second][0] == [0, 1]
    loader.close()
