"""The converters' --max-side / --quality (formats/cap.py): images within the cap byte-exact,
larger ones area-averaged to the cap and re-encoded, the settings in the metadata and
index.json, --verify --dataset under the same cap, a resume under another cap refused."""
import io
import os
import sys

import lmdb
import numpy as np
import pytest
from PIL import Image

import folder2lmdb
import folder2shards
from formats import conversion
from formats.cap import Cap
from formats.images import check_image
from formats.sources import list_sources
from formats.lmdb import _codec as codec
from formats.shards import INDEX_NAME, ShardIndex
from tools import datagen
from tests.helpers import warm
from tests.helpers.paths import REPO


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A train folder of 12 JPEGs, 64-128 px, plus one 300 x 200 and one progressive JPEG."""
    root = str(tmp_path_factory.mktemp("cap") / "train")
    datagen.make_split(root, num_classes=2, per_class=6, seed=3, noise=20, shapes=4)
    big = datagen.make_image(0, 2, __import__("random").Random(1), (300, 200), 20, 8)
    big.save(os.path.join(root, "n00000000", "big.JPEG"), quality=95)
    big.resize((150, 100)).save(os.path.join(root, "n00000001", "prog.JPEG"), quality=90,
                                progressive=True)
    return root


def jpeg(size, quality=95, **kw) -> bytes:
    out = io.BytesIO()
    datagen.make_image(1, 3, __import__("random").Random(0), size, 30, 6).save(
        out, "JPEG", quality=quality, **kw)
    return out.getvalue()


def test_cap_geometry_and_bad_values():
    cap = Cap(512, 90)
    assert cap.scaled_size((2400, 1600)) == (512, 341)
    assert cap.scaled_size((375, 2000)) == (96, 512)
    assert cap.scaled_size((512, 300)) == (512, 300) and not cap.exceeds((512, 512))
    assert cap.scaled_size((10000, 3)) == (512, 1)
    assert Cap().record() == {} and cap.record() == {"max_side": 512, "quality": 90}
    assert Cap.from_record(cap.record()) == cap and Cap.from_record({}) == Cap()
    for bad in (dict(max_side=0), dict(max_side=-5), dict(quality=0), dict(quality=101)):
        with pytest.raises(ValueError):
            Cap(**bad)


def test_within_the_cap_byte_exact_above_it_area_averaged_at_quality():
    small, large = jpeg((200, 150)), jpeg((400, 300))
    cap = Cap(256, 80)
    assert check_image(small, cap=cap).data == small
    assert check_image(small, cap=cap).reencoded is None
    capped = check_image(large, cap=cap)
    assert capped.reencoded == "larger than --max-side 256"
    with Image.open(io.BytesIO(capped.data)) as im:
        assert im.size == (256, 192) and im.format == "JPEG"
        assert "progressive" not in im.info
        pixels = im.convert("RGB")
    with Image.open(io.BytesIO(large)) as im:  # the same as PIL's BOX resize, re-encoded
        expected = im.convert("RGB").resize((256, 192), Image.BOX)
    out = io.BytesIO()
    expected.save(out, "JPEG", quality=80, optimize=False, progressive=False)
    assert capped.data == out.getvalue()
    assert max(abs(a - b) for a, b in zip(pixels.tobytes(), expected.tobytes())) < 64
    assert check_image(large, cap=cap).data == capped.data  # deterministic
    # A progressive JPEG is re-encoded anyway: capped too, at the cap's quality.
    prog = check_image(jpeg((400, 300), progressive=True), cap=cap)
    assert prog.reencoded == "progressive JPEG"
    with Image.open(io.BytesIO(prog.data)) as im:
        assert im.size == (256, 192)
    assert check_image(large).data == large  # no cap: the default rules


def test_fingerprint_unchanged_without_a_cap(mixed):
    listing = list_sources(mixed)
    assert conversion.fingerprint(listing) == conversion.fingerprint(listing, "full", Cap())
    assert conversion.fingerprint(listing) != conversion.fingerprint(listing, "full",
                                                                     Cap(100, 90))


def test_lmdb_records_its_cap_and_verifies_against_it(mixed, tmp_path):
    db = str(tmp_path / "db")
    summary = folder2lmdb.convert(mixed, db, workers=2, progress=False, cap=Cap(100, 90))
    assert summary.images == 14 and summary.reencoded >= 3  # big, prog and some 101-128 px
    meta = codec.read_meta(db)
    assert meta.cap == {"max_side": 100, "quality": 90}
    assert folder2lmdb.verify(db, mixed, workers=2).total == 0
    plain = str(tmp_path / "plain")
    folder2lmdb.convert(mixed, plain, workers=2, progress=False)
    assert codec.read_meta(plain).cap == {}
    env = lmdb.open(plain, subdir=True)  # a capped record in an uncapped database: a problem
    with env.begin(write=True) as txn, codec.open_readonly(db).begin() as src:
        txn.put(codec.record_key(0), src.get(codec.record_key(0)))
    env.close()
    assert folder2lmdb.verify(plain, mixed, workers=2).total >= 1


def unfinished(db: str, source: str, cap: dict) -> None:
    """Make ``db`` an unfinished conversion of ``source`` under ``cap`` (its 14 files done)."""
    state = conversion.fingerprint(list_sources(source), cap=Cap.from_record(cap),
                                   shuffle_seed=None)
    state.done = state.records = 14
    env = lmdb.open(db, subdir=True)
    with env.begin(write=True) as txn:  # as if killed before the last transaction
        txn.delete(codec.META_KEY)
        txn.put(codec.PROGRESS_KEY, state.encode())
    env.close()


def test_lmdb_resume_under_another_cap_is_refused_in_one_line(mixed, tmp_path):
    db = str(tmp_path / "db")
    folder2lmdb.convert(mixed, db, workers=2, progress=False, cap=Cap(100, 90))
    unfinished(db, mixed, {"max_side": 100, "quality": 90})
    run = warm.run([sys.executable, "folder2lmdb.py", "-d", mixed, "-o", db, "-j", "2",
                          "--max-side", "120", "--quality", "90"], cwd=REPO,
                         capture_output=True, text=True)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[1:] == [  # after the first line, naming the source
        f"folder2lmdb.py: error: {db}: holds an unfinished conversion with other settings "
        "(--max-side 100 --quality 90 then, --max-side 120 --quality 90 now); pass --overwrite "
        "to start over"]
    unfinished(db, mixed, {})
    with pytest.raises(conversion.ConversionError,
                       match="no --max-side --quality 95 then, --max-side 120 --quality 90 now"):
        folder2lmdb.convert(mixed, db, workers=2, progress=False, cap=Cap(120, 90))
    resumed = folder2lmdb.convert(mixed, db, workers=2, progress=False)
    assert resumed.resumed_at == 14 and codec.read_meta(db).cap == {}
    summary = folder2lmdb.convert(mixed, db, workers=2, progress=False, overwrite=True,
                                  cap=Cap(120, 90))
    assert summary.images == 14 and codec.read_meta(db).cap["max_side"] == 120


def test_shards_record_their_cap_verify_and_refuse_another(mixed, tmp_path, monkeypatch):
    out = tmp_path / "shards"
    folder2shards.convert(mixed, str(out), workers=2, progress=False, max_per_shard=5,
                          cap=Cap(100, 90))
    index = ShardIndex.from_json((out / INDEX_NAME).read_text())
    assert index.cap == {"max_side": 100, "quality": 90}
    assert folder2shards.verify(str(out), mixed, workers=2).total == 0
    os.remove(out / INDEX_NAME)  # unfinished: a resume must keep the cap
    with pytest.raises(conversion.ConversionError,
                       match="with other settings \\(--max-side 100 --quality 90 then, no "
                             "--max-side --quality 95 now\\)"):
        folder2shards.convert(mixed, str(out), workers=2, progress=False, max_per_shard=5)
    summary = folder2shards.convert(mixed, str(out), workers=2, progress=False, max_per_shard=5,
                                    cap=Cap(100, 90))
    assert summary.images == 14
    assert folder2shards.verify(str(out), mixed, workers=2).total == 0


def test_bad_flags_are_one_line_errors(mixed, tmp_path):
    for flags, text in ((["--max-side", "0"], "--max-side must be a positive"),
                        (["--quality", "0"], "--quality must be 1..100")):
        run = warm.run([sys.executable, "folder2shards.py", "-d", mixed, "-o",
                              str(tmp_path / "x"), *flags], cwd=REPO, capture_output=True,
                             text=True)
        assert run.returncode == 2
        assert run.stderr.strip().splitlines()[-1].startswith(f"folder2shards.py: error: {text}")


def test_reencode_all_reencodes_every_image_at_the_quality():
    """--reencode-all (FFCV's writer): an image within the cap is re-encoded too, exactly as a
    capped one would be minus the resize; recorded, described and read back."""
    small, large = jpeg((200, 150)), jpeg((400, 300))
    cap = Cap(256, 80, every=True)
    checked = check_image(small, cap=cap)
    assert checked.reencoded == "--reencode-all"
    out = io.BytesIO()
    with Image.open(io.BytesIO(small)) as im:
        im.convert("RGB").save(out, "JPEG", quality=80, optimize=False, progressive=False)
    assert checked.data == out.getvalue()
    assert check_image(large, cap=cap).data == check_image(large, cap=Cap(256, 80)).data
    gray = io.BytesIO()
    Image.new("L", (64, 48), 120).save(gray, "JPEG", quality=95)
    with Image.open(io.BytesIO(check_image(gray.getvalue(), cap=cap).data)) as im:
        assert im.mode == "RGB" and im.size == (64, 48)  # as FFCV's writer: RGB
    assert cap.record() == {"max_side": 256, "quality": 80, "reencode": "all"}
    assert Cap.from_record(cap.record()) == cap
    assert Cap(None, 90, every=True).describe() == "no --max-side --quality 90 --reencode-all"
    assert Cap.fields_in({"max_side": None, "quality": 90, "reencode": "all", "x": 1}) == {
        "max_side": None, "quality": 90, "reencode": "all"}
    for bad in ({"reencode": "some"}, {"quality": "90"}):
        with pytest.raises(ValueError):
            Cap.fields_in(bad)


def test_reencode_all_stores_record_it_verify_and_refuse_a_resume_without_it(mixed, tmp_path):
    db, shards = str(tmp_path / "db"), tmp_path / "shards"
    run = warm.run([sys.executable, "folder2lmdb.py", "-d", mixed, "-o", db, "-j", "2",
                          "--quality", "90", "--reencode-all"], cwd=REPO, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    assert "re-encoded 14," in run.stdout
    assert codec.read_meta(db).cap == {"max_side": None, "quality": 90, "reencode": "all"}
    assert folder2lmdb.verify(db, mixed, workers=2).total == 0
    with codec.open_readonly(db).begin() as txn:
        first = codec.decode_record(txn.get(codec.record_key(0)))[0]
    assert first == check_image(open(list_sources(mixed).files[0].path, "rb").read(),
                                cap=Cap(None, 90, every=True)).data
    again = str(tmp_path / "again")  # db stays open read-only in this process
    folder2lmdb.convert(mixed, again, workers=2, progress=False, cap=Cap(None, 90, every=True))
    unfinished(again, mixed, {"max_side": None, "quality": 90, "reencode": "all"})
    with pytest.raises(conversion.ConversionError,
                       match="no --max-side --quality 90 --reencode-all then, no "
                             "--max-side --quality 90 now"):
        folder2lmdb.convert(mixed, again, workers=2, progress=False, cap=Cap(None, 90))
    folder2shards.convert(mixed, str(shards), workers=2, progress=False, max_per_shard=5,
                          cap=Cap(None, 90, every=True))
    index = ShardIndex.from_json((shards / INDEX_NAME).read_text())
    assert index.cap == {"max_side": None, "quality": 90, "reencode": "all"}
    assert folder2shards.verify(str(shards), mixed, workers=2).total == 0


def test_reencode_all_on_the_odd_corpus_keeps_pixels_as_stored(tmp_path):
    """Every EXIF orientation, CMYK, grayscale, a PNG named .JPEG, 56 and 2,400 px, 1:3 and 3:1,
    progressive: each stored as a baseline RGB JPEG at --quality, its pixels as stored (EXIF
    orientation never applied: the loaders' rule, docs/loaders.md) up to the re-encoding's loss,
    the 2,400 px one capped; the store verifies against its source."""
    from tests.helpers.oddities import stored_pixels, write_odd_folder

    root = str(tmp_path / "odd")
    written = write_odd_folder(root)
    db = str(tmp_path / "db")
    cap = Cap(512, 90, every=True)
    train = os.path.join(root, "train")
    summary = folder2lmdb.convert(train, db, workers=2, progress=False, cap=cap)
    assert summary.images == summary.reencoded == len(written["train"])
    assert folder2lmdb.verify(db, train, workers=2).total == 0
    sources = [open(s.path, "rb").read() for s in list_sources(train).files]  # record order
    with codec.open_readonly(db).begin() as txn:
        records = [codec.decode_record(txn.get(codec.record_key(i)))[0]
                   for i in range(len(sources))]
    for source, data in zip(sources, records):
        with Image.open(io.BytesIO(data)) as im, Image.open(io.BytesIO(source)) as src:
            assert im.format == "JPEG" and im.mode == "RGB" and "progressive" not in im.info
            assert im.size == cap.scaled_size(src.size)
            if cap.exceeds(src.size):
                continue
        stored, original = stored_pixels(data).astype(int), stored_pixels(source).astype(int)
        error = np.abs(stored - original).mean()  # quality 90's loss (noisy pictures: ~13)
        moved = [np.abs(stored - m).mean() for m in (original[::-1, ::-1], original[:, ::-1],
                                                     original[::-1])]
        assert error < 0.5 * min(moved)  # not turned or flipped by an EXIF tag
