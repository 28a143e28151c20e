"""The DALI pipeline (``--dali``) beyond the loader contract (tests/loaders/test_contract.py):
orders, sharding, resume, bad samples, windows, environment; CPU-only here."""
import json
import os
import shutil

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from torchvision.datasets import ImageFolder

pytest.importorskip("nvidia.dali")

import loaders  # noqa: E402
import loaders.pipelines.dali as dali  # noqa: E402
import loaders.pipelines.dali.graph as graph  # noqa: E402
import main  # noqa: E402
from decode.gpu import DEFAULT_HW_LOAD  # noqa: E402
from loaders import AcceleratorError, DataError, DistInfo, input_dtype  # noqa: E402
from loaders.orders import BlockOrder  # noqa: E402
from tests.helpers.loading import loader_settings, to_uint8  # noqa: E402
from tests.helpers.runs import SMALL  # noqa: E402

SOURCES = ["folder", "lmdb"]


def build(tiny, source, dist=None, **overrides):
    overrides.setdefault("data", tiny.lmdb if source == "lmdb" else tiny.root)
    overrides.setdefault("lmdb", source == "lmdb")
    return loaders.build_loaders(loader_settings("dali", **overrides), dist or DistInfo())


def imagefolder_labels(root):
    return [label for _, label in ImageFolder(root).samples]


def test_training_order_is_the_folder_loaders(tiny):
    """Same (seed, epoch, rank) -> the same permutation (RandomOrder) as the folder loader's."""
    dali_train, _ = build(tiny, "folder")
    folder_train, _ = loaders.build_loaders(loader_settings("folder", data=tiny.root), DistInfo())
    for epoch in (0, 5):
        dali_train.set_epoch(epoch)
        folder_train.set_epoch(epoch)
        assert dali_train.pass_indices() == list(folder_train.sampler.indices())


@pytest.mark.parametrize("world_size", [1, 2])
def test_lmdb_block_order_reads_the_block_orders_indices(tiny, world_size):
    """--dali --lmdb --lmdb-order block: the same BlockOrder objects as the lmdb loader, and
    the labels DALI yields are those of exactly that order's records."""
    labels_of = imagefolder_labels(os.path.join(tiny.root, "train"))
    for rank in range(world_size):
        dist = DistInfo(rank=rank, world_size=world_size)
        flags = dict(lmdb_order="block", lmdb_block_size=4, lmdb_buffer_blocks=2, workers=2)
        train, _ = build(tiny, "lmdb", dist, **flags)
        lmdb_train, _ = loaders.build_loaders(
            loader_settings("lmdb", data=tiny.lmdb, **flags), dist)
        assert isinstance(train.position_order, BlockOrder)
        reference = BlockOrder(32, block_size=4, buffer_blocks=2, rank=rank,
                               world_size=world_size, seed=0)
        for epoch in (0, 3):
            train.set_epoch(epoch)
            lmdb_train.set_epoch(epoch)
            expected = list(reference.order(epoch))[:len(train) * 4]
            assert (train.pass_indices() == expected
                    == list(lmdb_train.sampler.indices())[:len(expected)])
            yielded = torch.cat([labels for _, labels in train]).tolist()
            assert yielded == [labels_of[i] for i in expected]
        train.set_epoch(3, start_batch=1)  # resumed part-way: the rest of the same order
        assert train.pass_indices() == expected[4:]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("world_size,workers", [(2, 1), (3, 1), (3, 3)])
def test_shards_are_disjoint_and_validation_counts_each_image_once(tiny, source, world_size,
                                                                   workers):
    """workers=3: CPU-only, three single-threaded pipelines take turns (the last validation
    batch, partial, comes from the second of two)."""
    labels_of = imagefolder_labels(os.path.join(tiny.root, "val"))
    train_seen, val_seen = [], []
    for rank in range(world_size):
        train, val = build(tiny, source, DistInfo(rank=rank, world_size=world_size),
                           batch_size=3, workers=workers)
        assert len(train) == (32 // world_size) // 3  # same batch count on every rank
        train_seen.extend(train.pass_indices())
        batches = list(val)
        assert len(batches) == len(val)
        yielded = torch.cat([labels for _, labels in batches]).tolist()
        assert yielded == [labels_of[i] for i in val.pass_indices()]  # trimmed: no padded sample
        val_seen.extend(val.pass_indices())
    assert len(train_seen) == len(set(train_seen)) == world_size * len(train) * 3
    assert sorted(val_seen) == list(range(16))


def test_channels_last_and_batch_caps(tiny):
    train, val = build(tiny, "lmdb", channels_last=True, train_batches=3, val_batches=1)
    assert len(train) == 3 and len(list(train)) == 3 and len(list(val)) == 1
    images, _ = next(iter(train))
    assert images.shape == (4, 3, 32, 32)
    assert images.is_contiguous(memory_format=torch.channels_last)


def test_errors_are_data_errors(tiny, tmp_path):
    with pytest.raises(DataError, match="no image for this process"):
        build(tiny, "folder", dist=DistInfo(rank=40, world_size=41))
    with pytest.raises(DataError, match="add --lmdb"):
        build(tiny, "folder", data=tiny.lmdb, lmdb=False)
    with pytest.raises(DataError, match="drop --lmdb"):
        build(tiny, "lmdb", data=tiny.root)
    # One undecodable file in 17 is more than the default 1% --max-bad-share: one DataError.
    val_root = tmp_path / "val"
    shutil.copytree(os.path.join(tiny.root, "val"), val_root)
    (val_root / "n00000000" / "bad.JPEG").write_bytes(b"not an image")
    _, val = build(tiny, "folder", val_path=str(val_root))
    with pytest.raises(DataError, match="1 samples failed to decode"):
        list(val)


@pytest.mark.parametrize("source", SOURCES)
def test_sample_labels_match_imagefolder(sample_images, sample_images_lmdb, source):
    """Includes the sample's grayscale JPEGs, which must come out as 3-channel images."""
    data = sample_images_lmdb if source == "lmdb" else sample_images
    _, val = loaders.build_loaders(loader_settings(
        "dali", data=data, lmdb=source == "lmdb", batch_size=32, workers=2, val_resize_size=73,
        val_crop_size=64), DistInfo())
    labels, batches = [], 0
    for images, batch_labels in val:
        assert images.shape[1:] == (3, 64, 64) and images.dtype == torch.float32
        labels.extend(batch_labels.tolist())
        batches += 1
    expected = imagefolder_labels(os.path.join(sample_images, "val"))
    assert batches == len(val) == -(-len(expected) // 32)
    assert labels == expected  # same order, world 1


@pytest.mark.parametrize("source", SOURCES)
def test_main_two_epochs_end_to_end(tiny, source, tmp_path):
    data = ["--lmdb", tiny.lmdb] if source == "lmdb" else [tiny.root]
    out = str(tmp_path)
    main.main(["--dali", *data, *SMALL, "-j", "2", "--epochs", "2", "--output-dir", out])
    with open(os.path.join(out, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert [r["epoch"] for r in records] == [0, 1]


def test_loader_dali_selects_the_backend():
    from engine.settings import resolve_backend  # main.py's backend choice

    args = main.parse_args(["--loader", "dali", "--lmdb", "x"])
    assert resolve_backend(args) == ("dali", True)
    assert resolve_backend(main.parse_args(["--dali", "--lmdb", "x"])) == ("dali", True)


@pytest.mark.parametrize("workers", [0, 2])
def test_unreadable_files_are_reported_and_replaced(tiny, tmp_path, capfd, workers):
    root = tmp_path / "data"
    shutil.copytree(tiny.root, root, ignore=shutil.ignore_patterns("lmdb"))
    (root / "train" / "n00000002" / "notes.JPEG").write_text("<html>not an image</html>")
    (root / "train" / "n00000003" / "empty.JPEG").write_bytes(b"")
    settings = loader_settings("dali", data=str(root), max_bad_share=0.5, workers=workers)
    train, _ = loaders.build_loaders(settings, DistInfo())
    seen = 0
    for epoch in (0, 1):
        train.set_epoch(epoch)
        batches = list(train)
        assert len(batches) == len(train) == 34 // 4
        seen += sum(len(labels) for _, labels in batches)
    assert seen == 2 * 8 * 4
    err = capfd.readouterr().err
    assert "notes.JPEG" in err and "empty.JPEG" in err and "skipping unreadable sample" in err
    strict = loaders.build_loaders(loader_settings("dali", data=str(root), workers=workers,
                                                   max_bad_share=0.0), DistInfo())[0]
    with pytest.raises(DataError, match="failed to decode"):
        for epoch in (0, 1, 2):
            strict.set_epoch(epoch)
            list(strict)


def test_dali_wheel_for_another_cuda_major_stops_a_cuda_run(tiny, monkeypatch):
    """Checked before anything touches the GPU, so no GPU is needed to see it."""
    monkeypatch.setattr(torch.version, "cuda", "11.8")  # the installed DALI 2.4 is no cuda110
    with pytest.raises(DataError, match="built for another CUDA major.*nvidia-dali-cuda110$"):
        build(tiny, "folder", dist=DistInfo(device=torch.device("cuda", 0)))


class FailingPipe:
    """Stands in for a built DALI pipeline whose run() raises ``message``."""

    def __init__(self, message):
        self.message = message

    def run(self):
        raise RuntimeError(self.message)


@pytest.mark.parametrize("message,reported", [
    ("CUDA error: out of memory", "CUDA error: out of memory"),
    ("Critical error in pipeline: CUDA allocation failed\n"
     "Current pipeline object is no longer valid.",
     "Critical error in pipeline: CUDA allocation failed"),
    ("Critical error in pipeline:\nError in MIXED operator 'nvidia.dali.fn.decoders.image',\n"
     "encountered:\n\nError in thread 0: CUDA runtime API error cudaErrorInvalidValue (1):\n"
     "invalid argument\nCurrent pipeline object is no longer valid.",
     "Error in thread 0: CUDA runtime API error cudaErrorInvalidValue (1): invalid argument"),
])
def test_cuda_failure_in_dali_is_an_accelerator_error_not_a_bad_sample(tiny, monkeypatch,
                                                                       message, reported):
    train, _ = build(tiny, "folder")
    probed = []
    monkeypatch.setattr(dali.DALILoader, "_build_pipelines", lambda *_: [FailingPipe(message)])
    # A probe that "finds" sample 0 unreadable (the count is of distinct remembered samples).
    monkeypatch.setattr(dali.DALILoader, "_replace_unreadable",
                        lambda self, *a: probed.append(a) or self.unreadable.mark(0))
    with pytest.raises(AcceleratorError) as info:
        list(train)
    assert str(info.value) == f"DALI: CUDA error on the training split: {reported}"
    assert probed == []
    # Any other DALI failure is still probed as a damaged sample (here: 1 "found", > 1% of 32).
    monkeypatch.setattr(dali.DALILoader, "_build_pipelines",
                        lambda *_: [FailingPipe("Error in thread 0: nvImageCodec failure")])
    with pytest.raises(DataError, match="failed to decode"):
        list(train)
    assert len(probed) == 1


def test_torch_errors_after_run_are_not_taken_for_bad_samples(tiny, monkeypatch):
    """Only pipe.run() is inside the retry block: a failure converting its outputs propagates."""
    class Pipe:
        def run(self):
            return "outputs"

    def to_torch(self, outputs, batch):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB")

    train, _ = build(tiny, "folder")
    monkeypatch.setattr(dali.DALILoader, "_build_pipelines", lambda *_: [Pipe()])
    monkeypatch.setattr(dali.DALILoader, "_to_torch", to_torch)
    monkeypatch.setattr(dali.DALILoader, "_skip_mismatched_window", lambda *a: False)
    monkeypatch.setattr(dali.DALILoader, "_replace_unreadable", lambda *a: pytest.fail("probed"))
    with pytest.raises(RuntimeError, match="Tried to allocate"):
        list(train)


@pytest.mark.parametrize("gpu,load", [
    ("NVIDIA A100-SXM4-80GB", 0.75), ("NVIDIA A100 80GB PCIe", 0.75),
    ("NVIDIA H100 80GB HBM3", 0.65), ("NVIDIA H200", 0.65), ("NVIDIA A30", 0.65),
    ("Tesla V100-SXM2-16GB", 0.65), ("NVIDIA GeForce RTX 4090", 0.65)])
def test_hw_decoder_load_defaults_to_the_figure_for_the_gpu(monkeypatch, gpu, load):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: gpu)
    cuda = DistInfo(device=torch.device("cuda", 0))
    assert dali.default_hw_decoder_load(cuda.device) == load
    assert dali.graph_options(loader_settings("dali"), cuda, train=True).hw_decoder_load == load
    given = loader_settings("dali", dali_hw_decoder_load=0.3)
    assert dali.graph_options(given, cuda, train=True).hw_decoder_load == 0.3


def test_hw_decoder_load_off_cuda_and_out_of_range(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: pytest.fail("read"))
    assert dali.default_hw_decoder_load(torch.device("cpu")) == DEFAULT_HW_LOAD
    with pytest.raises(DataError, match="--dali-hw-decoder-load 1.5: must be between 0 and 1"):
        dali.graph_options(loader_settings("dali", dali_hw_decoder_load=1.5), DistInfo(),
                           train=False)


@pytest.mark.parametrize("amp,amp_dtype,device,dtype", [
    (True, "float16", "cuda", torch.float16), (True, "bfloat16", "cuda", torch.bfloat16),
    (False, "bfloat16", "cuda", torch.float32), (True, "float16", "cpu", torch.float32)])
def test_image_dtype_follows_amp_dtype(monkeypatch, amp, amp_dtype, device, dtype):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100")
    # main.py resolves the dtype with input_dtype; the graph takes it from the settings.
    settings = loader_settings("dali", dtype=input_dtype(amp, amp_dtype, torch.device(device)))
    opts = dali.graph_options(settings, DistInfo(device=torch.device(device)), train=True)
    assert opts.dtype == dtype


def write_exif_rotated_jpeg(path):
    """64x32 JPEG, left half red and right half blue as stored, EXIF orientation 6 (a viewer
    applying it shows it turned 90 degrees clockwise: 32x64, red on top)."""
    pixels = np.zeros((32, 64, 3), np.uint8)
    pixels[:, :32], pixels[:, 32:] = (220, 30, 30), (30, 30, 220)
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation
    Image.fromarray(pixels).save(path, "JPEG", quality=95, exif=exif.tobytes())


def test_exif_orientation_is_not_applied_as_in_the_folder_loader(tmp_path):
    for split in ("train", "val"):
        (tmp_path / split / "n0").mkdir(parents=True)
        write_exif_rotated_jpeg(tmp_path / split / "n0" / "a.JPEG")
    with Image.open(tmp_path / "val" / "n0" / "a.JPEG") as img:
        assert ImageOps.exif_transpose(img).size == (32, 64)  # the tag is there and read
    flags = dict(data=str(tmp_path), batch_size=1, val_resize_size=32, val_crop_size=32)
    seen = {}
    for backend in ("dali", "folder"):
        _, val = loaders.build_loaders(loader_settings(backend, **flags), DistInfo())
        images, _ = next(iter(val))
        seen[backend] = to_uint8(images)[0].astype(np.int64)  # (3, 32, 32), centre of 64x32
    assert np.abs(seen["dali"] - seen["folder"]).mean() < 3  # JPEG decoders differ a little
    for pixels in seen.values():  # as stored: red left, blue right (turned: red top, blue bottom)
        left, right = pixels[:, :, :12].mean(axis=(1, 2)), pixels[:, :, 20:].mean(axis=(1, 2))
        assert left[0] > 180 > left[2] and right[2] > 180 > right[0]


@pytest.mark.parametrize("source,workers", [("folder", 2), ("lmdb", 1)])
def test_pipelines_are_built_once_per_run(tiny, source, workers):
    """Three epochs of training and validation and a resolution change reuse the pipelines
    built on the first pass (CPU-only here: ``workers`` single-threaded pipelines per split)."""
    train, val = build(tiny, source, workers=workers)
    shapes = []
    for epoch in range(3):
        if epoch == 2:
            train.set_resolution(24)  # progressive resizing: the side is a pipeline input
        train.set_epoch(epoch)
        shapes.append({tuple(images.shape) for images, _ in train})
        assert len(list(val)) == len(val)
    assert shapes == [{(4, 3, 32, 32)}, {(4, 3, 32, 32)}, {(4, 3, 24, 24)}]
    assert train.pipeline_builds == val.pipeline_builds == workers


def test_a_resumed_epoch_yields_what_the_uninterrupted_one_did(tiny):
    """Crops and flips are drawn from (seed, epoch, rank, batch): resuming at batch 3 gives the
    same batches 3.. as the whole epoch, though the pipelines ran other batches before."""
    train, _ = build(tiny, "folder", workers=2)
    train.set_epoch(1)
    whole = [images for images, _ in train]
    train.set_epoch(1, start_batch=3)
    resumed = [images for images, _ in train]
    assert len(resumed) == len(whole) - 3
    for a, b in zip(whole[3:], resumed):
        assert torch.equal(a, b)
    assert train.pipeline_builds == 2


def test_a_pass_left_part_way_is_not_continued(tiny):
    """A pass abandoned after one batch leaves batches queued in DALI: the next pass starts
    from its own first batch on rebuilt pipelines."""
    train, _ = build(tiny, "lmdb", workers=1)
    train.set_epoch(0)
    first = next(iter(train))[1]
    assert train.pipeline_builds == 1
    assert torch.equal(next(iter(train))[1], first)
    assert train.pipeline_builds == 2  # rebuilt once: the first pass was abandoned


def test_mixed_decode_upsamples_chroma_fancy_with_paddings_for_its_threads(monkeypatch):
    """On a GPU the mixed (nvJPEG) decode upsamples chroma as libjpeg-turbo's "fancy" does
    (DALI's CPU backend, the CPU loaders and nvImageCodec do), and nvJPEG's per-thread paddings
    keep DeepLearningExamples' 4-thread total: -j 16 gets a quarter each, -j 2 the examples'
    own. The CPU decode takes none of them. DALI's schema takes each argument."""
    from nvidia.dali import backend


    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100")
    cuda = DistInfo(device=torch.device("cuda", 0))
    mixed = graph.decode_args(dali.graph_options(loader_settings("dali", workers=16), cuda,
                                                  train=True))
    assert mixed["device"] == "mixed" and mixed["jpeg_fancy_upsampling"] is True
    assert mixed["device_memory_padding"] == 211025920 // 4
    assert mixed["host_memory_padding"] == 140544512 // 4
    assert mixed["preallocate_width_hint"] == 5980  # one hardware decoder: not per thread
    few = graph.decode_args(dali.graph_options(loader_settings("dali", workers=2), cuda,
                                                train=True))
    assert few["device_memory_padding"] == 211025920 and few["host_memory_padding"] == 140544512
    on_cpu = graph.decode_args(dali.graph_options(
        loader_settings("dali", workers=16, dali_cpu=True), cuda, train=True))
    assert on_cpu["device"] == "cpu" and "jpeg_fancy_upsampling" not in on_cpu
    for schema in ("decoders__ImageSlice", "decoders__Image"):
        assert all(backend.GetSchema(schema).HasArgument(k) for k in mixed
                   if k not in ("device",)), schema


# A DALI pipeline left in a reference cycle when a DataLoader forks its workers; the worker
# collects garbage at once (as torch.manual_seed in a worker can, through a stack extraction).
GARBAGE_PIPELINE_THEN_WORKERS = r"""
import gc, sys
sys.path.insert(0, sys.argv[1])
import torch
from nvidia.dali import fn, pipeline_def
from loaders.pipelines.closing import ClosingDataLoader

@pipeline_def(batch_size=2, num_threads=2, device_id=None)
def graph():
    return fn.random.uniform(range=[0.0, 1.0], shape=[4])

pipe = graph()
pipe.build()
pipe.run()
pipe.cycle = pipe
gc.disable()
del pipe

def collect(worker):
    gc.enable()
    gc.collect()

loader = ClosingDataLoader(list(range(4)), batch_size=2, num_workers=1, worker_init_fn=collect)
print(sum(int(batch.sum()) for batch in loader))
loader.close()
"""


def test_a_dali_pipeline_left_as_garbage_does_not_hang_a_forked_worker(tmp_path):
    """Freed in a forked worker, a DALI pipeline's shutdown waits for threads that exist only
    in the parent: the worker hung for good. The loader collects garbage before it forks."""
    import subprocess
    import sys

    from tests.helpers.paths import REPO

    script = tmp_path / "garbage.py"
    script.write_text(GARBAGE_PIPELINE_THEN_WORKERS)
    try:
        result = subprocess.run([sys.executable, str(script), REPO], capture_output=True,
                                text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the DataLoader worker hung freeing the DALI pipeline")
    assert result.returncode == 0 and result.stdout.split() == ["6"], result.stderr[-2000:]
