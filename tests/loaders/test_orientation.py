"""One orientation rule: every pipeline and source keeps a JPEG's pixels as stored,
EXIF orientation not applied, as pytorch/examples' ImageFolder + PIL does. Real JPEGs with
orientations 1-8, CMYK, grayscale, a PNG named .JPEG, 56 and 2,400 px, 1:3 and 3:1
(``tests/helpers/oddities.py``) go through the folder, LMDB and shard sources, each in the DataLoader
pipeline, the batch-decode pipeline on nvImageCodec's CPU backend (``--decode-device
cpu-nvimgcodec``) and DALI's CPU backend, training and validation, with several seeds: every output
equals the CPU reference (the window drawn from the stored size, cut from a whole decode,
resized), and nothing crashes. Also the converters' ``--max-side`` resize and ``--verify``.
"""
import os

import numpy as np
import pytest
import torch

import folder2lmdb
import loaders
from formats.cap import Cap
from formats.shards import convert as shards_convert
from loaders import DistInfo
from loaders.pipelines.batches import batch_seed
from decode import decode, resize
from loaders.transforms import RRC_RATIO, RRC_SCALE, random_resized_crop_params, resize_center_crop
from tests.helpers.loading import loader_settings, to_uint8
from tests.helpers.paths import SAMPLE
from tests.helpers.oddities import ORIENTATION_TAG, stored_pixels, write_odd_folder

SEEDS = (0, 1, 2)
CROP, VAL_RESIZE = 48, 56
PIPELINES = ["dataloader"]
try:
    import nvidia.nvimgcodec  # noqa: F401
    PIPELINES.append("gpu_decode")  # --decode-device cpu-nvimgcodec: the GPU path's code on CPU
except ImportError:
    pass
try:
    import nvidia.dali  # noqa: F401
    PIPELINES.append("dali")
except ImportError:
    pass


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    """The odd corpus as a JPEG folder, an LMDB and shards (``root/{folder,lmdb,shards}``)."""
    root = str(tmp_path_factory.mktemp("odd"))
    folder = os.path.join(root, "folder")
    write_odd_folder(folder, SAMPLE if os.path.isdir(os.path.join(SAMPLE, "train")) else None)
    for split in ("train", "val"):
        folder2lmdb.convert(os.path.join(folder, split), os.path.join(root, "lmdb", split),
                            progress=False, workers=2)
        shards_convert(os.path.join(folder, split), os.path.join(root, "shards", split),
                       progress=False, workers=2)
    return root


def build(odd, source, pipeline, seed, **overrides):
    backend = "dali" if pipeline == "dali" else {"folder": "folder", "lmdb": "lmdb",
                                                  "shards": "shards"}[source]
    flags = dict(data=os.path.join(odd, source), batch_size=4, seed=seed, lmdb=source == "lmdb",
                 shards=source == "shards", train_crop_size=CROP, val_resize_size=VAL_RESIZE,
                 val_crop_size=CROP, workers=2 if pipeline == "dali" else 0, max_bad_share=0.0)
    if pipeline == "gpu_decode":
        flags["decode_device"] = "cpu-nvimgcodec"
    flags.update(overrides)
    settings = loader_settings(backend, **flags)
    assert settings.pipeline == {"dataloader": "workers"}.get(pipeline, pipeline)
    return loaders.build_loaders(settings, DistInfo())


def encoded(loader):
    """index -> the encoded bytes the loader decodes (any reader, either pipeline)."""
    return lambda i: loader.reader.read(i)[0]


def order_of(loader) -> list[int]:
    return list(loader.sampler.indices())  # every pipeline here is a ReaderLoader


def train_reference(data: bytes, draws, flip: bool) -> np.ndarray:
    """The CPU loaders' training sample for these uniforms: the window drawn from the stored
    size, cut from a whole decode, resized, flipped: uint8 (3, CROP, CROP)."""
    image = decode(data)
    height, width = image.shape[-2:]
    top, left, h, w = random_resized_crop_params(height, width, RRC_SCALE, RRC_RATIO, draws)
    out = resize(image[:, top:top + h, left:left + w], (CROP, CROP))
    return (out.flip(-1) if flip else out).numpy()


def expected_batches(loader, pipeline, seed, epoch):
    """Per training batch: the reference uint8 images of its samples, in the loader's order,
    drawn as that pipeline draws them ((seed, epoch, rank, batch) either way)."""
    from loaders.pipelines.dali.feed import crop_draws

    read, order = encoded(loader), order_of(loader)
    out = []
    for batch in range(len(loader)):
        indices = order[batch * 4:(batch + 1) * 4]
        if pipeline == "dali":
            draws, flips = crop_draws(seed, epoch, 0, batch, len(indices))
            pairs = [(list(d), bool(f)) for d, f in zip(draws, flips)]
        else:
            with torch.random.fork_rng():
                torch.manual_seed(batch_seed(seed, epoch, 0, batch))
                pairs = []
                for _ in indices:
                    d = torch.rand(4 * 10 + 1).tolist()
                    pairs.append((d[:-1], d[-1] < 0.5))
        out.append([train_reference(read(i), d, f) for i, (d, f) in zip(indices, pairs)])
    return out


def assert_close(got: np.ndarray, want: np.ndarray, where: str):
    """Within what the decoders differ by: DCT-scaled and window decoding against a whole
    decode, another libjpeg-turbo build (up to a mean of 3.6 levels, 99th percentile 21, on
    this corpus); the same draws on the turned image are 19.7-45 levels off on average."""
    diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
    assert diff.mean() < 6 and np.percentile(diff, 99) < 32, (where, diff.mean(),
                                                              np.percentile(diff, 99))


@pytest.mark.parametrize("source", ["folder", "lmdb", "shards"])
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_training_windows_and_pixels_are_the_cpu_references(odd, source, pipeline):
    for seed in SEEDS:
        train, _ = build(odd, source, pipeline, seed)
        try:
            for epoch in (0, 1):
                train.set_epoch(epoch)
                want = expected_batches(train, pipeline, seed, epoch)
                got = [to_uint8(images) for images, _ in train]
                assert len(got) == len(train) == len(want) == 4  # 16 images, batches of 4
                for b, (g, w) in enumerate(zip(got, want)):
                    for j, (image, reference) in enumerate(zip(g, w)):
                        assert_close(image, reference, f"seed {seed} epoch {epoch} batch {b}.{j}")
        finally:
            train.close()


@pytest.mark.parametrize("source", ["folder", "lmdb", "shards"])
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_validation_pixels_are_the_cpu_references(odd, source, pipeline):
    _, val = build(odd, source, pipeline, 0)
    read, order = encoded(val), order_of(val)
    got = np.concatenate([to_uint8(images) for images, _ in val])
    assert len(got) == len(order) == 16
    for i, image in zip(order, got):
        reference = resize_center_crop(decode(read(i)), VAL_RESIZE, CROP).numpy()
        assert_close(image, reference, f"val sample {i}")


def test_the_reference_is_the_stored_pixels(odd):
    """What the references decode is PIL's image without EXIF transposition (pixels as stored),
    and the corpus really carries the tags (a viewer would turn 5-8 by 90 degrees)."""
    from PIL import Image

    root = os.path.join(odd, "folder", "train")
    for name in sorted(os.listdir(os.path.join(root, "n0"))) + sorted(
            os.listdir(os.path.join(root, "n1"))):
        path = os.path.join(root, "n0" if os.path.exists(os.path.join(root, "n0", name))
                            else "n1", name)
        data = open(path, "rb").read()
        with Image.open(path) as image:
            assert image.getexif().get(ORIENTATION_TAG) in range(1, 9), name
        got = decode(data).permute(1, 2, 0).numpy()
        want = stored_pixels(data)
        assert got.shape == want.shape, name
        if not name.startswith("cmyk"):  # libjpeg's and PIL's CMYK conversions differ
            assert np.abs(got.astype(int) - want.astype(int)).max() <= 1, name


@pytest.mark.skipif("dali" not in PIPELINES, reason="needs nvidia-dali")
def test_dali_windows_that_leave_their_image_are_named_bad_samples(odd, monkeypatch, capfd):
    """An old bug put back (windows drawn for the shape after EXIF orientation): windows
    that leave their stored image are clamped inside it in the graph (DALI never stops on
    them), found on the host from shapes alone, named on stderr once and replaced as
    unreadable samples; with no bad share allowed the run stops with one DataError."""
    import io

    from PIL import Image, ImageOps

    import loaders.pipelines.dali.feed as feed
    from decode.acceptance import Frame, check

    def turned_frame(data, max_pixels):  # the bug's size: after EXIF orientation
        check(data, max_pixels)
        with Image.open(io.BytesIO(data)) as image:
            width, height = ImageOps.exif_transpose(image).size
        return Frame("turned", height, width)

    monkeypatch.setattr(feed, "check", turned_frame)
    named = []
    for seed in SEEDS:
        train, _ = build(odd, "folder", "dali", seed, max_bad_share=1.0)
        batches = [to_uint8(images) for images, _ in train]
        assert len(batches) == len(train) == 4
        lines = [line for line in capfd.readouterr().err.splitlines() if "leaves the" in line]
        assert train.unreadable.count() == len(lines)
        named += lines
    turned_files = ("orientation_5", "orientation_6", "orientation_7", "orientation_8", "cmyk",
                    "gray", "tall_1x3", "wide_3x1", "png_named_jpeg", "small_56", "large_2400")
    assert named and all(line.startswith("warning: skipping unreadable sample ") and
                         any(f"{name}.JPEG: DataError: its RandomResizedCrop window " in line
                             for name in turned_files) for line in named)
    strict, _ = build(odd, "folder", "dali", 0, max_bad_share=0.0)
    with pytest.raises(loaders.DataError, match="failed to decode"):
        list(strict)


@pytest.mark.skipif("dali" not in PIPELINES, reason="needs nvidia-dali")
def test_window_mismatch_reads_shapes_only():
    """The host check of a training batch's windows (outputs as the graph returns them, labels
    last): inside and decoded as drawn -> None; a window leaving its image, or decoded pixels
    of another shape (fewer channels, other sides) -> the first such sample and why."""
    from nvidia.dali.tensors import TensorListCPU

    from loaders.pipelines.dali.graph import window_mismatch

    def outputs(decoded, anchors, shapes, sizes):
        return ["images", "mirror", *(TensorListCPU(np.array(a, dtype)) for a, dtype in (
            (decoded, np.int64), (anchors, np.float32), (shapes, np.float32),
            (sizes, np.float64))), "labels"]

    sizes = [(30, 40, 3), (30, 40, 3)]
    assert window_mismatch(outputs([(10, 20, 3), (30, 40, 3)], [(5, 5), (0, 0)],
                                   [(20, 10), (40, 30)], sizes)) is None
    position, why = window_mismatch(outputs([(10, 20, 3), (10, 20, 3)], [(5, 5), (25, 5)],
                                            [(20, 10), (20, 10)], sizes))
    assert position == 1 and why == ("its RandomResizedCrop window 20x10 at (25, 5) leaves the "
                                      "40x30 image as stored")
    position, why = window_mismatch(outputs([(10, 20, 1), (10, 20, 3)], [(5, 5), (0, 0)],
                                            [(20, 10), (20, 10)], sizes))
    assert position == 0 and why == "DALI decoded 10x20x1 pixels for its 10x20x3 window"


@pytest.mark.parametrize("fmt", ["lmdb", "shards"])
def test_max_side_and_verify_keep_pixels_as_stored(odd, tmp_path, fmt):
    """``--max-side 256`` scales the stored pixels, not the turned image, and ``--verify``
    accepts what it wrote: every record is the BOX downscale of one source file's stored
    pixels (the 2,400 x 1,800 one tagged 6 becomes 256 x 192)."""
    import subprocess
    import sys

    from PIL import Image

    from tests.helpers.paths import REPO

    src, out = os.path.join(odd, "folder", "train"), str(tmp_path / fmt)
    script = os.path.join(REPO, "folder2lmdb.py" if fmt == "lmdb" else "folder2shards.py")
    for args in (["-d", src, "-o", out, "--max-side", "256", "-j", "2"],
                 ["--verify", out, "-d", src]):
        run = subprocess.run([sys.executable, script, *args], capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr
    if fmt == "lmdb":
        from loaders.readers.lmdb_records import LMDBReader
        dataset = LMDBReader(out)
    else:
        from loaders.readers.shards import open_reader
        dataset = open_reader(out, None)
    capped = {}  # (label, stored pixels capped) of each source file
    for label, cls in enumerate(("n0", "n1")):
        for name in os.listdir(os.path.join(src, cls)):
            with Image.open(os.path.join(src, cls, name)) as image:
                capped[name] = (label, np.asarray(Cap(256).apply(image.convert("RGB"))))
    assert capped["large_2400.JPEG"][1].shape == (192, 256, 3)
    matched = set()
    for index in range(len(dataset)):
        data, label = dataset.read(index)
        got = decode(data).permute(1, 2, 0).numpy().astype(int)
        diffs = {name: np.abs(got - want.astype(int)).mean()
                 for name, (lab, want) in capped.items()
                 if lab == label and want.shape == got.shape}
        best = min(diffs, key=diffs.get)
        assert diffs[best] < 5, (index, best, diffs[best])  # q95 re-encoding: up to 3.64
        matched.add(best)
    assert matched == set(capped)
