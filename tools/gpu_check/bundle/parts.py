"""A wheel too large for one step of an offline bundle (DALI's: 199 MB against a 64 MiB
transfer), cut into parts ``NAME.partNN`` with a ``sha256sum``-format manifest (a line per part
and one for the whole), so that a part lost or damaged on the way is one line naming it, never
a broken install.
"""
from __future__ import annotations

import hashlib
import os
from typing import Sequence

PART_BYTES = 60 * 2**20  # under a 64 MiB step, with room for the manifest
MANIFEST = "SHA256SUMS"
_CHUNK = 1 << 20


class PartsError(Exception):
    """A missing or damaged part, or a manifest that does not match: one line."""


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def split(wheel: str, folder: str, part_bytes: int = PART_BYTES,
          first: Sequence[int] = ()) -> list[str]:
    """Cut ``wheel`` into ``folder/NAME.partNN`` files, the first at most ``first[k]`` bytes
    (room left in steps holding other files), the rest at most ``part_bytes``, and append
    their lines and the wheel's to ``folder/SHA256SUMS``; returns the parts' paths in order.
    Raises ``ValueError`` for a size under 1 byte."""
    if min([part_bytes, *first]) < 1:
        raise ValueError(f"part size {min([part_bytes, *first])}: must be at least 1 byte")
    os.makedirs(folder, exist_ok=True)
    name, parts, lines = os.path.basename(wheel), [], []
    with open(wheel, "rb") as src:
        while True:
            data = src.read(first[len(parts)] if len(parts) < len(first) else part_bytes)
            if not data:
                break
            part = os.path.join(folder, f"{name}.part{len(parts):02d}")
            with open(part, "wb") as out:
                out.write(data)
            parts.append(part)
            lines.append(f"{hashlib.sha256(data).hexdigest()}  {os.path.basename(part)}")
    lines.append(f"{sha256_file(wheel)}  {name}")
    with open(os.path.join(folder, MANIFEST), "a") as f:
        f.write("".join(line + "\n" for line in lines))
    return parts


def read_manifest(folder: str) -> dict[str, str]:
    """File name -> sha256 of ``folder/SHA256SUMS``. Raises :class:`PartsError`."""
    path = os.path.join(folder, MANIFEST)
    try:
        with open(path) as f:
            rows = [line.split() for line in f if line.strip()]
    except OSError as exc:
        raise PartsError(f"{path}: {exc.strerror or exc}") from None
    if any(len(row) != 2 or len(row[0]) != 64 for row in rows):
        raise PartsError(f"{path}: not a sha256sum listing")
    return {name.lstrip("*"): digest for digest, name in rows}


def reassemble(folder: str, out: str) -> list[str]:
    """Join each wheel listed in ``folder/SHA256SUMS`` from its parts into ``out`` and check
    it; returns the wheels' paths. Raises :class:`PartsError` naming the first part missing or
    damaged, or a whole that does not match."""
    manifest = read_manifest(folder)
    wheels = sorted(name for name in manifest if ".part" not in name)
    os.makedirs(out, exist_ok=True)
    joined = []
    for wheel in wheels:
        parts = sorted(n for n in manifest if n.startswith(wheel + ".part"))
        if not parts:
            raise PartsError(f"{folder}: no parts of {wheel} in {MANIFEST}")
        target = os.path.join(out, wheel)
        with open(target, "wb") as dst:
            for part in parts:
                path = os.path.join(folder, part)
                if not os.path.isfile(path):
                    raise PartsError(f"{path}: missing (copy every step's files to the "
                                     "host before the last step)")
                if sha256_file(path) != manifest[part]:
                    raise PartsError(f"{path}: damaged (its sha256 differs from {MANIFEST})")
                with open(path, "rb") as src:
                    while chunk := src.read(_CHUNK):
                        dst.write(chunk)
        if sha256_file(target) != manifest[wheel]:
            raise PartsError(f"{target}: reassembled, but its sha256 differs from {MANIFEST}")
        joined.append(target)
    return joined
