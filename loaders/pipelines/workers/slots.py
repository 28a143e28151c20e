"""Batches written by the workers into reused shared-memory slots, not a new block each as torch's
collate (docs/performance.md). Releases are ``(pass, batch)`` tickets that only grow: a pass left
early never satisfies a later pass's wait."""
from __future__ import annotations

import contextlib
import errno
import math
import os
import time
from typing import Sequence

import torch

from ...errors import DataError
from ...timing import stages

# A worker that waits this long for its slot means the main process stopped releasing them.
_WAIT_LIMIT_S = 600.0
_POLL_S = 0.0005
_PARENT_CHECK_S = 1.0  # how often a waiting worker checks that the training process lives
_PASS_SHIFT = 32  # a release ticket is pass << 32 | batch number (batches per pass < 2**32)


def slots_for(workers: int, prefetch_factor: int) -> int:
    """Slots one loader needs: every batch DataLoader may have in flight, the one read, a spare."""
    return (prefetch_factor * workers if workers > 0 else 0) + 2


class SharedBatches:
    """``slots`` of uint8 ``images[s]`` ``(batch_size, 3, H, W)`` and int64 ``labels[s]``, in
    ``/dev/shm`` if ``shared``. Raises :class:`DataError` if it cannot hold them."""

    def __init__(self, slots: int, batch_size: int, image_shape: Sequence[int],
                 channels_last: bool = False, shared: bool = True,
                 max_image_shape: Sequence[int] | None = None):
        self.slots, self.batch_size, self.channels_last = slots, batch_size, channels_last
        self.capacity = batch_size * math.prod(max_image_shape or image_shape)
        memory = shared_bytes(slots * self.capacity) if shared else torch.empty(
            slots * self.capacity, dtype=torch.uint8)
        self.memory = memory.view(slots, self.capacity)
        self.labels = torch.zeros(slots, batch_size, dtype=torch.int64)
        # released[s]: the ticket of the last batch released from slot s
        self.released = torch.full((slots,), -1, dtype=torch.int64)
        self.owner = os.getpid()  # the training process: a worker waits only while it lives
        # Each image's and batch's stage figures, written with the pixels (loaders.timing.stages).
        self.stage_images = torch.zeros(slots, batch_size * stages.IMAGE_COLUMNS,
                                        dtype=torch.float64)
        self.stage_batches = torch.zeros(slots, stages.BATCH_COLUMNS, dtype=torch.float64)
        if shared:  # the node's last pages may be taken since the slots' reservation
            with _no_space_is_shortage(slots * self.capacity):
                for tensor in (self.labels, self.released, self.stage_images, self.stage_batches):
                    tensor.share_memory_()
        self.set_shape(image_shape)

    def set_shape(self, image_shape: Sequence[int]) -> None:
        """Serve ``image_shape`` ``(3, H, W)`` images from now on; ``ValueError`` above the max."""
        channels, height, width = image_shape
        size = self.batch_size * math.prod(image_shape)
        if size > self.capacity:
            raise ValueError(f"batch slots hold {self.capacity} bytes per batch, "
                             f"{tuple(image_shape)} images need {size}")
        memory = self.memory[:, :size]  # each slot's first bytes: no copy, no allocation
        if self.channels_last:
            images = memory.view(self.slots, self.batch_size, height, width, channels)
            self.images = images.permute(0, 1, 4, 2, 3)
        else:
            self.images = memory.view(self.slots, self.batch_size, channels, height, width)
        self.image_shape = tuple(image_shape)

    def acquire(self, number: int, pass_id: int = 0) -> int:
        """Worker side: batch ``number``'s slot once free. Raises :class:`DataError` after
        600 s, or about a second after the training process ended."""
        slot = number % self.slots
        if number < self.slots:  # the slot's first batch of the pass: nothing to wait for
            return slot
        needed = _ticket(pass_id, number - self.slots)
        now = time.monotonic()
        deadline, check = now + _WAIT_LIMIT_S, now + _PARENT_CHECK_S
        while int(self.released[slot]) < needed:
            now = time.monotonic()
            if now > deadline:
                raise DataError(f"loader worker waited {_WAIT_LIMIT_S:.0f} s for batch slot "
                                f"{slot}: the main process stopped reading batches")
            if now > check:
                check = now + _PARENT_CHECK_S
                if os.getpid() != self.owner and os.getppid() != self.owner:
                    raise DataError("loader worker: the training process is gone")
            time.sleep(_POLL_S)
        return slot

    def batch(self, slot: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of a slot, valid until :meth:`release`: uint8 ``(count, 3, H, W)``, int64."""
        return self.images[slot, :count], self.labels[slot, :count]

    def release(self, slot: int, number: int, pass_id: int = 0) -> None:
        """Main-process side: batch ``number`` of pass ``pass_id`` is out of ``slot``."""
        self.released[slot] = _ticket(pass_id, number)


def _ticket(pass_id: int, number: int) -> int:
    """Batch ``number`` of pass ``pass_id``'s ticket: larger for every later batch or pass."""
    return (pass_id << _PASS_SHIFT) | number


SHM = "/dev/shm"


def shared_bytes(nbytes: int) -> torch.Tensor:
    """A uint8 ``(nbytes,)`` tensor in shared memory, every page reserved now: tmpfs takes pages
    when written, and the writer past its size dies of SIGBUS. Raises :class:`DataError`."""
    _check_shm_space(nbytes)  # the clear message early, before anything is allocated
    with _no_space_is_shortage(nbytes):  # torch reserves too (posix_fallocate where built with)
        storage = torch.UntypedStorage._new_shared(nbytes)  # as torch's default_collate
    try:
        _reserve(storage, nbytes)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.ENOMEM):
            raise DataError(_shortage(nbytes)) from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENODEV, errno.ENOENT):
            raise
        # a file system that cannot reserve (or no /dev/shm): pages are taken as written
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (nbytes,), (1,))


@contextlib.contextmanager
def _no_space_is_shortage(nbytes: int):
    """torch's error for a shared-memory object the file system has no room for (ENOSPC) turned
    into :func:`_shortage`'s :class:`DataError`; other errors pass."""
    try:
        yield
    except RuntimeError as exc:
        if "No space left" not in str(exc) and "(28)" not in str(exc):
            raise
        raise DataError(_shortage(nbytes)) from None


def _reserve(storage: torch.UntypedStorage, nbytes: int) -> None:
    """``posix_fallocate`` the shared-memory object behind ``storage``; raises ``OSError``."""
    if not hasattr(os, "posix_fallocate"):
        raise OSError(errno.EOPNOTSUPP, "no posix_fallocate")
    if torch.multiprocessing.get_sharing_strategy() == "file_system":
        _, name, _ = storage._share_filename_cpu_()
        name = name.decode() if isinstance(name, bytes) else name
        fd = os.open(os.path.join(SHM, name.lstrip("/")), os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, nbytes)
        finally:
            os.close(fd)
    else:
        fd, _ = storage._share_fd_cpu_()  # torch's own descriptor: not ours to close
        os.posix_fallocate(fd, 0, nbytes)


def _check_shm_space(nbytes: int, path: str = SHM) -> None:
    try:
        stat = os.statvfs(path)
    except OSError:
        return  # no /dev/shm (not Linux): torch picks its own sharing strategy
    if nbytes > stat.f_bavail * stat.f_frsize:
        raise DataError(_shortage(nbytes, path))


def _shortage(nbytes: int, path: str = SHM) -> str:
    """The one line for too little shared memory: needed, free now (node-wide), the fixes."""
    try:
        stat = os.statvfs(path)
        free = f"{_mib(stat.f_bavail * stat.f_frsize)} free now"
    except OSError:
        free = "free space unknown"
    return (f"{path}: cannot reserve {_mib(nbytes)} for this process's batch slots ({free}, "
            "shared by every loader of every process on this node): give the container more "
            "shared memory (docker run --shm-size=... or --ipc=host), or lower -j/--workers "
            "or -b/--batch-size")


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.{1 if nbytes < 10 * 2**20 else 0}f} MiB"
