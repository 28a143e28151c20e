"""Every ImageNet download layout (:mod:`formats.sources`), as replicas of the sample (the real
one where present, else the stand-in; ``tools/replicas.py``), converts to the same LMDB and the
same shards, record for record and byte for byte, as the same images in class folders;
``--verify`` passes across layouts; and a damaged or incomplete download ends in one line naming
the file, resumably."""
from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile

import pytest

import folder2lmdb
import folder2shards
import formats.lmdb as codec
import formats.sources
from formats.sources import DatasetError, detect, open_dataset
from tools import replicas

LAYOUTS = ["official", "kaggle", "hf-parquet", "hf-targz"]
WRITERS = {"official": replicas.write_official, "kaggle": replicas.write_kaggle,
           "hf-parquet": replicas.write_hf_parquet, "hf-targz": replicas.write_hf_targz}
DETECTED = {"official": "imagenet tars", "kaggle": "kaggle", "hf-parquet": "huggingface",
            "hf-targz": "huggingface"}
SEED = {"train": 0, "val": None}  # as make convert-imagenet converts them


@pytest.fixture(scope="session")
def downloads(sample_images, tmp_path_factory):
    """Each layout's replica, and the class folders they must equal: ``reference[split]``."""
    root = tmp_path_factory.mktemp("downloads")
    built = {name: write(str(root / name), sample_images) for name, write in WRITERS.items()}
    reference = {"train": os.path.join(sample_images, "train"),
                 "val": replicas.write_valprep(str(root / "valprep"), sample_images)}
    return built, reference


def images(downloads) -> int:
    """How many images each split of the replicas holds (one per class)."""
    return len(os.listdir(downloads[1]["train"]))


@pytest.fixture(scope="session")
def reference_outputs(downloads, tmp_path_factory):
    """LMDB and shards of the class folders, per split."""
    _, reference = downloads
    root = tmp_path_factory.mktemp("reference")
    outputs = {}
    for split, folder in reference.items():
        db, shards = str(root / f"{split}.lmdb"), str(root / f"{split}.shards")
        folder2lmdb.convert(folder, db, workers=2, progress=False, shuffle_seed=SEED[split])
        folder2shards.convert(folder, shards, workers=2, progress=False, prefix=split,
                              max_per_shard=64)
        outputs[split] = db, shards
    return outputs


def lmdb_contents(db: str) -> tuple[codec.Metadata, dict[bytes, bytes]]:
    """The metadata and every key and value of a database."""
    meta = codec.read_meta(db)
    with codec.open_readonly(db).begin() as txn:
        items = dict(txn.cursor())
    codec.close_readonly(db)
    return meta, items


def shard_files(folder: str) -> dict[str, str]:
    """SHA-256 of every shard, ``.idx`` and the report in a shard folder."""
    return {name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(folder))
            if name.endswith((".tar", ".idx", ".tsv"))}


@pytest.mark.parametrize("split", ["train", "val"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_is_detected_and_converts_record_for_record(layout, split, downloads,
                                                           reference_outputs, tmp_path):
    built, _ = downloads
    assert detect(built[layout], split)[0] == DETECTED[layout]
    ref_db, ref_shards = reference_outputs[split]
    db, shards = str(tmp_path / "db"), str(tmp_path / "shards")
    folder2lmdb.convert(built[layout], db, workers=2, progress=False, shuffle_seed=SEED[split],
                        split=split, allow_partial=True)
    (meta, items), (ref_meta, ref_items) = lmdb_contents(db), lmdb_contents(ref_db)
    assert (meta.count, meta.classes, meta.shuffle_seed) == \
        (ref_meta.count, ref_meta.classes, ref_meta.shuffle_seed)
    assert (meta.count, meta.shuffle_seed) == (images(downloads), SEED[split])
    assert meta.names[0] == "tench" and ref_meta.names is None  # names kept where known
    del items[codec.META_KEY], ref_items[codec.META_KEY]
    assert items == ref_items  # every record and the checksums, byte for byte
    folder2shards.convert(built[layout], shards, workers=2, progress=False, split=split,
                          allow_partial=True, max_per_shard=64)
    assert shard_files(shards) == shard_files(ref_shards)
    assert not os.path.exists(shards + ".staging") and not os.path.exists(db + ".staging")


@pytest.mark.parametrize("layout, split", [("official", "train"), ("hf-parquet", "val")])
def test_verify_across_layouts(layout, split, downloads, reference_outputs, tmp_path):
    """A database written from an archive verifies against the class folders, and one written
    from the class folders verifies against the archive (staged for Parquet)."""
    built, reference = downloads
    db = str(tmp_path / "db")
    folder2lmdb.convert(built[layout], db, workers=2, progress=False, shuffle_seed=SEED[split],
                        split=split, allow_partial=True)
    assert folder2lmdb.main(["--verify", db, "--dataset", reference[split]]) == 0
    ref_db, ref_shards = reference_outputs[split]
    assert folder2lmdb.main(["--verify", ref_db, "--dataset", built[layout], "--split",
                             split]) == 0
    assert folder2shards.main(["--verify", ref_shards, "--dataset", built[layout], "--split",
                               split]) == 0
    assert not [n for n in os.listdir(tmp_path) if "staging" in n]


def test_verify_against_the_archive_names_a_changed_image(downloads, reference_outputs,
                                                          tmp_path, capsys):
    built, _ = downloads
    official = shutil.copytree(built["official"], str(tmp_path / "official"))
    listing = open_dataset(official, "train", allow_partial=True)
    src = listing.files[7]
    with open(src.path, "r+b") as f:  # one byte of one JPEG inside its class tar, in place
        f.seek(src.offset + src.size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    ref_db, _ = reference_outputs["train"]
    assert folder2lmdb.main(["--verify", ref_db, "--dataset", official, "--split", "train"]) == 1
    assert src.rel in capsys.readouterr().err


def _one_line_error(capsys, argv, prog=folder2lmdb) -> str:
    assert prog.main(argv) == 1
    lines = [line for line in capsys.readouterr().err.strip().splitlines()
             if ": source: " not in line]
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    return lines[0]


def test_truncated_train_tar_is_one_line_and_a_rerun_after_the_fix_resumes(
        downloads, reference_outputs, tmp_path, capsys, monkeypatch):
    built, _ = downloads
    official = shutil.copytree(built["official"], str(tmp_path / "official"))
    tar, saved = os.path.join(official, "ILSVRC2012_img_train.tar"), str(tmp_path / "saved.tar")
    shutil.copy2(tar, saved)
    db = str(tmp_path / "db")
    argv = ["-d", official, "--split", "train", "-o", db, "--allow-partial", "--shuffle-seed",
            "0", "-j", "2", "--batch-size", "8"]
    commits = []
    real = folder2lmdb.convert.__globals__["_commit_after"]

    def interrupt(*args):  # the process dies after 3 committed batches
        files = real(*args)
        commits.append(1)
        if len(commits) == 3:
            raise KeyboardInterrupt
        return files

    monkeypatch.setattr("formats.lmdb._convert._commit_after", interrupt)
    with pytest.raises(KeyboardInterrupt):
        folder2lmdb.main(argv)
    monkeypatch.undo()
    with open(tar, "r+b") as f:
        f.truncate(os.path.getsize(tar) // 2)
    line = _one_line_error(capsys, argv)
    assert line.startswith("folder2lmdb.py: error: ") and tar in line and "truncated" in line
    with pytest.raises(codec.LMDBFormatError, match="did not finish"):
        codec.read_meta(db)  # nothing left as if complete
    shutil.copy2(saved, tar)  # the download fixed: same bytes, same size and mtime
    summary = folder2lmdb.convert(official, db, workers=2, progress=False, shuffle_seed=0,
                                  split="train", allow_partial=True, batch_size=8)
    n = images(downloads)
    assert 24 <= summary.resumed_at < n and summary.images == n
    items, ref_items = lmdb_contents(db)[1], lmdb_contents(reference_outputs["train"][0])[1]
    del items[codec.META_KEY], ref_items[codec.META_KEY]
    assert items == ref_items


def test_ground_truth_one_line_short_names_the_file(downloads, tmp_path, capsys):
    built, _ = downloads
    official = shutil.copytree(built["official"], str(tmp_path / "official"))
    devkit = os.path.join(official, "ILSVRC2012_devkit_t12.tar.gz")
    shutil.unpack_archive(devkit, official)
    os.remove(devkit)  # the devkit extracted: read from its folder
    truth = os.path.join(official, "ILSVRC2012_devkit_t12", "data",
                         "ILSVRC2012_validation_ground_truth.txt")
    lines = open(truth).readlines()
    open(truth, "w").writelines(lines[:-1])
    argv = ["-d", official, "--split", "val", "-o", str(tmp_path / "db"), "--allow-partial"]
    line = _one_line_error(capsys, argv)
    n = images(downloads)
    assert f"ILSVRC2012_validation_ground_truth.txt has {n - 1} labels for the {n} images" in line
    assert not os.path.exists(tmp_path / "db")
    open(truth, "w").writelines(lines)
    assert folder2lmdb.main(argv) == 0


def test_parquet_without_a_label_column_names_the_file(downloads, tmp_path, capsys):
    import pyarrow.parquet as pq

    built, _ = downloads
    hf = shutil.copytree(built["hf-parquet"], str(tmp_path / "hf"))
    path = os.path.join(hf, "data", "train-00001-of-00002.parquet")
    pq.write_table(pq.read_table(path).drop_columns(["label"]), path)
    line = _one_line_error(capsys, ["-d", hf, "--split", "train", "-o", str(tmp_path / "out"),
                                    "--allow-partial"], folder2shards)
    assert f"{path}: no column 'label'" in line


def test_csv_naming_an_unknown_wnid_names_the_file_and_line(downloads, tmp_path, capsys):
    built, _ = downloads
    kaggle = str(tmp_path / "kaggle")
    shutil.copytree(built["kaggle"], kaggle, symlinks=True)
    csv = os.path.join(kaggle, "LOC_val_solution.csv")
    rows = open(csv).readlines()
    rows[5] = rows[5].replace(rows[5].split(",")[1].split()[0], "n99999999")
    open(csv, "w").writelines(rows)
    line = _one_line_error(capsys, ["-d", kaggle, "--split", "val", "-o", str(tmp_path / "db"),
                                    "--allow-partial"])
    assert f"{csv}: line 6: n99999999 is not in LOC_synset_mapping.txt" in line


def test_known_counts_name_what_is_missing(sample_images, downloads, tmp_path, capsys,
                                           monkeypatch):
    """Without --allow-partial a known layout must be all of ImageNet: the sample's replica is
    250 (the stand-in's 64) of 1,281,167 images; with the counts declared as the replica's, a
    missing class tar is named."""
    built, _ = downloads
    n = images(downloads)
    line = _one_line_error(capsys, ["-d", built["official"], "--split", "train", "-o",
                                    str(tmp_path / "db")])
    assert f"{n} classes, ImageNet has 1,000; {n} train images, ImageNet has 1,281,167" in line
    monkeypatch.setitem(formats.sources.EXPECTED, "train", n)
    monkeypatch.setitem(formats.sources.EXPECTED, "classes", n)
    assert len(open_dataset(built["official"], "train").files) == n
    official = replicas.write_official(str(tmp_path / "official"), sample_images)
    tar = os.path.join(official, "ILSVRC2012_img_train.tar")
    members = replicas.tar_members_of(tar)
    replicas.rewrite_tar(tar, [m for m in members if m[0] != "n01440764.tar"])
    with pytest.raises(DatasetError, match=rf"no images of class n01440764\.tar; {n - 1} train "
                                           rf"images, ImageNet has {n}"):
        open_dataset(official, "train")


def test_a_download_folder_without_a_split_is_one_line(downloads, tmp_path, capsys):
    built, _ = downloads
    line = _one_line_error(capsys, ["-d", built["kaggle"], "-o", str(tmp_path / "db")])
    assert "give --split train or val" in line
    line = _one_line_error(capsys, ["-d", str(tmp_path), "--split", "val", "-o",
                                    str(tmp_path / "db")])
    assert "found no val split" in line


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="GNU make not installed")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_make_convert_imagenet_reads_each_download(layout, downloads, reference_outputs,
                                                  tmp_path):
    """``make convert-imagenet IMAGENET=<the download> OUT=...`` as a user runs it (the
    venv's install step taken as done)."""
    from tests.helpers.runs import make

    built, _ = downloads
    out = str(tmp_path / "out")
    result = make("-o", ".venv/.installed", "convert-imagenet", f"IMAGENET={built[layout]}",
                  f"OUT={out}", "ALLOW_PARTIAL=1", "JOBS=2")
    assert result.returncode == 0, result.stderr
    assert f"source: {open_dataset(built[layout], 'val', True).layout}" in result.stderr
    for split in ("train", "val"):
        items, ref_items = (lmdb_contents(db)[1] for db in
                            (os.path.join(out, split), reference_outputs[split][0]))
        del items[codec.META_KEY], ref_items[codec.META_KEY]
        assert items == ref_items


def test_odd_files_inside_the_train_tar_are_reencoded_as_from_folders(sample_images, tmp_path):
    """ImageNet's train has one PNG and 22 CMYK JPEGs named ``.JPEG``
    (``n02105855_2933.JPEG``, ``n01739381_1309.JPEG``, ...): read from inside the class tars
    they get the same content checks and re-encoding as from the extracted folders."""
    import io

    from PIL import Image

    odd = tmp_path / "odd"
    for wnid, name, path in replicas.train_images(sample_images)[:6]:
        os.makedirs(odd / "train" / wnid, exist_ok=True)
        shutil.copy(path, odd / "train" / wnid / name)
    first = replicas.train_images(sample_images)[0]
    image = Image.open(first[2]).convert("RGB")
    png, cmyk = io.BytesIO(), io.BytesIO()
    image.save(png, format="PNG")
    image.convert("CMYK").save(cmyk, format="JPEG", quality=90)
    (odd / "train" / first[0] / f"{first[0]}_2933.JPEG").write_bytes(png.getvalue())
    (odd / "train" / first[0] / f"{first[0]}_1309.JPEG").write_bytes(cmyk.getvalue())
    official = replicas.write_official(str(tmp_path / "official"), str(odd))
    dbs = []
    for dataset, split in ((str(odd / "train"), None), (official, "train")):
        dbs.append(str(tmp_path / f"db{len(dbs)}"))
        summary = folder2lmdb.convert(dataset, dbs[-1], workers=2, progress=False,
                                      shuffle_seed=0, split=split, allow_partial=True)
        assert (summary.images, summary.reencoded, summary.skipped) == (8, 2, 0)
    (_, items), (_, ref_items) = lmdb_contents(dbs[1]), lmdb_contents(dbs[0])
    del items[codec.META_KEY], ref_items[codec.META_KEY]
    assert items == ref_items


def test_partly_extracted_official_files_convert_the_same(downloads, reference_outputs,
                                                         tmp_path):
    """The train tar unpacked into a folder of class tars, the val tar unpacked flat and the
    devkit extracted: read as the archives are."""
    built, _ = downloads
    root = tmp_path / "in1k"
    for name, target in (("ILSVRC2012_img_train.tar", "ILSVRC2012_img_train"),
                         ("ILSVRC2012_img_val.tar", "val"),
                         ("ILSVRC2012_devkit_t12.tar.gz", ".")):
        shutil.unpack_archive(os.path.join(built["official"], name), str(root / target))
    for split in ("train", "val"):
        assert detect(str(root), split)[0] == "imagenet tars"
        db = str(tmp_path / split)
        folder2lmdb.convert(str(root), db, workers=2, progress=False, shuffle_seed=SEED[split],
                            split=split, allow_partial=True)
        items, ref_items = lmdb_contents(db)[1], lmdb_contents(reference_outputs[split][0])[1]
        del items[codec.META_KEY], ref_items[codec.META_KEY]
        assert items == ref_items


def test_classes_py_as_hugging_face_writes_it(tmp_path):
    """``IMAGENET2012_CLASSES = OrderedDict({...})`` (the repository's form) is read as a
    literal; unsorted WNIDs are refused."""
    from formats.sources.huggingface import read_classes_py

    (tmp_path / "classes.py").write_text(
        'from collections import OrderedDict\n\nIMAGENET2012_CLASSES = OrderedDict(\n'
        '    {\n        "n01440764": "tench, Tinca tinca",\n'
        '        "n01443537": "goldfish, Carassius auratus",\n    }\n)\n')
    assert read_classes_py(str(tmp_path)) == (["n01440764", "n01443537"],
                                              ["tench, Tinca tinca", "goldfish, Carassius auratus"])
    (tmp_path / "classes.py").write_text('IMAGENET2012_CLASSES = {"n2": "b", "n1": "a"}\n')
    with pytest.raises(DatasetError, match="not in sorted WNID order"):
        read_classes_py(str(tmp_path))


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT, tarfile.PAX_FORMAT])
def test_tar_index_equals_tarfiles_and_finds_truncation(fmt, tmp_path):
    """The tar header reader of ``formats.sources.imagenet_tars`` gives tarfile's offsets (POSIX
    prefixes, ``./`` names, folders; a long name falls back to tarfile) and calls a tar cut at a
    member boundary or inside one truncated."""
    from formats.sources.imagenet_tars import _tarfile_members, tar_members

    path = str(tmp_path / "x.tar")
    with tarfile.open(path, "w", format=fmt) as tar:
        for i in range(40):
            name = ("./" if i % 3 == 0 else "") + "d/" * (i % 4) + f"n01440764_{i}.JPEG"
            if i == 39:
                name = "long/" * 30 + name  # GNU longname / pax path / ustar prefix
            info = tarfile.TarInfo(name)
            info.size = 100 + 37 * i
            tar.addfile(info, io.BytesIO(bytes([i]) * info.size))
        folder = tarfile.TarInfo("folder")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
    fd = os.open(path, os.O_RDONLY)
    try:
        members = tar_members(path)
        assert members == _tarfile_members(fd, 0, os.path.getsize(path), path)[0]
        assert len(members) == 40 and all(os.pread(fd, 1, at) == bytes([i])
                                          for i, (_, at, _) in enumerate(members))
    finally:
        os.close(fd)
    name, at, size = members[20]
    for cut, why in ((at + size // 2, "ends inside"), (at + -(-size // 512) * 512, "no end")):
        with open(path, "r+b") as f:
            f.truncate(cut)
        with pytest.raises(DatasetError, match=f"{path}: truncated \\({why}"):
            tar_members(path)
