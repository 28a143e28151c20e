"""Small replicas of each way ImageNet is distributed (official tars, Kaggle, Hugging Face), built
from the real sample's ``train/<wnid>/<wnid>_<name>.JPEG`` (one JPEG per class), for the tests
and benchmarks of :mod:`formats.sources`. The val split is the sample's images in a fixed
pseudo-random order; class names are the ``<name>`` part of the file names.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import tarfile

# The real 250-image sample beside a development checkout (IMAGENET_SAMPLE to read it elsewhere).
SAMPLE = os.environ.get("IMAGENET_SAMPLE", os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data",
    "imagenet-sample"))


def train_images(sample: str) -> list[tuple[str, str, str]]:
    """``(wnid, file name, path)`` of the sample's train images, sorted."""
    train = os.path.join(sample, "train")
    return [(wnid, name, os.path.join(train, wnid, name)) for wnid in sorted(os.listdir(train))
            for name in sorted(os.listdir(os.path.join(train, wnid)))]


def class_names(sample: str) -> dict[str, str]:
    """``{wnid: name}`` from the sample's file names (``<wnid>_<name>.JPEG``)."""
    return {wnid: os.path.splitext(name)[0][len(wnid) + 1:].replace("_", " ")
            for wnid, name, _ in train_images(sample)}


def val_images(sample: str) -> list[tuple[str, str, str]]:
    """``(wnid, ILSVRC2012_val_%08d.JPEG, path)``: the sample's images numbered 1.. in the order
    of their SHA-256 (the official val files are not sorted by class)."""
    images = sorted(train_images(sample), key=lambda i: hashlib.sha256(i[1].encode()).digest())
    return [(wnid, f"ILSVRC2012_val_{n:08d}.JPEG", path)
            for n, (wnid, _, path) in enumerate(images, 1)]


def _bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _tar_bytes(members: list[tuple[str, bytes]], mode: str = "w") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode, format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 1_300_000_000, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def ilsvrc_ids(wnids: list[str]) -> dict[str, int]:
    """ILSVRC2012_ID (1..n) of each WNID, in an order other than the sorted one."""
    ordered = sorted(wnids, key=lambda w: hashlib.sha256(w.encode()).digest())
    return {wnid: number for number, wnid in enumerate(ordered, 1)}


def meta_mat(names: dict[str, str]) -> bytes:
    """The devkit's ``data/meta.mat`` for ``names``: a 1-column struct array ``synsets`` with
    the devkit's fields and IDs in an order other than the sorted WNIDs, plus one synset with
    children as the real table has, written by ``scipy.io.savemat``."""
    import numpy as np
    from scipy.io import savemat

    fields = ["ILSVRC2012_ID", "WNID", "words", "gloss", "num_children", "children",
              "wordnet_height", "num_train_images"]
    ids = ilsvrc_ids(list(names))
    rows = [(ids[w], w, names[w], f"a {names[w]}", 0, np.zeros((1, 0)), 0, 1)
            for w in sorted(names, key=ids.get)]
    rows.append((len(rows) + 1, "n00001740", "entity", "the top", 2,
                 np.array([[1, 2]], dtype=np.uint16), 19, 0))  # not a class: has children
    synsets = np.zeros((len(rows), 1), dtype=[(f, "O") for f in fields])
    for i, row in enumerate(rows):
        synsets[i, 0] = row
    buffer = io.BytesIO()
    savemat(buffer, {"synsets": synsets})
    return buffer.getvalue()


def write_official(root: str, sample: str = SAMPLE) -> str:
    """``ILSVRC2012_img_train.tar`` (a tar of per-class tars), ``ILSVRC2012_img_val.tar`` (flat
    ``ILSVRC2012_val_%08d.JPEG``) and ``ILSVRC2012_devkit_t12.tar.gz`` (:func:`meta_mat` and
    ``data/ILSVRC2012_validation_ground_truth.txt``) in ``root``; returns ``root``."""
    os.makedirs(root, exist_ok=True)
    by_class: dict[str, list] = {}
    for wnid, name, path in train_images(sample):
        by_class.setdefault(wnid, []).append((name, _bytes(path)))
    inner = [(f"{wnid}.tar", _tar_bytes(members)) for wnid, members in by_class.items()]
    with open(os.path.join(root, "ILSVRC2012_img_train.tar"), "wb") as f:
        f.write(_tar_bytes(inner))
    val = val_images(sample)
    with open(os.path.join(root, "ILSVRC2012_img_val.tar"), "wb") as f:
        f.write(_tar_bytes([(name, _bytes(path)) for _, name, path in val]))
    names = class_names(sample)
    ids = ilsvrc_ids(list(names))
    truth = "".join(f"{ids[wnid]}\n" for wnid, _, _ in val).encode()
    devkit = _tar_bytes([("ILSVRC2012_devkit_t12/data/meta.mat", meta_mat(names)),
                         ("ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt",
                          truth)], mode="w")
    with open(os.path.join(root, "ILSVRC2012_devkit_t12.tar.gz"), "wb") as f:
        f.write(gzip.compress(devkit, mtime=0))
    return root


def write_valprep(root: str, sample: str = SAMPLE) -> str:
    """The val images (symbolic links) in ``valprep.sh``'s layout
    ``root/<wnid>/ILSVRC2012_val_*.JPEG``, the reference a val replica must convert to."""
    for wnid, name, path in val_images(sample):
        os.makedirs(os.path.join(root, wnid), exist_ok=True)
        os.symlink(path, os.path.join(root, wnid, name))
    return root


def write_kaggle(root: str, sample: str = SAMPLE) -> str:
    """Kaggle's tree in ``root``: ``ILSVRC/Data/CLS-LOC/{train/<wnid>,val}`` (symbolic links),
    ``LOC_val_solution.csv``, ``LOC_synset_mapping.txt``; returns ``root``."""
    tree = os.path.join(root, "ILSVRC", "Data", "CLS-LOC")
    for wnid, name, path in train_images(sample):
        os.makedirs(os.path.join(tree, "train", wnid), exist_ok=True)
        os.symlink(path, os.path.join(tree, "train", wnid, name))
    os.makedirs(os.path.join(tree, "val"))
    rows = ["ImageId,PredictionString\n"]
    for wnid, name, path in val_images(sample):
        os.symlink(path, os.path.join(tree, "val", name))
        rows.append(f"{name[:-5]},{wnid} 10 20 110 220 {wnid} 5 5 50 50 \n")
    with open(os.path.join(root, "LOC_val_solution.csv"), "w") as f:
        f.writelines(rows[:1] + sorted(rows[1:], reverse=True))
    with open(os.path.join(root, "LOC_synset_mapping.txt"), "w") as f:
        f.writelines(f"{wnid} {name}\n" for wnid, name in sorted(class_names(sample).items()))
    return root


def write_classes_py(root: str, sample: str = SAMPLE) -> None:
    """Hugging Face's ``classes.py``: ``IMAGENET2012_CLASSES``, sorted WNIDs and names."""
    lines = [f'        ("{wnid}", "{name}"),\n' for wnid, name in
             sorted(class_names(sample).items())]
    with open(os.path.join(root, "classes.py"), "w") as f:
        f.write("from collections import OrderedDict\n\nIMAGENET2012_CLASSES = OrderedDict(\n"
                "    [\n" + "".join(lines) + "    ]\n)\n")


def hf_rows(sample: str, split: str) -> list[tuple[str, bytes, int]]:
    """``(image path, bytes, label)`` of a Hugging Face split, in a shuffled order; paths as
    the loading script's archives name them, ``<IMAGE_FILENAME>_<WNID>.JPEG``."""
    images = train_images(sample) if split == "train" else val_images(sample)
    label_of = {w: n for n, w in enumerate(sorted(class_names(sample)))}
    rows = [(f"{os.path.splitext(name)[0]}_{wnid}.JPEG", _bytes(path), label_of[wnid])
            for wnid, name, path in images]
    return sorted(rows, key=lambda r: hashlib.sha256(r[0].encode()).digest())


def write_hf_parquet(root: str, sample: str = SAMPLE, files: int = 2,
                     row_group: int = 40) -> str:
    """Hugging Face's Parquet revision in ``root``: ``classes.py`` and
    ``data/{train,validation}-*.parquet`` (``files`` per split; columns ``image`` {bytes, path}
    and ``label``; row groups of ``row_group`` rows); returns ``root``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    write_classes_py(root, sample)
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    for split, prefix in (("train", "train"), ("val", "validation")):
        rows = hf_rows(sample, split)
        for n in range(files):
            part = rows[n::files]
            table = pa.table({"image": pa.array([{"bytes": b, "path": p} for p, b, _ in part],
                                                type=image),
                              "label": pa.array([label for _, _, label in part], pa.int64())})
            pq.write_table(table, os.path.join(root, "data", f"{prefix}-{n:05d}-of-"
                                               f"{files:05d}.parquet"), row_group_size=row_group)
    return root


def write_hf_targz(root: str, sample: str = SAMPLE, train_files: int = 2) -> str:
    """Hugging Face's ``.tar.gz`` revision in ``root``: ``classes.py``,
    ``data/train_images_*.tar.gz`` and ``val_images.tar.gz``; returns ``root``."""
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    write_classes_py(root, sample)
    rows = hf_rows(sample, "train")
    for n in range(train_files):
        with open(os.path.join(root, "data", f"train_images_{n}.tar.gz"), "wb") as f:
            f.write(_tar_bytes([(p, b) for p, b, _ in rows[n::train_files]], mode="w:gz"))
    with open(os.path.join(root, "data", "val_images.tar.gz"), "wb") as f:
        f.write(_tar_bytes([(p, b) for p, b, _ in hf_rows(sample, "val")], mode="w:gz"))
    return root


def tar_members_of(path: str) -> list[tuple[str, bytes]]:
    """``(name, bytes)`` of each file of a tar."""
    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar if m.isreg()]


def rewrite_tar(path: str, members: list[tuple[str, bytes]]) -> None:
    """Write ``path`` again holding ``members``."""
    with open(path, "wb") as f:
        f.write(_tar_bytes(members))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Write replicas of ImageNet's downloads.")
    parser.add_argument("out", help="folder to write official/, kaggle/, hf-parquet/, "
                                    "hf-targz/ and valprep/ into")
    parser.add_argument("--sample", default=SAMPLE, help="the imagenet-sample folder")
    args = parser.parse_args(argv)
    write_official(os.path.join(args.out, "official"), args.sample)
    write_valprep(os.path.join(args.out, "valprep"), args.sample)
    write_kaggle(os.path.join(args.out, "kaggle"), args.sample)
    write_hf_parquet(os.path.join(args.out, "hf-parquet"), args.sample)
    write_hf_targz(os.path.join(args.out, "hf-targz"), args.sample)
    print(f"replicas of the {len(train_images(args.sample))} sample images in {args.out}")


if __name__ == "__main__":
    main()
