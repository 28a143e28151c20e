"""folder2lmdb.py on bad input: what is kept, re-encoded and skipped; --strict; resume after
SIGKILL; --verify; one-line errors. The corpus is ``tests/helpers/badcorpus.py``."""
import io
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time

import lmdb
import numpy as np
import pytest
from PIL import Image

import folder2lmdb
from formats import images as image_check
from decode.libraries import decode_jpeg
import formats.lmdb as codec
from formats.conversion import ResumeState, fingerprint
from decode import decode
from formats.sources import list_sources
from tests.helpers import warm
from tests.helpers.badcorpus import make_bad_corpus
from tests.helpers.paths import REPO

CLASSES = ["n01", "n02 empty", "n03"]


def run_cli(*args, timeout=120):
    return warm.run([sys.executable, "folder2lmdb.py", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    corpus = make_bad_corpus(str(root / "src"))
    db = str(root / "db")
    result = run_cli("-d", corpus.root, "-o", db, "-j", "2", "--batch-size", "5")
    assert result.returncode == 0, result.stderr
    return corpus, db, result


def read_all(db):
    """(meta, [(data, label)], checksums, other keys) of a database, read without caching."""
    env = lmdb.open(db, subdir=True, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            meta = codec.decode_meta(txn.get(codec.META_KEY), db)
            records = [codec.decode_record(txn.get(codec.record_key(i)))
                       for i in range(meta.count)]
            keys = [k for k, _ in txn.cursor() if not k.isdigit()]
            return meta, records, txn.get(codec.CHECKSUMS_KEY), keys
    finally:
        env.close()


def source_bytes(corpus, rel):
    with open(os.path.join(corpus.root, rel), "rb") as f:
        return f.read()


def test_kept_records_labels_and_bytes(converted):
    corpus, db, _ = converted
    meta, records, checksums, keys = read_all(db)
    assert list(meta.classes) == CLASSES  # the empty class keeps label 1; hidden dirs ignored
    assert meta.count == len(corpus.kept) == 20
    assert keys == [codec.CHECKSUMS_KEY, codec.META_KEY]  # no resume state left behind
    assert codec.decode_checksums(checksums) == [
        codec.record_checksum(codec.encode_record(d, label)) for d, label in records]
    for (rel, label), (data, stored_label) in zip(corpus.kept.items(), records):
        assert stored_label == label, rel
        original = source_bytes(corpus, rel)
        if rel in corpus.reencoded:
            assert data != original and data == image_check.reencode(original), rel
            assert image_check.reencode_reason(data) is None, rel  # now baseline YCbCr
        else:
            assert data == original, rel
    assert sorted(label for _, label in records) == [0] * 18 + [2] * 2


def test_every_record_decodes_with_pil_and_the_loaders_library(converted):
    corpus, db, _ = converted
    _, records, _, _ = read_all(db)
    for rel, (data, _) in zip(corpus.kept, records):
        with Image.open(io.BytesIO(data)) as img:
            pil = np.asarray(img.convert("RGB"))
        tv = decode_jpeg(data)  # libjpeg-turbo itself (TorchCodec or torchvision), no PIL
        assert tv.shape == (3, *pil.shape[:2]) == decode(data).shape, rel
        if rel.endswith("webp_inside.JPEG"):
            continue  # this PIL build may not read WebP: the converter used decode.libraries
        with Image.open(io.BytesIO(source_bytes(corpus, rel))) as src:
            assert pil.shape[:2] == (src.height, src.width), rel


def test_every_record_decodes_with_dali_cpu(converted):
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, pipeline_def, types

    corpus, db, _ = converted
    _, records, _, _ = read_all(db)
    encoded = [np.frombuffer(data, dtype=np.uint8) for data, _ in records]

    @pipeline_def(batch_size=len(encoded), num_threads=2, device_id=None)
    def pipe():
        jpegs = fn.external_source(source=lambda: encoded, batch=True)
        return fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)

    pipeline = pipe()
    pipeline.build()
    (images,) = pipeline.run()
    shapes = [images.at(i).shape for i in range(len(encoded))]
    expected = [(*decode(data).shape[1:], 3) for data, _ in records]
    assert shapes == expected


def test_skipped_files_are_reported_and_counted(converted):
    corpus, db, result = converted
    with open(os.path.join(db, "skipped.tsv"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert lines[0] == "path\treason"
    rows = [line.split("\t") for line in lines[1:]]
    assert [path for path, _ in rows] == list(corpus.skipped)
    for path, reason in rows:
        assert corpus.skipped[path] in reason, (path, reason)
    line = result.stdout.strip()
    assert len(line.splitlines()) == 1
    assert line.startswith("wrote 20 images") and "re-encoded 10, skipped 8" in line
    # the empty class, and the image kept although libjpeg warned about it (named, not raw)
    assert result.stderr.count("warning") == 2 and "'n02 empty' is empty" in result.stderr
    assert "keeping damaged image" in result.stderr and "premature_end.JPEG" in result.stderr
    assert "\nCorrupt JPEG data" not in "\n" + result.stderr


def test_strict_fails_on_the_first_non_image(converted, tmp_path):
    corpus, _, _ = converted
    result = run_cli("-d", corpus.root, "-o", str(tmp_path / "db"), "--strict")
    assert result.returncode == 1
    error = [line for line in result.stderr.splitlines() if "error:" in line]
    first = next(iter(corpus.skipped))  # in the converter's order: the bomb comes first
    assert first == "n01/bomb.JPEG"
    assert len(error) == 1 and first in error[0] and corpus.skipped[first] in error[0]
    assert "--strict" in error[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("sof, precision, components, adobe, reason", [
    (0xC0, 8, 3, None, None), (0xC1, 8, 1, None, None), (0xC2, 8, 3, None, "progressive"),
    (0xC9, 8, 3, None, "arithmetic"), (0xC3, 8, 3, None, "lossless"), (0xC1, 12, 3, None, "12-bit"),
    (0xC0, 8, 4, 0, "CMYK"), (0xC0, 8, 4, 2, "YCCK"), (0xC0, 8, 3, 0, "RGB-coded"),
])
def test_jpeg_header_rules(sof, precision, components, adobe, reason):
    segments = b"\xff\xd8"
    if adobe is not None:
        body = b"Adobe" + b"\x00\x64\x00\x00\x00\x00" + bytes([adobe])
        segments += b"\xff\xee" + struct.pack(">H", len(body) + 2) + body
    frame = bytes([precision]) + struct.pack(">HH", 8, 8) + bytes([components])
    frame += b"".join(bytes([i + 1, 0x11, 0]) for i in range(components))
    segments += bytes([0xFF, sof]) + struct.pack(">H", len(frame) + 2) + frame
    found = image_check.reencode_reason(segments + b"\xff\xda")
    assert found is None if reason is None else reason in found


def progress_done(db):
    """Source files committed so far by a running conversion at ``db``, or None."""
    if not os.path.exists(os.path.join(db, "data.mdb")):
        return None
    try:
        env = lmdb.open(db, subdir=True, readonly=True)  # with the lock: the writer is live
    except lmdb.Error:
        return None
    try:
        with env.begin() as txn:
            value = txn.get(codec.PROGRESS_KEY)
            return ResumeState.decode(value).done if value else None
    finally:
        env.close()


# folder2lmdb.py's command line with each transaction slowed by 20 ms: the whole conversion of
# the corpus takes ~0.1 s, so without it the kills below would race the last commits.
_SLOW_CLI = """
import sys, time
import folder2lmdb
from formats.lmdb._convert import Writer
commit = Writer.commit
Writer.commit = lambda self, *a, **k: (time.sleep(0.02), commit(self, *a, **k))
sys.exit(folder2lmdb.main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_resume_after_sigkill_equals_uninterrupted_run(tmp_path):
    corpus = make_bad_corpus(str(tmp_path / "src"), size=160, extra_per_class=60)
    total = len(corpus.kept) + len(corpus.skipped)
    reference = str(tmp_path / "reference")
    folder2lmdb.convert(corpus.root, reference, batch_size=4, progress=False)
    db = str(tmp_path / "db")
    args = ["-d", corpus.root, "-o", db, "-j", "1", "--batch-size", "4"]
    rng = random.Random(1234)
    seen = []
    # Each kill at a point of progress, however slow the machine: the first as soon as the
    # database file exists (before or at its first commits), the others once a drawn number of
    # files is committed, further along each time. Commits take 20 ms each (_SLOW_CLI), so the
    # conversion is never over by the kill.
    targets = [None] + sorted(rng.sample(range(8, total - 16), 3))
    for target in targets:
        proc = subprocess.Popen([sys.executable, "-c", _SLOW_CLI, *args], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"the conversion ended or stalled before the kill point {target}: "
                            f"{proc.communicate()[1][-2000:]!r}")
            if target is None and os.path.exists(os.path.join(db, "data.mdb")):
                break
            done = progress_done(db)
            if target is not None and done is not None and done >= target:
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        seen.append(progress_done(db))
        with pytest.raises(codec.LMDBFormatError):  # never read as complete
            codec.read_meta(db)
    assert all(d is not None and 0 < d < total for d in seen[1:]), seen
    result = run_cli(*args)  # the command line itself resumes
    assert result.returncode == 0, result.stderr
    assert f"resumed after {seen[-1]} files" in result.stdout
    assert read_all(db) == read_all(reference)
    for name in ("skipped.tsv",):
        with open(os.path.join(db, name), "rb") as a, open(os.path.join(reference, name), "rb") as b:
            assert a.read() == b.read()


def test_a_start_over_keeps_the_folder_while_another_process_opens_it(tmp_path):
    """Starting over used to remove the folder, which failed ("Directory not empty") when a
    reader opened the database meanwhile and so created lock.mdb in it."""
    corpus = make_bad_corpus(str(tmp_path / "src"))
    db = str(tmp_path / "db")
    os.makedirs(db)
    lmdb.open(db, subdir=True).close()  # as if killed before its first commit
    reader = lmdb.open(db, subdir=True, readonly=True)  # another process's handle, lock.mdb in use
    inode = os.stat(db).st_ino
    result = run_cli("-d", corpus.root, "-o", db, "-j", "1")
    reader.close()
    assert result.returncode == 0, result.stderr
    assert "no resume state (interrupted before its first commit); starting over" in result.stderr
    assert os.stat(db).st_ino == inode and read_all(db)[0].count == len(corpus.kept)


def test_why_a_decoder_was_passed_over_does_not_change_the_resume_fingerprint(tmp_path,
                                                                              monkeypatch):
    from decode import libraries
    from formats.sources import list_sources

    listing = list_sources(make_bad_corpus(str(tmp_path / "src")).root)
    before = fingerprint(listing)
    monkeypatch.setitem(libraries._skipped, "elsewhere", "probe failed at 0x7f3a2c (errno 12)")
    assert libraries.decoder_name().endswith("(elsewhere: probe failed at 0x7f3a2c (errno 12))")
    assert fingerprint(listing) == before


def test_changed_source_or_settings_are_refused_in_one_line_and_overwrite_starts_over(tmp_path):
    corpus = make_bad_corpus(str(tmp_path / "src"))
    db = str(tmp_path / "db")
    folder2lmdb.convert(corpus.root, db, progress=False, batch_size=4)
    before = fingerprint(list_sources(corpus.root), shuffle_seed=None)
    before.done = before.records = read_all(db)[0].count
    env = lmdb.open(db, subdir=True)
    with env.begin(write=True) as txn:  # as if killed before the last transaction
        txn.delete(codec.META_KEY)
        txn.put(codec.PROGRESS_KEY, before.encode())
    env.close()
    with open(os.path.join(corpus.root, "n01", "added.JPEG"), "wb") as f:
        f.write(source_bytes(corpus, next(iter(corpus.kept))))
    for flags, why in (([], f"of other files (the listing differs: {before.files} files then, "
                            f"{before.files + 1} now)"),
                       (["--check", "header"], "with other settings (--check full then, "
                                               "--check header now)")):
        result = run_cli("-d", corpus.root, "-o", db, "-j", "1", *flags)
        assert result.returncode == 1 and result.stderr.strip().splitlines()[-1] == (
            f"folder2lmdb.py: error: {db}: holds an unfinished conversion {why}; pass "
            "--overwrite to start over")
    assert progress_done(db) == before.done  # nothing deleted
    summary = folder2lmdb.convert(corpus.root, db, progress=False, overwrite=True)
    assert summary.resumed_at == 0 and summary.images == len(corpus.kept) + 1
    assert read_all(db)[0].count == len(corpus.kept) + 1


def flip_byte(db, index):
    env = lmdb.open(db, subdir=True)
    with env.begin(write=True) as txn:
        data, label = codec.decode_record(txn.get(codec.record_key(index)))
        corrupt = bytearray(data)
        corrupt[len(corrupt) // 2] ^= 0x10  # inside the entropy-coded data: still decodes
        txn.put(codec.record_key(index), codec.encode_record(bytes(corrupt), label))
    env.close()


def test_verify_accepts_a_good_database_and_names_a_flipped_byte(converted, tmp_path):
    corpus, db, _ = converted
    result = run_cli("--verify", db, "--dataset", corpus.root)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"verified {db}: OK (20 records, 3 classes, checksums")
    copy = str(tmp_path / "copy")
    shutil.copytree(db, copy)
    index = list(corpus.kept).index("n01/name with spaces.JPEG")
    flip_byte(copy, index)
    plain = folder2lmdb.verify(copy)
    assert plain.total == 1 and plain.problems[0].startswith(f"record {index}: checksum")
    full = folder2lmdb.verify(copy, corpus.root)
    assert full.total == 2
    assert all(p.startswith(f"record {index} (n01/name with spaces.JPEG): ") for p in full.problems)
    assert any("differ from the source" in p for p in full.problems)
    result = run_cli("--verify", copy)
    assert result.returncode == 1 and "1 problems" in result.stdout
    assert result.stderr.strip() == f"folder2lmdb.py: {plain.problems[0]}"


def test_verify_reports_an_unfinished_database(converted, tmp_path):
    _, db, _ = converted
    copy = str(tmp_path / "copy")
    shutil.copytree(db, copy)
    env = lmdb.open(copy, subdir=True)
    with env.begin(write=True) as txn:
        txn.delete(codec.META_KEY)
    env.close()
    result = folder2lmdb.verify(copy)
    assert result.total == 1 and "did not finish" in result.problems[0]


class _FailingEnv:
    """An LMDB environment whose map cannot grow (``grow``) or whose disk is full."""

    def __init__(self, env, failure):
        self._env, self._failure = env, failure

    def __getattr__(self, name):
        return getattr(self._env, name)

    def set_mapsize(self, size):
        raise lmdb.Error("mdb_env_set_mapsize: Cannot allocate memory")

    def begin(self, write=False):
        txn = self._env.begin(write=write)
        if write and self._failure == "disk":
            txn.abort()
            raise lmdb.DiskError("mdb_txn_commit: No space left on device")
        return txn


@pytest.mark.parametrize("case, message", [
    ("missing", "no such directory"),
    ("no classes", "Couldn't find any class folder"),
    ("no files", "no files in its 2 class folders"),
    ("no images", "none of its 2 files is an image"),
    ("unwritable", "cannot create the database"),
    ("grow", "cannot grow the LMDB map"),
    ("disk", "cannot write the database"),
])
def test_converter_errors_are_one_line(tiny, tmp_path, monkeypatch, capsys, case, message):
    source, out = os.path.join(tiny.root, "train"), str(tmp_path / "db")
    if case == "missing":
        source = str(tmp_path / "missing")
    elif case in ("no classes", "no files", "no images"):
        source = str(tmp_path / "src")
        os.makedirs(source)
        if case != "no classes":
            for name in ("a", "b"):
                os.makedirs(os.path.join(source, name))
        if case == "no images":
            for name in ("a", "b"):
                with open(os.path.join(source, name, "x.JPEG"), "w") as f:
                    f.write("<html>not found</html>")
    elif case == "unwritable":
        (tmp_path / "file").write_text("a file, not a directory")
        out = str(tmp_path / "file" / "db")
    else:
        real_open = lmdb.open
        monkeypatch.setattr(folder2lmdb.lmdb, "open",
                            lambda *a, **k: _FailingEnv(real_open(*a, **k), case))
    status = folder2lmdb.main(["-d", source, "-o", out, "--map-size", "16384"])
    err = capsys.readouterr().err
    assert status == 1
    lines = [line for line in err.strip().splitlines()  # less warnings and the layout line
             if "warning" not in line and ": source: " not in line]
    assert len(lines) == 1 and lines[0].startswith("folder2lmdb.py: error: ") and message in err


def _can_mount_privately() -> bool:
    """Whether this process may mount a tmpfs of its own (root, ``unshare -m``)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


def test_full_disk_is_one_line_not_a_bus_error(tiny, tmp_path):
    """A real full filesystem (a 4 MiB tmpfs filled up): LMDB maps its lock file, which on a
    full disk kills the converter with SIGBUS; it must stop first with one line instead."""
    if not _can_mount_privately():
        pytest.skip("needs root and unshare -m for a small tmpfs of its own")
    disk = tmp_path / "disk"
    disk.mkdir()
    convert = [sys.executable, "folder2lmdb.py", "-d", os.path.join(tiny.root, "train"),
               "-o", f"{disk}/db"]
    script = (f"mount -t tmpfs -o size=4m tmpfs '{disk}' && "
              f"(dd if=/dev/zero of='{disk}/filler' bs=64k status=none 2>/dev/null || true) && "
              + " ".join(f"'{part}'" for part in convert))
    result = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    lines = [line for line in result.stderr.strip().splitlines()
             if "warning" not in line and ": source: " not in line]
    assert result.returncode == 1, result.stderr
    assert len(lines) == 1 and "MiB free on its disk" in lines[0], result.stderr
