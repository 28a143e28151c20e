"""Where shards are and how they are opened, for the shard readers and ``folder2shards.py
--index``: a split (a folder or folder URL holding ``index.json``, a brace pattern, or one shard as
a path, ``http(s)://`` URL or ``pipe:`` command) resolved to its index and shard locations; streams
opened and retried (:class:`Retries`). Errors: one :class:`DataError` line naming the location."""
from __future__ import annotations

import io
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, replace

from decode.messages import say_now

from ..errors import DataError
from ._codec import INDEX_NAME, ShardFormatError, ShardIndex, idx_name

HTTP_TIMEOUT_S = 60.0  # a stalled server fails the read instead of hanging the run
STREAM_BUFFER = 1 << 20  # bytes read ahead from a stream


class StreamError(DataError):
    """A stream's open or read failed in transport (connection, timeout, retryable HTTP status,
    failed ``pipe:``, early end): :class:`Retries` tries again. One line."""


_PARENT_CHECK_S = 0.5  # how often a backoff's sleep checks that its parent process lives
# HTTP statuses that say "not now" rather than "never" (curl --retry's transient list)
_TRANSIENT_HTTP = (408, 429, 500, 502, 503, 504)


@dataclass(frozen=True)
class Retries:
    """Retries of a streamed shard: ``retries`` more tries (``--shard-retries``), try ``k + 1``
    after ``delay * 2**(k - 1)`` s (``--shard-retry-delay``; as curl's ``--retry``); a try that
    reads a record resets the count."""

    retries: int = 2
    delay: float = 10.0

    def pause(self, error: StreamError, failures: int) -> None:
        """Warn and sleep the backoff after the ``failures``-th failure in a row; raises
        :class:`DataError` when no try is left or the parent process is gone."""
        def given_up(waited: float) -> DataError:
            return DataError(f"{error}; {failures} {'try' if failures == 1 else 'tries'} over "
                             f"{waited:.3g} s (--shard-retries {self.retries}, "
                             f"--shard-retry-delay {self.delay:g})")

        waited = sum(self.delay * 2 ** (k - 1) for k in range(1, min(failures, self.retries + 1)))
        if failures > self.retries:
            raise given_up(waited) from None
        wait = self.delay * 2 ** (failures - 1)
        say_now(f"warning: {error}; try {failures + 1} of {self.retries + 1} in {wait:g} s")
        parent, end = os.getppid(), time.monotonic() + wait
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, _PARENT_CHECK_S))
            if os.getppid() != parent:
                raise given_up(waited + wait - max(0.0, left)) from None


def is_stream(location: str) -> bool:
    """True for ``http(s)://`` and ``pipe:`` locations (read front to back)."""
    return location.startswith(("http://", "https://", "pipe:"))


def open_stream(url: str):
    """A binary stream of ``url``: HTTP(S) with a timeout, ``pipe:CMD``'s stdout, a file. Raises
    :class:`StreamError` (transient HTTP) or :class:`DataError`."""
    try:
        # tarfile's stream mode reads 10 KiB at a time: a 1 MiB buffer halves its parse cost
        if url.startswith(("http://", "https://")):
            return io.BufferedReader(urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S),
                                     STREAM_BUFFER)
        if url.startswith("pipe:"):
            from webdataset.gopen import gopen

            return gopen(url, "rb", bufsize=STREAM_BUFFER)
        return open(url, "rb", buffering=STREAM_BUFFER)
    except (OSError, ValueError) as exc:
        why = f"{url}: cannot open ({getattr(exc, 'reason', None) or exc})"
        # final: a local file, a bad command line, a 404; may pass: a transport error, a 503
        transient = exc.code in _TRANSIENT_HTTP if isinstance(exc, urllib.error.HTTPError) else \
            isinstance(exc, OSError)
        if url.startswith("pipe:") or not is_stream(url) or not transient:
            raise DataError(why) from None
        raise StreamError(why) from None


def read_text(url: str) -> str:
    """The whole text at ``url``. Raises :class:`DataError`."""
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
    """``url`` with its last ``old`` replaced by ``new``."""
    return new.join(url.rsplit(old, 1))


def resolve_split(spec: str) -> tuple[ShardIndex, list[str]]:
    """``(index, shard urls)`` of a split: a folder (URL) with ``index.json``, or shards whose
    folder has it. Raises :class:`DataError`."""
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
    # the shards named, in their order; class names, cap and raw fields as the index has them
    return replace(index, shards=[listed[n] for n in names]), urls


def _location(folder: str, shard: dict) -> str:
    """Where a shard of ``folder``'s index lives: beside it, or at its ``url`` (a URL, an absolute
    path, or relative to ``folder``)."""
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
