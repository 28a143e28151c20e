"""WebDataset tar shards (``--loader shards``) on a file system, over HTTP(S) or from a command
(``pipe:aws s3 cp s3://... -``), read map-style (exact, equal epochs), unlike ``webdataset``'s."""
from __future__ import annotations

import bisect
import itertools
import os
import threading
from collections import OrderedDict

import numpy as np

from formats.shards import INDEX_NAME, ShardFormatError, ShardIndex, idx_name, read_idx
from formats.shards.locations import (Retries, StreamError, is_stream, open_stream, read_text,
                                      resolve_split, sibling)

from ..errors import DataError
from ..orders.streams import StreamTrainOrder, StreamValOrder
from ..settings import DistInfo, LoaderSettings
from . import Reader

SHUFFLE_BUFFER = 1000  # records; WebDataset's ImageNet examples use 1,000-5,000


class ShardReader(Reader):
    """A split's shards: local ones by ``pread`` at their ``.idx`` offsets, streams front to back
    (4 x ``SHUFFLE_BUFFER`` records read ahead, retried as ``retries`` says). Raises
    :class:`DataError` for a missing, truncated or malformed shard or a stream failing each try."""

    def __init__(self, index: ShardIndex, urls: list[str], retries: Retries = Retries()):
        self.index, self.urls, self.retries = index, urls, retries
        self.classes = list(index.classes)
        self.counts = [s["records"] for s in index.shards]
        self.starts = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64).tolist()
        self.streaming = any(is_stream(u) for u in urls)
        self.random_access = not self.streaming
        self._order = self._followed = None  # plan_pass's order, the pass follow took
        self.spans = None if self.streaming else self._local_spans()
        self._files: OrderedDict[int, int] = OrderedDict()
        self._files_lock = threading.Lock()  # DALI's feeds read from several threads
        self.set_plan([[(0, len(self))]])  # one reader, front to back, until a pass says

    def _local_spans(self) -> np.ndarray:
        spans = []
        for url, shard in zip(self.urls, self.index.shards):
            if not os.path.isfile(url):
                raise DataError(f"shard {url}: missing")
            idx = shard.get("idx") or idx_name(url)
            try:
                with open(idx) as f:
                    rows = read_idx(f.read(), idx)
            except OSError:
                raise DataError(f"shard {url}: no DALI index {idx} (rerun folder2shards.py)")
            except ShardFormatError as exc:
                raise DataError(str(exc)) from None
            if len(rows) != shard["records"]:
                raise DataError(f"shard {url}: {len(rows)} records in its .idx, "
                                f"{INDEX_NAME} says {shard['records']}")
            end = max((r[2] + r[3] for r in rows), default=0)
            if os.path.getsize(url) < end:
                raise DataError(f"shard {url}: truncated ({os.path.getsize(url)} bytes, its "
                                f"records end at {end})")
            spans.append(np.asarray(rows, dtype=np.int64).reshape(-1, 4))
        return np.concatenate(spans)

    def __len__(self) -> int:
        return self.starts[-1]

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard number, record position in it)`` of record ``index``."""
        if not 0 <= index < len(self):
            raise IndexError(f"record {index} out of range 0..{len(self) - 1}")
        shard = bisect.bisect_right(self.starts, index) - 1
        return shard, index - self.starts[shard]

    def name_of(self, index: int) -> str:
        shard, pos = self.locate(index)
        return f"{self.urls[shard]} record {pos}"

    def read(self, index: int) -> tuple[bytes, int]:
        if self.streaming:
            return self._read_stream(index)
        shard, _ = self.locate(index)
        image_at, image_size, label_at, label_size = self.spans[index].tolist()
        with self._files_lock:  # no thread closes an fd (the cache below) another reads
            fd = self._fd(shard)
            # two reads, not the record's span sliced: the image's bytes are copied once
            image, label = os.pread(fd, image_size, image_at), os.pread(fd, label_size, label_at)
        return image, _label(label, self.urls[shard])

    def _fd(self, shard: int) -> int:
        fd = self._files.get(shard)
        if fd is None:
            if len(self._files) >= 16:  # a worker reads few shards at a time
                os.close(self._files.popitem(last=False)[1])
            fd = self._files[shard] = os.open(self.urls[shard], os.O_RDONLY)
        self._files.move_to_end(shard)
        return fd

    def set_plan(self, pieces: list[list[tuple[int, int]]], remaining=None) -> None:
        """This pass's plan: each worker's record ranges, read once front to back; a resumed
        pass's ``remaining`` indices start each stream at its first still needed."""
        self._plan = sorted((start, stop, p, r) for p, runs in enumerate(pieces)
                            for r, (start, stop) in enumerate(runs))
        self._pieces = pieces
        # reading position of each run's first record within its piece
        self._offsets = [np.cumsum([0] + [b - a for a, b in runs]).tolist() for runs in pieces]
        self._first = [0] * len(pieces)
        if remaining is not None:
            self._first = [offsets[-1] for offsets in self._offsets]
            for index in remaining:
                piece, _, position = self._where(index)
                self._first[piece] = min(self._first[piece], position)
        self._stream, self._ahead = None, {}

    def _where(self, index: int) -> tuple[int, int, int]:
        """``(piece, run, reading position in the piece)`` of record ``index``."""
        at = bisect.bisect_right(self._plan, (index, float("inf"))) - 1
        if at >= 0 and self._plan[at][0] <= index < self._plan[at][1]:
            start, _, piece, run = self._plan[at]
            return piece, run, self._offsets[piece][run] + index - start
        raise IndexError(f"record {index} is not in this pass's reading plan")

    def _read_stream(self, index: int) -> tuple[bytes, int]:
        if index in self._ahead:
            return self._ahead.pop(index)
        piece, run, position = self._where(index)
        if self._stream is None or self._stream[0] != piece or position < self._stream[1]:
            first = self._first[piece]
            start = first if 0 <= first <= position else position
            self._first[piece] = -1  # a restart reads from `position`: the rest is in _ahead
            self._stream = [piece, start, self._piece_records(piece, start)]
        for at, record in self._stream[2]:
            self._stream[1] += 1
            if at == index:
                return record
            self._ahead[at] = record
            if len(self._ahead) > 4 * SHUFFLE_BUFFER:  # oldest first: read again if needed
                self._ahead.pop(next(iter(self._ahead)))
        raise IndexError(f"record {index} not found in its reading plan")

    def _piece_records(self, piece: int, position: int):
        """``(index, record)`` of ``piece``'s records from reading position ``position`` on, each
        shard opened once per run."""
        offsets = self._offsets[piece]
        run = bisect.bisect_right(offsets, position) - 1
        runs = list(self._pieces[piece][run:])
        runs[0] = (runs[0][0] + position - offsets[run], runs[0][1])
        for start, stop in runs:
            while start < stop:
                shard, pos = self.locate(start)
                end = min(stop, self.starts[shard + 1])
                records = self._records(shard)
                yield from zip(range(start, end), itertools.islice(records, pos, None))
                records.close()
                start = end

    def _records(self, shard: int):
        """The shard's ``(jpeg_bytes, label)`` records, retried past those given; DataError, also
        where it ends short of its count."""
        spans = self._stream_spans(shard)
        done = failures = 0
        while True:
            try:
                for record in _opened_records(self.urls[shard], spans, done):
                    done, failures = done + 1, 0
                    yield record
                break
            except StreamError as exc:
                failures += 1
                self.retries.pause(exc, failures)  # raises DataError past the last try
        if done < self.counts[shard]:
            raise DataError(f"shard {self.urls[shard]}: ended after {done} records, "
                            f"{INDEX_NAME} says {self.counts[shard]}")

    def _stream_spans(self, shard: int) -> list | None:
        """The shard's served ``.idx`` rows, if any: ~2 us per record, tar parsing ~57 us."""
        url, name = self.urls[shard], self.index.shards[shard]["name"]
        idx = self.index.shards[shard].get("idx") or sibling(url, name, idx_name(name))
        if idx.startswith("pipe:"):
            idx += " 2>/dev/null"  # a probe: the command's complaint about no .idx is noise
        try:
            rows = read_idx(read_text(idx), name)
        except Exception:  # noqa: BLE001 - none served, or not ours: parse the tar instead
            return None
        return rows if len(rows) == self.counts[shard] else None

    def train_order(self, settings: LoaderSettings, dist: DistInfo) -> StreamTrainOrder:
        """:class:`~loaders.orders.StreamTrainOrder` (``SHUFFLE_BUFFER`` records), one piece per
        ``settings.workers``, for every pipeline. Raises :class:`DataError` for ``--ra-sampler``."""
        if settings.ra_sampler and dist.distributed:
            raise DataError("--ra-sampler needs random access: not with --loader shards")
        # an epoch smaller than one batch per rank is one smaller batch (train_batch_size)
        batch = max(1, min(settings.batch_size, len(self) // dist.world_size))
        return StreamTrainOrder(self.counts, batch, settings.workers, dist.rank, dist.world_size,
                                settings.seed, SHUFFLE_BUFFER)

    def val_order(self, settings: LoaderSettings, dist: DistInfo) -> StreamValOrder:
        return StreamValOrder(len(self), settings.batch_size, settings.workers, dist.rank,
                              dist.world_size)

    def plan_pass(self, order, epoch: int, remaining: list[int] | None) -> tuple:
        """:meth:`set_plan` of ``order.pieces(epoch)``; ``(epoch, first positions)``."""
        self._order = order
        self.set_plan(order.pieces(epoch), remaining)
        return epoch, tuple(self._first)

    def follow(self, reading: tuple) -> None:
        """In a kept worker: the pass ``(number, *plan_pass's)`` planned, unless it is in hand."""
        if reading != self._followed:
            self.set_plan(self._order.pieces(reading[1]))
            self._first, self._followed = list(reading[2]), reading

    def __getstate__(self):
        return {**self.__dict__, "_files": OrderedDict(), "_stream": None, "_ahead": {},
                "_files_lock": None}  # a lock does not pickle: __setstate__ makes one

    def __setstate__(self, state):
        self.__dict__.update(state, _files_lock=threading.Lock())


def _opened_records(url: str, spans, skip: int):
    """The shard's records from its ``skip``-th on, cut at the ``.idx`` ``spans`` (or by the tar
    iterator). Raises :class:`StreamError` for a failed open or read, :class:`DataError`."""
    stream = open_stream(url)  # StreamError (DataError if final) if it cannot
    error = StreamError if is_stream(url) else DataError
    ended = False
    try:
        yield from (_cut_at_offsets(stream, spans, url, skip) if spans is not None
                    else itertools.islice(_tar_records(stream, url), skip, None))
        ended = True
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - tarfile/transport errors: one line
        raise error(f"shard {url}: unreadable tar ({str(exc).splitlines()[0]})") from None
    finally:
        try:
            stream.close()  # a pipe: command's exit status is checked here
        except Exception as exc:  # noqa: BLE001 - after an error or an early stop: moot
            if ended:
                raise error(f"shard {url}: {str(exc).splitlines()[0]}") from None


def _cut_at_offsets(stream, spans, url: str, first: int = 0):
    """``(jpeg_bytes, label)`` per ``.idx`` row from row ``first`` on, reading the tar once (what
    lies between the members skipped)."""
    at, error = 0, StreamError if is_stream(url) else DataError
    for number, (image_at, image_size, label_at, label_size) in enumerate(spans[first:], first):
        parts = {}
        for offset, size in sorted([(image_at, image_size), (label_at, label_size)]):
            while at < offset and (skipped := len(stream.read(min(offset - at, 1 << 20)))):
                at += skipped
            parts[offset] = stream.read(size) if at == offset else b""
            if len(parts[offset]) != size:  # a cut connection, or a short file
                raise error(f"shard {url}: ended after {number} records (truncated?)")
            at = offset + size
        yield parts[image_at], _label(parts[label_at], url)


def _tar_records(stream, url: str):
    from webdataset.tariterators import group_by_keys, tar_file_iterator

    members = ({**m, "__url__": url} for m in tar_file_iterator(stream))
    for sample in group_by_keys(members):
        image = sample.get("jpg", sample.get("ppm"))  # ppm: a raw record (decode.raw)
        if image is None or "cls" not in sample:
            raise DataError(f"shard {url}: record {sample['__key__']} lacks a .jpg or .cls")
        yield image, _label(sample["cls"], url)


def _label(data: bytes, url: str) -> int:
    digits = data.split(b"\0", 1)[0].strip()
    if not digits.isdigit():
        raise DataError(f"shard {url}: a .cls member that is not a class number")
    return int(digits)


def open_reader(path: str, settings: LoaderSettings | None) -> ShardReader:
    """This source's entry of ``loaders.readers.READERS`` (``settings`` None: default retries)."""
    retries = Retries() if settings is None else Retries(settings.shard_retries,
                                                          settings.shard_retry_delay)
    return ShardReader(*resolve_split(path), retries=retries)
