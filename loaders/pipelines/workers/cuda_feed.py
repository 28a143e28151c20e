"""Feeding a GPU from page-locked batch slots (else ``pin_memory()`` copies 38 MB per batch at
``-b 256``, 224 px), batch ``k + 1`` on a side stream during step ``k`` (timm's)."""
from __future__ import annotations

import contextlib
import weakref
from typing import Iterable, Iterator

import torch

from ...transforms.normalize import normalize_into
from ..batches import hand_over

# cudaHostRegisterDefault: a process copies its slots to its one device, and under unified
# virtual addressing (every 64-bit Linux build) CUDA documents Default memory as portable too.
_REGISTER_DEFAULT = 0


def page_lock(tensors: Iterable[torch.Tensor], owner: object) -> bool:
    """Page-lock ``tensors``' storages (``cudaHostRegister``) while ``owner`` lives; False, none
    registered, where CUDA refuses (a locked-memory limit). Needs an initialised CUDA device."""
    cudart = torch.cuda.cudart()
    done: list[int] = []
    for tensor in tensors:
        storage = tensor.untyped_storage()
        status = int(cudart.cudaHostRegister(storage.data_ptr(), storage.nbytes(),
                                             _REGISTER_DEFAULT))
        if status != 0:
            _unregister(done)
            _clear_cuda_error()
            return False
        done.append(storage.data_ptr())
    weakref.finalize(owner, _unregister, done)
    return True


def _unregister(pointers: list[int]) -> None:
    cudart = torch.cuda.cudart()
    for pointer in pointers:
        cudart.cudaHostUnregister(pointer)  # a failure at exit is harmless: memory is freed next


def _clear_cuda_error() -> None:
    # A failed cudaHostRegister leaves its error as CUDA's "last error", which torch would
    # report at its next kernel launch check as if that kernel had failed: consume it there.
    with contextlib.suppress(RuntimeError):
        torch.zeros(1, device="cuda").add_(1)


class CudaFeeder:
    """:meth:`batches`: ``(number, slot, count)`` of each written slot -> ``dtype`` ``(count, 3,
    H, W)`` images ``(x - mean) / std`` (float32 ``(1, 3, 1, 1)``, 0-255) and int64 labels on
    ``device``, a slot released once copied or staged. ``timing``: a ``StageLog``, or None."""

    def __init__(self, device: torch.device, dtype: torch.dtype, channels_last: bool,
                 mean: torch.Tensor, std: torch.Tensor, timing=None):
        self.device, self.dtype, self.channels_last = device, dtype, channels_last
        self.timing = timing
        self.scale, self.shift = 1 / std, -mean / std  # queued on the current stream
        self.stream = torch.cuda.Stream(device)
        # the side stream must not read scale/shift before the current stream wrote them
        self.stream.wait_stream(torch.cuda.current_stream(device))

    def batches(self, pool, filled: Iterable[tuple[int, int, int]], locked: bool,
                pass_id: int = 0, erase=None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """See the class; ``erase(images, number)``, if given, erases on the side stream."""
        def release(copied: torch.cuda.Event, slot: int | None, number: int) -> None:
            if slot is not None:
                copied.synchronize()  # issued a step ago, so normally already done
                pool.release(slot, number, pass_id)

        current = None
        try:
            for number, slot, count in filled:
                upcoming = self._upload(pool, number, slot, count, locked, pass_id, erase)
                if current is not None:
                    yield current[:2]
                    release(*current[2:])
                # The model's next step waits for the upload (queued once it took this batch)
                hand_over(upcoming[:2], self.stream.record_event(), self.device)
                current = upcoming
            if current is not None:
                yield current[:2]
                release(*current[2:])
        finally:
            # a pass left early may still be copying from a slot the next pass's workers refill
            self.stream.synchronize()

    def _upload(self, pool, number: int, slot: int, count: int, locked: bool, pass_id: int,
                erase=None):
        """Start copying ``slot`` on the side stream: ``(images, labels, copied, slot or None,
        number)``."""
        images, labels = pool.batch(slot, count)
        timed = self.timing is not None
        with torch.cuda.stream(self.stream):
            if timed:
                started = self.stream.record_event(torch.cuda.Event(enable_timing=True))
            if not locked:
                images, labels = images.pin_memory(), labels.pin_memory()
                pool.release(slot, number, pass_id)  # staged: the workers may refill it
                slot = None
            gpu_images = images.to(self.device, non_blocking=True)
            gpu_labels = labels.to(self.device, non_blocking=True)
            copied = self.stream.record_event()
            out = normalize_into(gpu_images, self.scale, self.shift, self.dtype,
                                 self.channels_last)
            if erase is not None:  # on the side stream, as the normalisation
                out = erase(out, number)
            if timed:
                ended = self.stream.record_event(torch.cuda.Event(enable_timing=True))
                self.timing.add_copy(events=(started, ended))
        return out, gpu_labels, copied, slot, number
