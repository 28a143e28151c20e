"""Shared fixtures: small generated datasets (pixels encode the label), their LMDBs, the real
ImageNet sample beside the checkout (``../shared/data/imagenet-sample``) and, for tests that need
JPEGs in its layout but not real photographs, the sample or a generated stand-in; helpers that
are not fixtures are in ``tests/helpers``."""
from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest
import torch

from tests.helpers.paths import REPO, SAMPLE

sys.path.insert(0, REPO)

import folder2lmdb  # noqa: E402
from tools import datagen  # noqa: E402

NUM_CLASSES = 4

# Under pytest-xdist (`make test`: 2 processes on a 2-core machine) each process, and every
# main.py it starts, computes on one torch thread: main.py gives a CPU model every core
# (engine.settings.main_threads), and two processes of 2 OpenMP threads on 2 cores spin against
# each other (the FFCV preset test took 890 s instead of 91). OMP_NUM_THREADS is what a user
# sets for the same reason; main.py then keeps torch's setting.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Files holding a ``slow`` test first (pytest-xdist's ``--dist loadfile`` hands out whole
    files in this order: the long ones start early and the processes end together, rather than
    one finishing a long file alone), in their order otherwise; ``gpu`` tests skipped without
    CUDA."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_lmdb_handle_outlives_a_test():
    """Close the read-only LMDB handles a test opened in this process (readers, in-process
    ``main``): one kept on a database a later test deletes would make py-lmdb refuse a new
    database that reuses its lock file's inode ("already open in this process")."""
    yield
    from formats.lmdb import close_all_readonly
    close_all_readonly()


@pytest.fixture(autouse=True)
def _pil_limit_restored():
    """PIL's decompression-bomb limit as it was before the test: ``main`` and the converters set
    it process-wide from ``--max-image-pixels`` (``decode.acceptance.limit_pil``), and one run
    in-process with a small limit would refuse every later test's images."""
    from PIL import Image

    before = Image.MAX_IMAGE_PIXELS
    yield
    Image.MAX_IMAGE_PIXELS = before


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """Flat-colour images (label readable from pixels): ``root/{train,val}`` JPEG folders and
    ``root/lmdb/{train,val}`` LMDBs; 4 classes, 8 train and 4 val images per class."""
    root = str(tmp_path_factory.mktemp("tiny"))
    datagen.make_dataset(root, NUM_CLASSES, train_per_class=8, val_per_class=4, seed=0)
    for split in ("train", "val"):
        folder2lmdb.convert(os.path.join(root, split), os.path.join(root, "lmdb", split),
                            progress=False)
    return SimpleNamespace(root=root, lmdb=os.path.join(root, "lmdb"), num_classes=NUM_CLASSES)


@pytest.fixture(scope="session")
def tiny_shards(tiny, tmp_path_factory):
    """``tiny`` converted with ``folder2shards.py``'s converter: ``root/{train,val}`` shards."""
    from formats.shards import convert

    root = str(tmp_path_factory.mktemp("tiny-shards"))
    for split in ("train", "val"):
        convert(os.path.join(tiny.root, split), os.path.join(root, split), progress=False)
    return root


@pytest.fixture(scope="session")
def tiny_raw(tiny, tmp_path_factory):
    """``tiny`` with a raw-pixel share (``--raw-budget 8x``: some records raw pixels, the rest
    JPEG): ``root/lmdb/{train,val}`` LMDBs and ``root/shards/{train,val}`` shards."""
    from formats.raw_share import parse_budget
    from formats.shards import convert

    root = str(tmp_path_factory.mktemp("tiny-raw"))
    for split in ("train", "val"):
        source = os.path.join(tiny.root, split)
        folder2lmdb.convert(source, os.path.join(root, "lmdb", split), progress=False,
                            raw_budget=parse_budget("8x"))
        convert(source, os.path.join(root, "shards", split), progress=False,
                raw_budget=parse_budget("8x"))
    return SimpleNamespace(lmdb=os.path.join(root, "lmdb"), shards=os.path.join(root, "shards"))


@pytest.fixture(scope="session")
def sample():
    """The real ImageNet sample (250 JPEGs, 250 classes); skipped, with the reason, if absent."""
    if not os.path.isdir(os.path.join(SAMPLE, "train")):
        pytest.skip(f"real ImageNet sample not found at {SAMPLE} (set IMAGENET_SAMPLE)")
    return os.path.abspath(SAMPLE)


def _converted(folder: str, root: str) -> str:
    for split in ("train", "val"):
        folder2lmdb.convert(os.path.join(folder, split), os.path.join(root, split), progress=False)
    return root


@pytest.fixture(scope="session")
def sample_lmdb(sample, tmp_path_factory):
    """The real sample converted with folder2lmdb: ``root/train``, ``root/val``."""
    return _converted(sample, str(tmp_path_factory.mktemp("sample-lmdb")))


@pytest.fixture(scope="session")
def sample_images(tmp_path_factory):
    """JPEGs in the sample's layout (``train/<wnid>/<wnid>_<name>.JPEG``, ``val/`` the same
    files): the real sample where present, else the generated stand-in of
    :mod:`tests.helpers.standin` (64 classes), for tests that need no real photograph."""
    if os.path.isdir(os.path.join(SAMPLE, "train")):
        return os.path.abspath(SAMPLE)
    from tests.helpers.standin import write_standin

    return write_standin(str(tmp_path_factory.mktemp("standin")))


@pytest.fixture(scope="session")
def sample_images_lmdb(sample_images, tmp_path_factory, request):
    """``sample_images`` converted with folder2lmdb: ``root/train``, ``root/val`` (the real
    sample's: ``sample_lmdb``)."""
    if sample_images == os.path.abspath(SAMPLE):
        return request.getfixturevalue("sample_lmdb")
    return _converted(sample_images, str(tmp_path_factory.mktemp("sample-images-lmdb")))


@pytest.fixture
def one_torch_thread():
    """Elementwise comparisons on one torch thread: OpenMP threads spin against a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
