"""The rows' data: the bundle's sample linked enough times that no epoch ends inside a row's
timed steps, and its LMDB (``formats.lmdb.convert``). The linked files stay in the page cache,
so the rows measure decoding, not disk reads."""
from __future__ import annotations

import math
import os
import shutil
import sys
from types import SimpleNamespace

from .measure import data_batches
from ..runner import Runner, fail, skipped


def list_images(root: str) -> list[tuple[str, str]]:
    """(class, file path) of every non-hidden file one level below ``root``'s class folders."""
    found = []
    for cls in sorted(os.listdir(root)):
        folder = os.path.join(root, cls)
        if cls.startswith(".") or not os.path.isdir(folder):
            continue
        found += [(cls, os.path.join(folder, f)) for f in sorted(os.listdir(folder))
                  if not f.startswith(".") and os.path.isfile(os.path.join(folder, f))]
    return found


def prepare_data(runner: Runner, s, machine: dict,
                 lmdb_timeout: float) -> tuple[SimpleNamespace, list[dict]]:
    """Link each sample image k times into ``OUT/data/train`` so that one epoch holds
    :func:`~tools.gpu_check.rows.measure.data_batches` batches (and the distributed run's), then
    convert it and val to LMDB (header checks only: the same files again and again). Returns
    (paths and why a source is not available, the records)."""
    world = 2 if s.dry_run else max(machine.get("gpu_count", 1), 1)
    need = max(data_batches(s, machine), 2 * world + 2) * s.batch
    copies = math.ceil(need / len(s.images))
    root = os.path.join(s.out, "data")
    shutil.rmtree(root, ignore_errors=True)
    data = SimpleNamespace(train=os.path.join(root, "train"), val=s.val_src, lmdb=None,
                           reason=None, lmdb_reason=None)
    records = [{"name": "replicate", "status": "passed", "images": copies * len(s.images),
                "copies": copies, "sample_images": len(s.images), "train": data.train}]
    try:
        for cls, path in s.images:
            os.makedirs(os.path.join(data.train, cls), exist_ok=True)
            stem, ext = os.path.splitext(os.path.basename(path))
            for k in range(copies):
                os.symlink(path, os.path.join(data.train, cls, f"{stem}_{k:04d}{ext}"))
    except OSError as exc:
        data.reason = data.lmdb_reason = "not available: the sample could not be linked"
        return data, [fail(records[0], f"cannot link {path}: {exc.strerror or exc}")]
    if not machine.get("lmdb"):
        data.lmdb_reason = "not available: lmdb not installed"
        return data, records + [skipped("lmdb-convert", data.lmdb_reason)]
    lmdb = os.path.join(root, "lmdb")
    sample_bytes = sum(os.path.getsize(p) for _, p in s.images)  # map_size: no remapping
    code = ("import sys; from formats.lmdb import convert; [convert(a, b, workers=%d, "
            "progress=False, check='header', map_size=%d) for a, b in "
            "zip(sys.argv[1::2], sys.argv[2::2])]" % (machine.get("cpu_cores") or 1,
                                                     2 * copies * sample_bytes + (1 << 26)))
    rec = runner.run("lmdb-convert", [sys.executable, "-c", code, data.train,
                                      os.path.join(lmdb, "train"), data.val,
                                      os.path.join(lmdb, "val")], lmdb_timeout)
    if rec["status"] == "passed":
        data.lmdb = lmdb
    else:
        data.lmdb_reason = f"not available: LMDB conversion {rec['status']}"
    return data, records + [rec]
