"""Keep freed heap memory in the process (glibc) instead of returning it to the kernel, where large
allocations (batches, decode buffers) would be ``mmap()``-ed and page-faulted in anew after every
free (what jemalloc or tcmalloc avoid too), and return it once per epoch
(docs/performance.md#host-memory-across-epochs)."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

# mallopt() parameters, glibc <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


@functools.lru_cache(maxsize=1)
def _glibc():
    """The C library if it is glibc, else None; loaded once."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # only glibc has it
    except (OSError, AttributeError):
        return None
    libc.malloc_trim.argtypes = [ctypes.c_size_t]  # the rest is int, as ctypes assumes
    return libc


def retain_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds to 1 GiB here and in processes forked later, so up
    to that much freed heap is kept for reuse. True if applied, False without glibc."""
    libc = _glibc()
    return (libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30))
            and bool(libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)))


def release_freed_memory() -> bool:
    """``malloc_trim(0)`` (every arena), once per epoch; True if any memory went back."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))
