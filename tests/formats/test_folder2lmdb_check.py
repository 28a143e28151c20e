"""``--check full`` (the default) and ``--check header`` of folder2lmdb.py and folder2shards.py:
what each finds, that one complete libjpeg-turbo decode rejects whatever PIL's decode rejected,
and that a resume never mixes the two."""
import io
import os
import random
import sys

import numpy as np
import pytest
from PIL import Image

import decode.libraries
import folder2lmdb
import folder2shards
from formats import images as image_check
from formats.sources import list_sources
from formats.conversion import fingerprint
from tests.helpers import warm
from tests.helpers.paths import REPO


def _jpeg(seed: int, size: int = 48, **kwargs) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="JPEG", quality=90, **kwargs)
    return out.getvalue()


def _stray_marker(data: bytes) -> bytes:
    """A second SOF marker inside the entropy-coded data: the markers before the scan parse and
    the file ends in EOI, but no decoder reads it through."""
    middle = (data.index(b"\xff\xda") + len(data)) // 2
    return data[:middle] + b"\xff\xc0\x00\x11" + data[middle:]


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """A class folder with good files and each kind of damage; rel path -> data."""
    root = tmp_path_factory.mktemp("check") / "src"
    good = _jpeg(0)
    files = {
        "n01/good.JPEG": good,
        "n01/trailing_bytes.JPEG": good + bytes(100),   # valid: libjpeg stops at EOI
        "n01/progressive.JPEG": _jpeg(1, progressive=True),
        "n01/truncated.JPEG": good[:len(good) * 2 // 3],
        "n01/stray_marker.JPEG": _stray_marker(good),
        "n01/text.JPEG": b"not an image\n" * 10,
        "n02/good.JPEG": _jpeg(2),
    }
    for rel, data in files.items():
        os.makedirs(root / os.path.dirname(rel), exist_ok=True)
        (root / rel).write_bytes(data)
    return str(root), files


def _skipped(report: str) -> dict:
    with open(report, encoding="utf-8") as f:
        return dict(line.rstrip("\n").split("\t") for line in list(f)[1:])


def test_full_check_skips_every_damaged_file(damaged, tmp_path):
    root, files = damaged
    summary = folder2lmdb.convert(root, str(tmp_path / "db"), progress=False, workers=2)
    skipped = _skipped(summary.report)
    assert set(skipped) == {"n01/truncated.JPEG", "n01/stray_marker.JPEG", "n01/text.JPEG"}
    assert "truncated" in skipped["n01/truncated.JPEG"]
    assert summary.images == 4 and summary.reencoded == 1


def test_header_check_skips_only_what_headers_find(damaged, tmp_path):
    root, files = damaged
    summary = folder2lmdb.convert(root, str(tmp_path / "db"), progress=False, workers=2,
                                  check="header")
    skipped = _skipped(summary.report)
    # A truncated file lacks its final EOI, so it is decoded and found; the stray marker is not.
    assert set(skipped) == {"n01/truncated.JPEG", "n01/text.JPEG"}
    assert summary.images == 5 and summary.reencoded == 1


def test_header_check_decodes_only_jpegs_without_a_final_eoi(monkeypatch):
    decoded = []
    monkeypatch.setattr(decode.libraries, "decode_jpeg_luma", decoded.append)
    good = _jpeg(3)
    assert image_check.check_image(good, "header").data == good
    assert decoded == []
    assert image_check.check_image(good + b"\0", "header").data == good + b"\0"
    assert decoded == [good + b"\0"]
    image_check.check_image(good)  # full: always
    assert decoded[-1] == good


def test_full_check_rejects_whatever_pil_rejects():
    """Damaged variants of a JPEG (cuts, flipped bytes, zeroed runs, stray markers): the one
    libjpeg-turbo decode of the full check rejects each one PIL's complete decode rejects."""
    rng = random.Random(0)
    good = _jpeg(4, size=64)
    variants = [good[:rng.randrange(100, len(good))] for _ in range(15)] + [good[:-2]]
    for _ in range(25):
        data = bytearray(good)
        for _ in range(rng.choice([1, 4, 16])):
            data[rng.randrange(300, len(data))] = rng.randrange(256)
        variants.append(bytes(data))
    variants += [_stray_marker(good), good[:400] + bytes(300) + good[700:]]
    pil_rejects = 0
    for data in variants:
        try:
            image_check._decode(data)
        except image_check.NotAnImage:
            pil_rejects += 1
            with pytest.raises(image_check.NotAnImage):
                image_check.check_image(data)
    assert pil_rejects >= 10  # the variants do exercise the decoders' error paths


def test_resume_needs_the_same_check(tiny):
    listing = list_sources(os.path.join(tiny.root, "train"))
    assert fingerprint(listing, "full") != fingerprint(listing, "header")
    assert fingerprint(listing) == fingerprint(listing, "full")


def test_bad_check_is_one_line(tiny, tmp_path):
    with pytest.raises(folder2lmdb.ConversionError, match="check must be one of full, header"):
        folder2lmdb.convert(os.path.join(tiny.root, "train"), str(tmp_path / "db"),
                            progress=False, check="pixels")
    done = warm.run([sys.executable, "folder2lmdb.py", "-d", tiny.root, "-o",
                           str(tmp_path / "db"), "--check", "pixels"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "invalid choice: 'pixels'" in done.stderr
    assert "Traceback" not in done.stderr


def test_verify_finds_what_header_check_let_through_and_shards_take_the_check(damaged,
                                                                              tmp_path):
    root, _ = damaged
    db = str(tmp_path / "db")
    assert folder2lmdb.main(["-d", root, "-o", db, "--check", "header", "-j", "2"]) == 0
    result = folder2lmdb.verify(db)  # decodes every record: the stray marker's fails
    assert result.total == 1 and len(result.problems) == 1
    out = str(tmp_path / "shards")
    assert folder2shards.main(["-d", root, "-o", out, "--check", "header", "-j", "2"]) == 0
    assert set(_skipped(os.path.join(out, "skipped.tsv"))) == {"n01/truncated.JPEG",
                                                               "n01/text.JPEG"}


def test_full_check_decodes_luma_only(monkeypatch):
    """--check full refuses through decode_jpeg_luma (the loaders' library, luma only: same
    refusals as its RGB decode_jpeg, tests/decode/test_libraries.py), never through the RGB decode."""
    from decode import libraries

    def refuse(data):
        raise RuntimeError("refused by the luma decode")

    good = _jpeg(5)
    monkeypatch.setattr(libraries, "decode_jpeg", refuse)
    assert image_check.check_image(good).data == good
    monkeypatch.setattr(libraries, "decode_jpeg_luma", refuse)
    with pytest.raises(image_check.NotAnImage, match="refused by the luma decode"):
        image_check.check_image(good)


@pytest.mark.parametrize("count,ahead", [(0, 16), (1, 16), (37, 16), (37, 3), (64, 1000)])
def test_check_files_yields_every_result_in_order(damaged, count, ahead):
    """Whatever the count (not a multiple of the task size) and the look-ahead, the results are
    check_file's, in the order of the paths."""
    root, files = damaged
    rels = sorted(files)
    paths = [os.path.join(root, rels[i % len(rels)]) for i in range(count)]
    assert list(image_check.check_files(paths, workers=3, ahead=ahead)) == \
        [image_check.check_file(p) for p in paths]


def test_check_files_stops_when_closed(damaged, monkeypatch):
    """Closing the generator early (a --strict error) cancels what is queued: no hang, and
    the pool does not run the rest."""
    root, _ = damaged
    calls, original = [], image_check.check_file
    monkeypatch.setattr(image_check, "check_file",
                        lambda path, *rest: calls.append(path) or original(path, *rest))
    results = image_check.check_files([os.path.join(root, "n01/good.JPEG")] * 400,
                                       workers=2, ahead=16)
    assert isinstance(next(results), image_check.Checked)
    results.close()
    assert len(calls) <= 16 + image_check.TASK_FILES
