"""The official download from image-net.org, read in place: ``ILSVRC2012_img_train.tar`` (class
tars, each JPEG indexed by byte offset; or their folder), ``ILSVRC2012_img_val.tar`` (or its flat
folder) and the devkit's ``data/meta.mat`` (read as torchvision's ``datasets.ImageNet`` does) and
val ground truth. Labels index the sorted WNIDs; ``rel`` is the extracted path (``valprep.sh``'s
for val). A tar is indexed in place (:func:`tar_members`): a member is one ``pread``, and a tar in
a tar needs no extraction."""
from __future__ import annotations

import io
import os
import re
import tarfile

from ._listing import DatasetError, Listing, Source, class_listing, named_classes

TRAIN_TAR, VAL_TAR = "ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar"
DEVKIT = "ILSVRC2012_devkit_t12"
META, GROUND_TRUTH = "data/meta.mat", "data/ILSVRC2012_validation_ground_truth.txt"
_VAL_NAME = re.compile(r"ILSVRC2012_val_(\d{8})\.JPEG")
_WNID_TAR = re.compile(r"(n\d{8})\.tar")


def find_devkit(folder: str) -> str | None:
    """The devkit in ``folder``: ``ILSVRC2012_devkit_t12.tar.gz`` or its extracted folder."""
    found = [os.path.join(folder, n) for n in (DEVKIT + ".tar.gz", DEVKIT)]
    return next((path for path in found if os.path.exists(path)), None)


def _devkit_file(devkit: str, member: str) -> bytes:
    """The bytes of ``member`` (``data/...``) of the devkit (archive or folder)."""
    try:
        if os.path.isdir(devkit):
            with open(os.path.join(devkit, member), "rb") as f:
                return f.read()
        with tarfile.open(devkit, "r:gz") as tar:
            for info in tar:
                if info.name.lstrip("./").split("/", 1)[-1] == member:
                    return tar.extractfile(info).read()
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise DatasetError(f"{devkit}: cannot read {member} ({exc})") from None
    raise DatasetError(f"{devkit}: no {member} in it")


def read_meta(devkit: str) -> dict[int, tuple[str, str]]:
    """``{ILSVRC2012_ID: (WNID, words)}`` of the devkit's classes (as torchvision's
    ``parse_meta_mat``). Raises :class:`DatasetError`."""
    from scipy.io import loadmat

    try:
        synsets = loadmat(io.BytesIO(_devkit_file(devkit, META)), squeeze_me=True)["synsets"]
        rows = [tuple(row)[:5] for row in synsets.ravel()]
        return {int(idx): (str(wnid), str(words)) for idx, wnid, words, _, children in rows
                if int(children) == 0}
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise DatasetError(f"{devkit}: {META} is not the devkit's synsets table ({exc})") from None


def list_train(train: str, devkit: str | None) -> Listing:
    """The train split in ``train`` (outer tar, or a folder of class tars). Raises
    :class:`DatasetError` for a bad tar or a class the devkit lacks."""
    meta = dict(read_meta(devkit).values()) if devkit else None
    inner = _inner_tars(train)
    classes, names, label_of = named_classes(meta or {wnid: "" for wnid, *_ in inner})
    files = []
    for wnid, path, start, size in inner:
        if wnid not in label_of:
            raise DatasetError(f"{train}: {wnid}.tar is not one of the {len(classes)} classes "
                               f"of {devkit}")
        members = tar_members(path, start, size, what=f"{wnid}.tar")
        files += [Source(path, f"{wnid}/{os.path.basename(name)}", label_of[wnid], at, n)
                  for name, at, n in members]
    if not files:
        raise DatasetError(f"{train}: no images in it")
    via = "" if devkit is None else f", labels from {os.path.basename(devkit)}"
    return class_listing(train, classes, files, f"ImageNet official archives: {train} read in "
                         f"place ({len(inner)} class tars{via})", names if meta else None)


def _inner_tars(train: str) -> list[tuple[str, str, int, int]]:
    """``(wnid, file, data offset, size)`` of each class tar."""
    if os.path.isdir(train):
        found = sorted(n for n in os.listdir(train) if _WNID_TAR.fullmatch(n))
        if not found:
            raise DatasetError(f"{train}: no class tars (n01440764.tar, ...) in it")
        return [(n[:-4], os.path.join(train, n), 0, os.path.getsize(os.path.join(train, n)))
                for n in found]
    inner = []
    for name, at, size in tar_members(train):
        match = _WNID_TAR.fullmatch(os.path.basename(name))
        if not match:
            raise DatasetError(f"{train}: {name} is not a class tar (n01440764.tar, ...)")
        inner.append((match[1], train, at, size))
    return inner


def list_val(val: str, devkit: str | None) -> Listing:
    """The val split in ``val`` (tar or flat folder), labels from the devkit. Raises
    :class:`DatasetError` for a missing devkit or a mismatched ground truth or name."""
    if devkit is None:
        raise DatasetError(f"{val}: the val labels are in the devkit: put {DEVKIT}.tar.gz "
                           "(or its extracted folder) beside it")
    if os.path.isdir(val):
        names = sorted(n for n in os.listdir(val) if not n.startswith("."))
        images = [(n, os.path.join(val, n), -1, -1) for n in names]
    else:
        images = [(os.path.basename(n), val, at, size) for n, at, size in tar_members(val)]
    meta, ids = read_meta(devkit), _devkit_file(devkit, GROUND_TRUTH).decode("ascii", "replace")
    if not all(t.isdigit() for t in ids.split()):
        raise DatasetError(f"{devkit}: {GROUND_TRUTH} holds something other than class IDs")
    truth = [int(t) for t in ids.split()]
    classes, names, label_of = named_classes(dict(meta.values()))
    if len(truth) != len(images):
        raise DatasetError(f"{devkit}: {GROUND_TRUTH} has {len(truth)} labels for the "
                           f"{len(images)} images of {val}")
    files = []
    for name, path, at, size in images:
        match = _VAL_NAME.fullmatch(name)
        if not match or not 1 <= int(match[1]) <= len(truth):
            raise DatasetError(f"{val}: {name} is not ILSVRC2012_val_00000001.JPEG .. "
                               f"ILSVRC2012_val_{len(truth):08d}.JPEG")
        idx = truth[int(match[1]) - 1]
        if idx not in meta:
            raise DatasetError(f"{devkit}: {GROUND_TRUTH} line {match[1].lstrip('0')}: "
                               f"ILSVRC2012_ID {idx} is not a class of {META}")
        wnid = meta[idx][0]
        files.append(Source(path, f"{wnid}/{name}", label_of[wnid], at, size))
    return class_listing(val, classes, files, f"ImageNet official archives: {val} "
                         f"(labels from {os.path.basename(devkit)})", names)


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
        name = os.fsdecode(name.removeprefix(b"./"))
        if pos + _BLOCK + length > size:
            raise DatasetError(f"{label}: truncated (ends inside {name}, "
                               f"{size - pos - _BLOCK} of {length} bytes)")
        if header[156] in _REGULAR:
            members.append((name, start + pos + _BLOCK, length))
        pos += _BLOCK + -(-length // _BLOCK) * _BLOCK
    return members, pos


def tar_members(path: str, start: int = 0, size: int | None = None,
                what: str | None = None) -> list[tuple[str, int, int]]:
    """``(name, data offset, size)`` of the regular files (POSIX, GNU or pax headers, as
    ``tarfile`` reads them) of the tar at ``start`` in ``path`` (``size`` bytes, default the rest;
    ``what``: its name in messages), offsets absolute. Raises :class:`DatasetError` if unreadable
    or truncated, ``OSError`` if ``path`` cannot be opened."""
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
                name = info.name.removeprefix("./")
                end = info.offset_data + -(-info.size // _BLOCK) * _BLOCK
                if info.offset_data + info.size > size:
                    raise DatasetError(f"{label}: truncated (ends inside {name}, "
                                       f"{size - info.offset_data} of {info.size} bytes)")
                if info.isreg():
                    members.append((name, start + info.offset_data, info.size))
    except tarfile.TarError as exc:
        raise DatasetError(f"{label}: not a readable tar ({exc})") from None
    return members, end
