import os
import sys

import lmdb
import msgpack
import pytest

import folder2lmdb
import formats.lmdb as codec
from formats.lmdb._convert import Writer
from tools import datagen
from tests.helpers import warm
from tests.helpers.paths import REPO
from tests.helpers.stores import check_db_matches_folder


def test_generated_folder_converts_byte_for_byte(tiny):
    for split in ("train", "val"):
        check_db_matches_folder(os.path.join(tiny.lmdb, split), os.path.join(tiny.root, split))


def test_map_grows_instead_of_map_full_error(tiny, tmp_path):
    out = str(tmp_path / "db")
    summary = folder2lmdb.convert(os.path.join(tiny.root, "train"), out, map_size=64 * 1024,
                                  batch_size=5, progress=False)
    assert summary.images == 32
    env = codec.open_readonly(out)
    assert env.info()["map_size"] > 64 * 1024
    check_db_matches_folder(out, os.path.join(tiny.root, "train"))


def test_summary_counts_images_and_bytes(tiny, tmp_path):
    train = os.path.join(tiny.root, "train")
    summary = folder2lmdb.convert(train, str(tmp_path / "db"), progress=False)
    files = [os.path.join(d, f) for d, _, fs in os.walk(train) for f in fs]
    assert summary.images == len(files)
    assert summary.bytes == sum(os.path.getsize(f) for f in files)
    assert "images/s" in summary.line() and f"wrote {len(files)} images" in summary.line()


def test_complete_database_is_not_overwritten_silently(tiny, tmp_path):
    out = str(tmp_path / "db")
    train = os.path.join(tiny.root, "train")
    folder2lmdb.convert(train, out, progress=False)
    with pytest.raises(folder2lmdb.ConversionError, match="--overwrite"):
        folder2lmdb.convert(train, out, progress=False)
    assert folder2lmdb.convert(train, out, overwrite=True, progress=False).images == 32


def test_unfinished_database_without_a_resume_state_is_refused_until_overwrite(tiny, tmp_path):
    out = str(tmp_path / "db")
    train = os.path.join(tiny.root, "train")
    folder2lmdb.convert(train, out, progress=False)
    codec.close_readonly(out)
    # records without a resume state, then an older converter's (msgpack) state
    for state in (None, msgpack.packb([b"fingerprint", 8, 8, 0, 0, 0, {}], use_bin_type=True)):
        env = lmdb.open(out, subdir=True)
        with env.begin(write=True) as txn:
            txn.delete(codec.META_KEY)  # as if killed before the last transaction
            if state is not None:
                txn.put(codec.PROGRESS_KEY, state)
        env.close()
        with pytest.raises(codec.LMDBFormatError, match="did not finish"):
            codec.read_meta(out)
        with pytest.raises(folder2lmdb.ConversionError,  # never deleted unasked
                           match="resume state is missing or unreadable .*; pass --overwrite"):
            folder2lmdb.convert(train, out, progress=False)
    assert folder2lmdb.convert(train, out, progress=False, overwrite=True).resumed_at == 0
    check_db_matches_folder(out, train)


def test_labels_follow_imagefolder_order_with_unsorted_names(tmp_path):
    # Class folder names whose creation order differs from sorted order.
    for name in ("zebra", "Apple", "mango"):
        datagen.make_split(str(tmp_path / "src"), 1, 2, seed=1)
        os.rename(tmp_path / "src" / "n00000000", tmp_path / "src" / name)
    folder2lmdb.convert(str(tmp_path / "src"), str(tmp_path / "db"), progress=False)
    check_db_matches_folder(str(tmp_path / "db"), str(tmp_path / "src"))


def run_cli(*args):
    return warm.run([sys.executable, "folder2lmdb.py", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_cli_prints_the_layout_then_one_summary_line(tiny, tmp_path):
    result = run_cli("--dataset", os.path.join(tiny.root, "val"), "-o", str(tmp_path / "db"))
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[0] == \
        f"folder2lmdb.py: source: class folders {os.path.join(tiny.root, 'val')}"
    assert result.stdout.strip().startswith("wrote 16 images")
    assert len(result.stdout.strip().splitlines()) == 1


@pytest.mark.parametrize("make_bad, message", [
    (lambda p: str(p / "missing"), "no such directory"),
    (lambda p: (p / "empty").mkdir() or str(p / "empty"), "Couldn't find any class folder"),
])
def test_cli_bad_source_is_one_line_error(tmp_path, make_bad, message):
    result = run_cli("-d", make_bad(tmp_path), "-o", str(tmp_path / "db"))
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_cli_refuses_output_that_is_not_an_lmdb(tiny, tmp_path):
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("keep me")
    result = run_cli("-d", os.path.join(tiny.root, "val"), "-o", str(tmp_path / "precious"))
    assert result.returncode == 1 and "not an LMDB" in result.stderr
    assert (tmp_path / "precious" / "notes.txt").read_text() == "keep me"


def read_records(db: str) -> list[tuple[bytes, int]]:
    """Every ``(data, label)`` in index order, through this process's cached environment
    (``test_folder2lmdb_robust.read_all`` opens its own, which py-lmdb refuses for the
    session's ``tiny`` databases that other tests already opened here)."""
    meta = codec.read_meta(db)
    with codec.open_readonly(db).begin() as txn:
        return [codec.decode_record(txn.get(codec.record_key(i))) for i in range(meta.count)]


def test_shuffle_seed_writes_a_fixed_permutation_with_each_files_label(tiny, tmp_path):
    train = os.path.join(tiny.root, "train")
    sorted_records = read_records(os.path.join(tiny.lmdb, "train"))
    runs = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        folder2lmdb.convert(train, str(tmp_path / name), progress=False, batch_size=5,
                            shuffle_seed=seed)
        runs[name] = read_records(str(tmp_path / name))
        assert codec.read_meta(str(tmp_path / name)).shuffle_seed == seed
    assert runs["a"] == runs["b"]  # the seed fixes the order
    assert runs["a"] != runs["c"] and runs["a"] != sorted_records
    for records in runs.values():  # the same records, each with its own file's label
        assert sorted(records) == sorted(sorted_records)
    labels = [label for _, label in runs["a"]]
    assert len(set(labels[:8])) > 1  # no longer one class after another
    assert codec.read_meta(os.path.join(tiny.lmdb, "train")).shuffle_seed is None


def test_shuffled_database_verifies_and_resumes_in_its_order(tiny, tmp_path, monkeypatch):
    train = os.path.join(tiny.root, "train")
    reference = str(tmp_path / "reference")
    folder2lmdb.convert(train, reference, progress=False, batch_size=4, shuffle_seed=5)
    assert folder2lmdb.verify(reference, train).total == 0
    commit = Writer.commit
    for seed, resumed_at in ((5, 12), (6, 0)):
        db = str(tmp_path / f"db{seed}")
        calls = []

        def killed_after_three_batches(self, puts, delete_prefix=None):
            calls.append(1)
            if len(calls) == 5:  # the first transaction, then 3 batches of 4 files
                raise KeyboardInterrupt
            commit(self, puts, delete_prefix)

        monkeypatch.setattr(Writer, "commit", killed_after_three_batches)
        with pytest.raises(KeyboardInterrupt):
            folder2lmdb.convert(train, db, progress=False, batch_size=4, shuffle_seed=5)
        monkeypatch.setattr(Writer, "commit", commit)
        # The same seed resumes after 12 files; another seed is another order: refused, naming
        # it, and started over with --overwrite.
        if seed == 6:
            with pytest.raises(folder2lmdb.ConversionError, match=r"with other settings "
                               r"\(--shuffle-seed 5 then, --shuffle-seed 6 now\)"):
                folder2lmdb.convert(train, db, progress=False, shuffle_seed=seed)
        summary = folder2lmdb.convert(train, db, progress=False, batch_size=4, shuffle_seed=seed,
                                      overwrite=seed == 6)
        assert summary.resumed_at == resumed_at and summary.images == 32
        assert (read_records(db) == read_records(reference)) == (seed == 5)
        assert folder2lmdb.verify(db, train).total == 0


def test_cli_shuffle_seed_and_verify(tiny, tmp_path):
    val = os.path.join(tiny.root, "val")
    db = str(tmp_path / "db")
    result = run_cli("-d", val, "-o", db, "--shuffle-seed", "3")
    assert result.returncode == 0 and result.stdout.startswith("wrote 16 images"), result.stderr
    result = run_cli("--verify", db, "--dataset", val)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr


def test_verify_names_a_checksum_record_of_the_wrong_size(tiny, tmp_path):
    """A checksum record cut short, or not a whole number of CRC-32s: a problem, no traceback."""
    db = str(tmp_path / "db")
    assert run_cli("-d", os.path.join(tiny.root, "val"), "-o", db).returncode == 0  # 16 images
    for cut, size in ((4, 60), (3, 57)):  # one CRC-32 short, then not a whole number of them
        env = lmdb.open(db, subdir=True)
        with env.begin(write=True) as txn:
            txn.put(codec.CHECKSUMS_KEY, txn.get(codec.CHECKSUMS_KEY)[:-cut])
        env.close()
        result = run_cli("--verify", db)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.strip() == (f"folder2lmdb.py: checksum record holds {size} bytes "
                                          "for 16 records (64 expected)")


def test_no_transaction_commits_after_one_fails(tiny, tmp_path, monkeypatch):
    """Commits run in their own thread, several batches behind: once one fails (disk full),
    none queued after it may record later files as done."""
    train = os.path.join(tiny.root, "train")
    commit, calls = Writer.commit, []

    def full_disk_once(self, puts, delete_prefix=None):
        calls.append(1)
        if len(calls) == 3:  # the first transaction, batch 1, then batch 2 fails
            raise folder2lmdb.ConversionError("disk full")
        commit(self, puts, delete_prefix)

    monkeypatch.setattr(Writer, "commit", full_disk_once)
    db = str(tmp_path / "db")
    with pytest.raises(folder2lmdb.ConversionError, match="disk full"):
        folder2lmdb.convert(train, db, progress=False, batch_size=4)
    monkeypatch.setattr(Writer, "commit", commit)
    summary = folder2lmdb.convert(train, db, progress=False, batch_size=4)
    assert summary.resumed_at == 4 and summary.images == 32
    assert read_records(db) == read_records(os.path.join(tiny.lmdb, "train"))
