"""Where shards are and how they are opened, for the shard readers (``loaders``) and
``folder2shards.py --index``: a split given as a folder or folder URL holding ``index.json``, a
brace pattern or a single shard (local path, ``http(s)://`` or ``pipe:`` command), resolved to
its index and the shards' locations; streams opened with a timeout (HTTP), through
``webdataset.gopen`` (``pipe:``) or as local files; how a failed open or read of a stream is
tried again (:class:`Retries`). Errors are one :class:`DataError` line naming the location
(:class:`StreamError` for a stream's transport failures, which may pass)."""
from __future__ import annotations

import io
import os
import re
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from ..errors import DataError
from ._codec import INDEX_NAME, ShardFormatError, ShardIndex, idx_name

HTTP_TIMEOUT_S = 60.0  # a stalled server fails the read instead of hanging the run
STREAM_BUFFER = 1 << 20  # bytes read ahead from a stream


class StreamError(DataError):
    """A stream's open or read failed in transport (connection refused or reset, a timeout,
    an HTTP status worth retrying, a ``pipe:`` command that failed, a stream that ended
    early): it may pass, so :class:`Retries` tries it again. One line naming the location."""


_PARENT_CHECK_S = 0.5  # how often a backoff's sleep checks that its parent process lives
# HTTP statuses that say "not now" rather than "never" (curl --retry's transient list)
_TRANSIENT_HTTP = (408, 429, 500, 502, 503, 504)


@dataclass(frozen=True)
class Retries:
    """How a failed open or read of a streamed shard (HTTP, ``pipe:``) is tried again:
    ``retries`` more tries after the first (``--shard-retries``), try ``k + 1`` after
    ``delay * 2**(k - 1)`` seconds (``--shard-retry-delay``; exponential backoff, as curl's
    ``--retry`` and urllib3's ``Retry``). Defaults: 2 retries after 10 and 20 s, 3 tries over
    30 s. A try that reads a record before it fails starts the count again."""

    retries: int = 2
    delay: float = 10.0

    def wait(self, failures: int) -> float | None:
        """Seconds to wait after the ``failures``-th failure in a row (from 1) before the next
        try, or None when no try is left."""
        return None if failures > self.retries else self.delay * 2 ** (failures - 1)

    def given_up(self, error: StreamError, failures: int, waited: float) -> DataError:
        """The one-line error after ``failures`` failed tries that waited ``waited`` s."""
        return DataError(f"{error}; {failures} {'try' if failures == 1 else 'tries'} over "
                         f"{waited:.3g} s (--shard-retries {self.retries}, "
                         f"--shard-retry-delay {self.delay:g})")

    def pause(self, error: StreamError, failures: int) -> float:
        """After the ``failures``-th failure in a row: say so on stderr, sleep the backoff and
        return it; raises :meth:`given_up`'s error (with the seconds waited) when no try is
        left, or as soon as this process's parent is gone (a loader worker whose training
        process ended does not wait out the backoff)."""
        waited = sum(self.wait(k) for k in range(1, failures))
        wait = self.wait(failures)
        if wait is None:
            raise self.given_up(error, failures, waited) from None
        print(f"warning: {error}; try {failures + 1} of {self.retries + 1} in {wait:g} s",
              file=sys.stderr, flush=True)
        parent, end = os.getppid(), time.monotonic() + wait
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, _PARENT_CHECK_S))
            if os.getppid() != parent:
                raise self.given_up(error, failures, waited + wait - max(0.0, left)) from None
        return wait


def is_stream(location: str) -> bool:
    """True for ``http(s)://`` and ``pipe:`` locations (read sequentially), False for paths."""
    return location.startswith(("http://", "https://", "pipe:"))


def open_stream(url: str):
    """A readable binary stream of ``url``: HTTP(S) with a timeout, ``pipe:CMD`` through
    ``webdataset.gopen`` (the command's stdout), else a local file. Raises :class:`DataError`
    naming ``url`` if it cannot be opened."""
    try:
        # Buffered: tarfile's stream mode reads 10 KiB at a time; a 1 MiB buffer halves the
        # cost of parsing a streamed shard (17 k -> 35 k tar members/s over loopback HTTP).
        if url.startswith(("http://", "https://")):
            return io.BufferedReader(urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S),
                                     STREAM_BUFFER)
        if url.startswith("pipe:"):
            from webdataset.gopen import gopen

            return gopen(url, "rb", bufsize=STREAM_BUFFER)
        return open(url, "rb", buffering=STREAM_BUFFER)
    except (OSError, ValueError) as exc:
        why = f"{url}: cannot open ({getattr(exc, 'reason', None) or exc})"
        if url.startswith("pipe:") or not is_stream(url) or not _transient(exc):
            raise DataError(why) from None  # a local file, a bad command line, a 404: final
        raise StreamError(why) from None


def _transient(exc: Exception) -> bool:
    """Whether an HTTP open's failure may pass: a transport error or a retryable status."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code in _TRANSIENT_HTTP
    return isinstance(exc, OSError)


def read_text(url: str) -> str:
    """The whole text at ``url`` (see :func:`open_stream`). Raises :class:`DataError`."""
    stream = open_stream(url)
    try:
        data = stream.read()
        stream.close()  # a pipe: command's exit status is checked here
    except Exception as exc:  # noqa: BLE001 - any transport failure is one line
        status = re.search(r"exit (\d+)", str(exc)) if url.startswith("pipe:") else None
        why = f"the command exited with status {status[1]}" if status else str(exc).splitlines()[0]
        raise DataError(f"{url}: read failed ({why})") from None
    if url.startswith("pipe:") and not data:
        raise DataError(f"{url}: the command printed nothing")
    return data.decode()


def sibling(url: str, old: str, new: str) -> str:
    """``url`` with its last occurrence of ``old`` replaced by ``new``."""
    at = url.rfind(old)
    return url[:at] + new + url[at + len(old):]


def resolve_split(spec: str) -> tuple[ShardIndex, list[str]]:
    """``(index, shard urls)`` of one split given as a folder / folder URL holding
    ``index.json``, or as a brace pattern or single shard (local path, URL or ``pipe:``) whose
    directory holds it. Raises :class:`DataError` for a missing or bad index, or a shard the
    index does not list."""
    from braceexpand import braceexpand

    folder = spec.rstrip("/") if not spec.startswith("pipe:") else None
    if folder and (os.path.isdir(folder) or (is_stream(folder) and not folder.endswith(".tar"))):
        index = _load_index(f"{folder}/{INDEX_NAME}", spec)
        for shard in index.shards:
            if "url" in shard:  # indexed elsewhere (folder2shards.py --index): .idx beside us
                shard["idx"] = f"{folder}/{idx_name(shard['name'])}"
        return index, [_location(folder, s) for s in index.shards]
    urls = list(braceexpand(spec))
    names = [_shard_file(u) for u in urls]
    if not all(n.endswith(".tar") for n in names):
        raise DataError(f"{spec}: neither a folder with {INDEX_NAME} nor .tar shards")
    index = _load_index(sibling(urls[0], names[0], INDEX_NAME), spec)
    listed = {s["name"]: s for s in index.shards}
    missing = [n for n in names if n not in listed]
    if missing:
        raise DataError(f"{spec}: {missing[0]} is not in its {INDEX_NAME}")
    return ShardIndex(index.classes, [listed[n] for n in names], index.seed, index.rules), urls


def _location(folder: str, shard: dict) -> str:
    """Where a shard listed in ``folder``'s index lives: beside it, or at its ``url`` (a URL, an
    absolute path, or a path relative to ``folder``)."""
    url = shard.get("url")
    if url is None:
        return f"{folder}/{shard['name']}"
    return url if is_stream(url) or os.path.isabs(url) else f"{folder}/{url}"


def _shard_file(url: str) -> str:
    """The shard's file name in a path, URL or ``pipe:`` command (its last ``*.tar`` word)."""
    if url.startswith("pipe:"):
        words = [w for w in url[5:].split() if w.endswith(".tar")]
        url = words[-1] if words else url
    return os.path.basename(url)


def _load_index(url: str, spec: str) -> ShardIndex:
    if not is_stream(url) and not os.path.isfile(url):
        what = "no such folder" if not os.path.exists(os.path.dirname(url) or ".") else \
            f"no {INDEX_NAME} (an unfinished conversion, or not made by folder2shards.py)"
        raise DataError(f"{spec}: {what}")
    try:
        return ShardIndex.from_json(read_text(url), url)
    except ShardFormatError as exc:
        raise DataError(str(exc)) from None
