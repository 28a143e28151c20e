"""Indexing an uncompressed tar in place: the byte offset of each member's data in the file, so a
member is one ``pread`` and a tar inside a tar (ImageNet's train archive) needs no extraction.
POSIX, GNU and pax headers, as ``tarfile`` reads them."""
from __future__ import annotations

import io
import os
import tarfile

from ._listing import DatasetError

_BLOCK = tarfile.BLOCKSIZE


class _Window(io.RawIOBase):
    """``size`` bytes of ``fd`` from ``start`` as a seekable file read by ``pread``."""

    def __init__(self, fd: int, start: int, size: int):
        super().__init__()
        self.fd, self.start, self.size, self.pos = fd, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos + (self.pos if whence == 1 else self.size if whence == 2 else 0)
        return self.pos

    def readinto(self, buffer) -> int:
        count = max(0, min(len(buffer), self.size - self.pos))
        data = os.pread(self.fd, count, self.start + self.pos) if count else b""
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)


def _name(info: tarfile.TarInfo) -> str:
    return info.name[2:] if info.name.startswith("./") else info.name


_ZERO = bytes(_BLOCK)
_PLAIN = frozenset(b"\x0001234567")  # POSIX types: files, links, devices, folders, FIFOs
_REGULAR = frozenset(b"\x0007")


def _fast_members(fd: int, start: int, size: int,
                  label: str) -> tuple[list[tuple[str, int, int]], int] | None:
    """``(members, end)`` from plain POSIX/GNU headers (~5 us a member, ``tarfile`` ~40 us); None
    for any other kind."""
    members, pos = [], 0
    while pos + _BLOCK <= size:
        header = os.pread(fd, _BLOCK, start + pos)
        if header == _ZERO:
            return members, pos
        if header[156] not in _PLAIN or header[124] & 0x80:
            return None
        try:
            checksum = int(header[148:156].split(b"\0", 1)[0].strip() or b"0", 8)
            length = int(header[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
        except ValueError:
            return None
        if checksum != sum(header) - sum(header[148:156]) + 8 * 32:
            return None
        name = header[:100].split(b"\0", 1)[0]
        if header[257:263] == b"ustar\0" and header[345] != 0:  # POSIX name prefix
            name = header[345:500].split(b"\0", 1)[0] + b"/" + name
        name = os.fsdecode(name[2:] if name.startswith(b"./") else name)
        if pos + _BLOCK + length > size:
            raise DatasetError(f"{label}: truncated (ends inside {name}, "
                               f"{size - pos - _BLOCK} of {length} bytes)")
        if header[156] in _REGULAR:
            members.append((name, start + pos + _BLOCK, length))
        pos += _BLOCK + -(-length // _BLOCK) * _BLOCK
    return members, pos


def tar_members(path: str, start: int = 0, size: int | None = None,
                what: str | None = None) -> list[tuple[str, int, int]]:
    """``(name, data offset, size)`` of the regular files of the tar at ``start`` in ``path``
    (``size`` bytes, default the rest; ``what``: its name in messages), offsets absolute. Raises
    :class:`DatasetError` if unreadable or truncated, ``OSError`` if ``path`` cannot be opened."""
    label = f"{path}[{what}]" if what else path
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size - start if size is None else size
        fast = _fast_members(fd, start, size, label)
        members, end = fast if fast is not None else _tarfile_members(fd, start, size, label)
    if what is None and end + 2 * _BLOCK > size:  # no end-of-archive blocks: cut at a member
        raise DatasetError(f"{label}: truncated (no end-of-archive marker after "
                           f"{len(members)} members, {size} bytes)")
    return members


def _tarfile_members(fd: int, start: int, size: int,
                     label: str) -> tuple[list[tuple[str, int, int]], int]:
    """:func:`tar_members` through ``tarfile`` (every header format it reads)."""
    members, end = [], 0
    try:
        with tarfile.open(fileobj=io.BufferedReader(_Window(fd, start, size), _BLOCK),
                          mode="r:") as tar:
            for info in tar:
                end = info.offset_data + -(-info.size // _BLOCK) * _BLOCK
                if info.offset_data + info.size > size:
                    raise DatasetError(f"{label}: truncated (ends inside {_name(info)}, "
                                       f"{size - info.offset_data} of {info.size} bytes)")
                if info.isreg():
                    members.append((_name(info), start + info.offset_data, info.size))
    except tarfile.TarError as exc:
        raise DatasetError(f"{label}: not a readable tar ({exc})") from None
    return members, end
