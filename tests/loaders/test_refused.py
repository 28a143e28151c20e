"""The acceptance rule in every loader (``decode.acceptance``): a 65,000 x 65,000-claiming JPEG
and a one-bit height flip, made from an ImageNet-sized JPEG (``tests/helpers/badcorpus.py``),
among good images in a folder, an LMDB and shards whose records were damaged after conversion
(as on a failing disk: the converter's check never saw them): every reader x pipeline skips
each with one named line giving the converters' reason, never decodes it, and names once, never
prints raw, what libjpeg says about a kept image whose data ends early."""
import os
import re

import pytest

import folder2lmdb
import folder2shards
import loaders
from decode.acceptance import Refused, check
from formats.images import check_file
from loaders import DistInfo
from tests.helpers.badcorpus import refused_images
from tests.helpers.loading import loader_settings, to_uint8
from tools.datagen import label_from_pixels, make_split

READERS = ["folder", "lmdb", "shards"]
PIPELINES = ["workers"]
for module, pipeline in (("nvidia.nvimgcodec", "gpu_decode"), ("nvidia.dali", "dali")):
    try:
        __import__(module)
        PIPELINES.append(pipeline)
    except ImportError:
        pass
CLASS = "n00000001"  # the damaged files' class; their pixels would not give its label


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """``{reader: data root}``: 4 classes of generated images, and in ``CLASS`` of each split
    the three damaged files of :func:`refused_images`, written as their originals, converted,
    then edited in place in the folder, the LMDB's data file and the shards' tar files."""
    root = str(tmp_path_factory.mktemp("refused"))
    folder = os.path.join(root, "folder")
    damaged = refused_images()
    for split, seed in (("train", 0), ("val", 1)):
        make_split(os.path.join(folder, split), 4, 6, seed=seed)
        for name, (original, _, _) in damaged.items():
            with open(os.path.join(folder, split, CLASS, f"{name}.JPEG"), "wb") as f:
                f.write(original)
        for tool, out in ((folder2lmdb, "lmdb"), (folder2shards, "shards")):
            tool.convert(os.path.join(folder, split), os.path.join(root, out, split),
                         progress=False, workers=2)
    for dirpath, _, files in os.walk(root):
        for file in files:
            if file.endswith((".JPEG", ".mdb", ".tar")):
                _edit(os.path.join(dirpath, file), damaged)
    return {"folder": folder, "lmdb": os.path.join(root, "lmdb"),
            "shards": os.path.join(root, "shards")}


def _edit(path: str, damaged: dict) -> None:
    """Each original image's bytes in ``path`` replaced by its damaged twin (the same length:
    only its frame header differs), as a bad disk would change them."""
    with open(path, "rb") as f:
        data = f.read()
    name = os.path.basename(path).removesuffix(".JPEG")
    if path.endswith(".JPEG"):
        edited = damaged[name][1] if name in damaged else data
    else:
        edited = data
        for original, bad, _ in damaged.values():
            edited = edited.replace(original, bad, 1)
    if edited != data:
        with open(path, "wb") as f:
            f.write(edited)


def _loaders(stores, reader, pipeline):
    settings = loader_settings(
        "dali" if pipeline == "dali" else reader, data=stores[reader], lmdb=reader == "lmdb",
        shards=reader == "shards", workers=2, max_bad_share=0.5,
        decode_device="cpu-nvimgcodec" if pipeline == "gpu_decode" else "cpu")
    assert (settings.source, settings.pipeline) == (reader, pipeline)
    return loaders.build_loaders(settings, DistInfo())


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("reader", READERS)
def test_every_loader_skips_a_bomb_and_a_flipped_height_with_one_named_line(
        stores, reader, pipeline, capfd):
    train, val = _loaders(stores, reader, pipeline)
    capfd.readouterr()
    for epoch in range(3):
        train.set_epoch(epoch)
        for images, labels in train:
            good = [label_from_pixels(image, 4) for image in to_uint8(images)]
            assert all(g == l or l == 1 for g, l in zip(good, labels.tolist()))
        assert sum(len(labels) for _, labels in val) == 4 * 6 + 3
    loaders.close_all(train, val)
    err = capfd.readouterr().err
    for split in (train, val):
        assert split.unreadable.count() == 2
    assert len(err.splitlines()) >= 4  # LMDB and shards name records, not files: by reason
    assert len([line for line in err.splitlines() if "keeping damaged sample" in line]) <= 2
    for name, (_, damaged, reason) in refused_images().items():
        if reason is None:  # kept: named at most once per split, as kept (above)
            continue
        lines = [line for line in err.splitlines() if reason in line]
        assert len(lines) == 2, (name, err)  # once for each split
        with pytest.raises(Refused) as refused:
            check(damaged)
        for line in lines:
            assert line.startswith("warning: skipping unreadable sample ")
            assert line.endswith(f"Refused: {refused.value}")
            assert reader != "folder" or f"{name}.JPEG" in line
    assert not re.search(r"^(Corrupt JPEG data|\S*\[(ERROR|WARNING)\])", err, re.M), err


def test_converters_refuse_the_same_files_for_the_same_reasons(tmp_path):
    """What folder2lmdb.py writes in skipped.tsv for each file is what the loaders print."""
    for name, (_, damaged, reason) in refused_images().items():
        path = tmp_path / f"{name}.JPEG"
        path.write_bytes(damaged)
        checked = check_file(str(path))
        if reason is None:
            assert "premature end of data segment" in checked.warning
            continue
        with pytest.raises(Refused) as refused:
            check(damaged)
        assert checked == str(refused.value) and checked.startswith(reason)


def test_the_pixel_limit_is_the_flag(stores):
    """``--max-image-pixels 0`` lifts the limit; the bomb is then still refused, as a frame
    its 31 KB cannot hold; a lower limit refuses the good images too."""
    bomb = refused_images()["bomb"][1]
    with pytest.raises(Refused, match="damaged header"):
        check(bomb, 0)
    settings = loader_settings("folder", data=stores["folder"], max_image_pixels=1000,
                               max_bad_share=1.0)
    train, _ = loaders.build_loaders(settings, DistInfo())
    with pytest.raises(loaders.DataError, match="failed to decode"):
        list(train)
