"""What the native decoders print to descriptor 2 (libjpeg's ``Corrupt JPEG data: ...``, libpng's,
nvImageCodec's: naming no file), caught for the caller to name the file once; other output is
passed on. :func:`capture` (~5 us) points descriptor 2 at an anonymous file, one per process,
which concurrent captures share; a child forked during one gets descriptor 2 back."""
from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from typing import Callable, TypeVar

T = TypeVar("T")

# libjpeg's warnings (jerror.h, JWRN_*), libpng's, nvImageCodec's "[ERROR] [libjpeg_turbo_...]"
LIBRARY_LINE = re.compile(
    r"(Corrupt JPEG data|Premature end of JPEG file|Warning: |Invalid SOS parameters|"
    r"Inconsistent progression sequence|Application transferred too many scanlines|"
    r"Unsupported marker|libpng (warning|error)|\[(ERROR|WARNING|WARN)\] *\[[\w.]+\])")
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def is_library_line(line: str) -> bool:
    """Whether ``line`` (colour codes removed) is one a native decoder writes."""
    return LIBRARY_LINE.match(line) is not None


class _Sink:
    """Descriptor 2 at ``file`` while the ``running`` captures run (the real one: ``saved``),
    bytes up to ``forwarded`` passed on."""

    def __init__(self):
        self.cond = threading.Condition()
        self.running: set[capture] = set()
        self.forwarded = 0
        self.owner = 0  # the thread of the exclusive capture, if one runs
        self.file = self.saved = -1


_sink = _Sink()


def _after_fork() -> None:
    """In a forked child: descriptor 2 put back, and a sink of its own."""
    global _sink
    if _sink.running and _sink.saved >= 0:
        os.dup2(_sink.saved, 2)
    for fd in (_sink.saved, _sink.file):
        if fd >= 0:
            os.close(fd)
    _sink = _Sink()


os.register_at_fork(after_in_child=_after_fork)


class capture:
    """``with capture() as caught:`` catches what native code writes to descriptor 2 in the block.
    ``caught.lines``: the native decoders' lines (colour codes removed), set when the block ends or
    raises; ``caught.shared``: another thread's capture overlapped it (the lines may be its call's).
    ``exclusive``: wait until no other capture runs and let none start (nested in one of the same
    thread's, it is not exclusive). Catches nothing where descriptor 2 cannot be redirected."""

    def __init__(self, exclusive: bool = False):
        self.exclusive, self.shared, self.lines = exclusive, False, []
        self._sink: _Sink | None = None
        self._start = self._pid = self._thread = 0

    def __enter__(self) -> "capture":
        sink, me = _sink, threading.get_ident()
        with sink.cond:
            if self.exclusive:  # inside one of this thread's captures: nested, not exclusive
                self.exclusive = all(other._thread != me for other in sink.running)
            while sink.owner not in (0, me) or (self.exclusive and sink.running):
                sink.cond.wait()
            if not sink.running:  # descriptor 2 to the sink's file (made once per process)
                _flush()
                try:
                    if sink.file < 0:
                        sink.file = os.memfd_create("native-stderr", os.MFD_CLOEXEC)
                    sink.saved = os.dup(2)
                    os.dup2(sink.file, 2)
                except OSError:  # not redirectable here: catch nothing
                    return self
            for other in sink.running:  # each overlapping pair of threads' captures: shared
                if other._thread != me:
                    other.shared = self.shared = True
            sink.running.add(self)
            if self.exclusive:
                sink.owner = me
            self._sink, self._pid, self._thread = sink, os.getpid(), me
            self._start = os.lseek(sink.file, 0, os.SEEK_CUR)
        return self

    def take(self) -> list[str]:
        """The native decoders' lines since the block began or the last ``take`` (a capture held
        across many calls); other output is passed on now."""
        sink = self._sink
        if sink is None or self._pid != os.getpid():
            return []
        with sink.cond:
            return self._read(sink, final=False)

    def _read(self, sink: _Sink, final: bool) -> list[str]:
        """The native decoders' lines since ``_start`` (then moved to the end); the rest passed
        on (:func:`_forward`). Called holding ``sink.cond``."""
        end = os.lseek(sink.file, 0, os.SEEK_CUR)
        text = os.pread(sink.file, max(0, end - self._start), self._start)
        lines = (_COLOUR.sub("", piece.decode("utf-8", "replace")).strip()
                 for piece in text.splitlines())
        self._start = end
        _forward(sink, end, final)
        return [line for line in lines if line and is_library_line(line)]

    def __exit__(self, *exc) -> None:
        """Its lines read, the rest passed on, descriptor 2 put back by the last capture to end."""
        sink, self._sink = self._sink, None
        if sink is None or self._pid != os.getpid():  # none, or a child forked inside
            return
        _flush()
        with sink.cond:
            sink.running.discard(self)
            if self.exclusive:
                sink.owner = 0
            self.lines = self._read(sink, final=not sink.running)
            if not sink.running:
                os.dup2(sink.saved, 2)
                os.close(sink.saved)
                sink.saved = -1
                if self._start:  # the file's end, where _read left it
                    os.ftruncate(sink.file, 0)
                    os.lseek(sink.file, 0, os.SEEK_SET)
                sink.forwarded = 0
            sink.cond.notify_all()


def _flush() -> None:
    """Python's buffered standard error written out first."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        sys.stderr.flush()


def _forward(sink: _Sink, end: int, final: bool) -> None:
    """Pass on to descriptor 2 what no native decoder wrote (whole lines unless ``final``)."""
    if end <= sink.forwarded:
        return
    text = os.pread(sink.file, end - sink.forwarded, sink.forwarded)
    if not final:
        last = max(text.rfind(b"\n"), text.rfind(b"\r"))
        text = text[:last + 1]
    sink.forwarded += len(text)
    kept = b"".join(piece for piece in text.splitlines(keepends=True)
                    if not is_library_line(_COLOUR.sub("", piece.decode("utf-8", "replace"))))
    if kept:
        with contextlib.suppress(OSError):
            os.write(sink.saved, kept)


def run_captured(call: Callable[[], T]) -> tuple[T, list[str]]:
    """``(call(), the native decoders' lines it wrote)``; where another capture ran meanwhile,
    ``call`` repeats alone to tell its own. Raises what ``call`` raises."""
    with capture() as caught:
        result = call()
    if caught.lines and caught.shared:
        with capture(exclusive=True) as caught:
            call()
    return result, caught.lines


def say_now(line: str) -> None:
    """Write ``line`` to the real standard error at once, also during a capture (which passes
    other output on only when it ends: a stream's retry warning would come after the retries)."""
    _flush()
    sink = _sink
    with sink.cond:
        if sink.running and sink.saved >= 0:
            os.write(sink.saved, (line + "\n").encode("utf-8", "replace"))
            return
    print(line, file=sys.stderr, flush=True)


# What else lands in a class folder, by its first bytes (the formats' own specifications):
# AppleDouble/AppleSingle (RFC 1740), a Finder .DS_Store ("Bud1" after a 4-byte 1), Windows'
# Thumbs.db (an OLE2 compound file), archives (PKZIP, gzip RFC 1952), PDF.
_NOT_IMAGES = ((b"\x00\x05\x16\x07", "a macOS AppleDouble file (what Finder writes as ._NAME)"),
               (b"\x00\x05\x16\x00", "a macOS AppleSingle file"),
               (b"\x00\x00\x00\x01Bud1", "a macOS .DS_Store file"),
               (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "an OLE2 file (Windows' Thumbs.db)"),
               (b"PK\x03\x04", "a zip archive"), (b"\x1f\x8b", "a gzip file"),
               (b"%PDF", "a PDF document"))


def not_an_image(data: bytes) -> str:
    """One line naming bytes no decoder identified as an image, e.g. ``"not an image: starts with
    00 05 16 07, a macOS AppleDouble file (what Finder writes as ._NAME)"``."""
    if not data:
        return "not an image: an empty file"
    head = data[:512].lstrip()
    what = next((name for magic, name in _NOT_IMAGES if data.startswith(magic)), None)
    if what is None and head[:1] == b"<" and b"html" in head[:64].lower():
        what = "an HTML page"
    elif what is None and all(32 <= b < 127 or b in b"\t\r\n" for b in head):
        what = "text"
    return f"not an image: starts with {data[:4].hex(' ').upper()}" + (f", {what}" if what else "")
