"""The folder loader lists class folders as the converters do: a tree copied from a Mac trains
with ``main.py`` and converts to the same samples, and a file that is no image is named in words."""
import os
import shutil
import struct

from torchvision import datasets

import folder2lmdb
from formats.conversion import REPORT_NAME
from formats.lmdb import read_meta
from loaders.readers.folder import open_reader
from tests.helpers.runs import SMALL, cli_in_process


def apple_double() -> bytes:
    """What Finder writes as ``._NAME`` beside a file copied to a non-Apple disk: AppleDouble
    version 2 (RFC 1740: magic 00 05 16 07, filler "Mac OS X"), a Finder Info entry carrying the
    extended attributes' "ATTR" block and an empty resource fork, 4,096 bytes."""
    header = struct.pack(">II16sH", 0x00051607, 0x00020000, b"Mac OS X        ", 2)
    entries = struct.pack(">III", 9, 50, 3760) + struct.pack(">III", 2, 3810, 286)
    attrs = b"ATTR" + struct.pack(">IIIII", 0, 3794, 156, 0, 0) + b"com.apple.quarantine\0"
    finder = (b"\0" * 32 + b"\0\0" + attrs).ljust(3760, b"\0")
    fork = (struct.pack(">IIII", 256, 256, 0, 30)
            + b"This resource fork intentionally left blank".ljust(240, b" ") + bytes(30))
    return header + entries + finder + fork


def mac_copy(root: str, to: str) -> str:
    """``root`` copied as a Mac copies it to a USB disk: ``._NAME`` beside every file, a
    ``.DS_Store`` in every folder, Spotlight's hidden folder at the top."""
    shutil.copytree(root, to)
    blob = apple_double()
    assert len(blob) == 4096 and blob[:4] == b"\x00\x05\x16\x07"
    for folder, _, names in os.walk(to):
        for name in names:
            with open(os.path.join(folder, "._" + name), "wb") as f:
                f.write(blob)
        with open(os.path.join(folder, ".DS_Store"), "wb") as f:
            f.write(b"\0\0\0\1Bud1" + bytes(6136))
    os.makedirs(os.path.join(to, "train", ".Spotlight-V100", "Store-V2"))
    return to


def test_samples_and_labels_are_image_folders_on_a_plain_tree(tiny):
    for split in ("train", "val"):
        root = os.path.join(tiny.root, split)
        ours, ref = open_reader(root), datasets.ImageFolder(root)
        assert ours.classes == ref.classes and ours.class_to_idx == ref.class_to_idx
        assert ours.samples == ref.samples


def test_mac_copied_folder_trains_and_converts_to_the_same_samples(tiny, tmp_path, capfd):
    mac = mac_copy(tiny.root, str(tmp_path / "mac"))
    for split in ("train", "val"):
        reader = open_reader(os.path.join(mac, split))
        summary = folder2lmdb.convert(os.path.join(mac, split), str(tmp_path / "db" / split),
                                      progress=False)
        plain = datasets.ImageFolder(os.path.join(tiny.root, split))
        assert len(reader) == summary.images == read_meta(str(tmp_path / "db" / split)).count \
            == len(plain)
        assert [label for _, label in reader.samples] == plain.targets
        assert summary.skipped == 0  # the hidden files are not candidates, so never skipped
    run = cli_in_process([mac, *SMALL, "--epochs", "1", "--output-dir", str(tmp_path / "out")],
                         capfd)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "warning" not in run.stderr
    assert "4 train / 2 val batches of 8" in run.stdout + run.stderr  # 32 and 16 images, not twice


def test_a_file_that_is_no_image_is_named_in_words(tiny, tmp_path, capfd):
    root = shutil.copytree(tiny.root, str(tmp_path / "data"), ignore=shutil.ignore_patterns("lmdb"))
    train = os.path.join(root, "train")
    first = sorted(os.listdir(train))[0]
    with open(os.path.join(train, first, "finder.JPEG"), "wb") as f:
        f.write(apple_double())  # an AppleDouble file renamed: not hidden any more
    words = "not an image: starts with 00 05 16 07, a macOS AppleDouble file"
    run = cli_in_process([root, *SMALL, "--epochs", "1", "--max-bad-share", "0.1",
                          "--output-dir", str(tmp_path / "out")], capfd)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"finder.JPEG: UnidentifiedImageError: {words}" in run.stderr
    assert "object at 0x" not in run.stderr
    out = str(tmp_path / "db")
    assert folder2lmdb.convert(train, out, progress=False).images == 32
    with open(os.path.join(out, REPORT_NAME)) as f:
        assert words in f.read()


def test_what_else_lands_in_a_class_folder_is_named_by_its_first_bytes():
    from decode.messages import not_an_image

    named = {b"\0\0\0\1Bud1" + bytes(60): "00 00 00 01, a macOS .DS_Store file",
             bytes.fromhex("d0cf11e0a1b11ae1") + bytes(60): "D0 CF 11 E0, an OLE2 file (Windows'",
             b"PK\3\4" + bytes(60): "50 4B 03 04, a zip archive",
             b"  <html><body>Not found</body></html>": "20 20 3C 68, an HTML page",
             b"n01440764 tench\n": "6E 30 31 34, text",
             bytes(range(7, 70)): "07 08 09 0A"}
    for data, words in named.items():
        assert not_an_image(data).startswith(f"not an image: starts with {words}"), data[:8]
    assert not_an_image(bytes(range(7, 70))) == "not an image: starts with 07 08 09 0A"
    assert not_an_image(b"") == "not an image: an empty file"
