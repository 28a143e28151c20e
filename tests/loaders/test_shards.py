"""The WebDataset shard backend (``--loader shards``): epoch orders, the loader contract, HTTP and
``pipe:`` streaming, DDP over uneven shards, and one-line errors for bad input."""
import functools
import hashlib
import http.server
import io
import os
import tarfile
import threading

import numpy as np
import pytest
import torch

import loaders
from loaders import DataError, DistInfo
from engine.distributed.processes import free_port
from formats.shards import (ShardIndex, ShardWriter, idx_name, record_key, shard_name,
                                  write_idx)
from loaders.orders.streams import StreamTrainOrder, StreamValOrder, buffer_shuffle
from tests.helpers.loading import loader_settings, to_uint8
from tools.datagen import label_from_pixels
from tests.helpers.ranks import run_ranks
from tests.helpers.runs import only_record, SMALL_DISTRIBUTED

UNEVEN = [5, 13, 2, 9, 3]  # 32 training records in shards of unequal size


def write_split(src: str, out: str, sizes: list[int], prefix: str, seed: int = 0) -> None:
    """Shards of ``src`` (an ImageNet-layout folder) with the given record counts, records in a
    seeded shuffle: test data made through the shared codec, independent of folder2shards.py."""
    classes = sorted(os.listdir(src))
    items = [(c, os.path.join(src, c, f)) for c in classes
             for f in sorted(os.listdir(os.path.join(src, c)))]
    assert sum(sizes) == len(items)
    items = [items[i] for i in np.random.default_rng(seed).permutation(len(items))]
    os.makedirs(out, exist_ok=True)
    shards, at = [], 0
    for number, size in enumerate(sizes):
        name = shard_name(prefix, number)
        writer = ShardWriter(os.path.join(out, name))
        spans = [writer.write(record_key(c, p), open(p, "rb").read(), classes.index(c))
                 for c, p in items[at: at + size]]
        writer.close()
        write_idx(os.path.join(out, idx_name(name)), spans)
        shards.append({"name": name, "records": size,
                       "bytes": os.path.getsize(os.path.join(out, name))})
        at += size
    ShardIndex(classes, shards, seed).write(out)


@pytest.fixture(scope="module")
def shards(tiny, tmp_path_factory):
    """``tiny`` as shards: train in :data:`UNEVEN` shards, val in 3 shards (16 records)."""
    root = str(tmp_path_factory.mktemp("shards"))
    write_split(os.path.join(tiny.root, "train"), os.path.join(root, "train"), UNEVEN, "train")
    write_split(os.path.join(tiny.root, "val"), os.path.join(root, "val"), [6, 6, 4], "val")
    return root


def build(data, **overrides):
    return loaders.build_loaders(loader_settings("shards", data, **overrides), DistInfo())


# --- epoch orders -------------------------------------------------------------------------

@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("workers", [0, 1, 3])
def test_train_order_equal_and_disjoint_across_ranks(world, workers):
    orders = [StreamTrainOrder(UNEVEN, 2, workers, r, world, seed=7, buffer=4)
              for r in range(world)]
    epochs = [[o.order(epoch) for o in orders] for epoch in (0, 1)]
    for per_rank in epochs:
        assert len({len(o) for o in per_rank}) == 1  # same number of batches on every rank
        assert len(per_rank[0]) == 32 // world // 2 * 2
        flat = [i for o in per_rank for i in o]
        assert len(flat) == len(set(flat)) and set(flat) <= set(range(32))
    assert epochs[0] != epochs[1]  # shards and buffer reshuffled per epoch
    assert [o.order(0) for o in orders] == epochs[0]  # a pure function of (seed, epoch, rank)


def test_each_worker_reads_its_shards_front_to_back():
    """Batch k goes to worker k % W; with a buffer of 1 each worker's records come in reading
    order, so a stream is read once, sequentially, by one worker."""
    order = StreamTrainOrder(UNEVEN, 2, 3, seed=3, buffer=1)
    indices = order.order(5)
    runs = order.runs(5)
    reading = [i for start, stop in runs for i in range(start, stop)]
    position = {index: at for at, index in enumerate(reading)}
    for w in range(3):
        mine = [i for k in range(w, order.batches, 3) for i in indices[2 * k: 2 * k + 2]]
        assert [position[i] for i in mine] == sorted(position[i] for i in mine)


def test_buffer_shuffle_never_runs_ahead_of_reading():
    rng = np.random.default_rng(0)
    out = buffer_shuffle(list(range(100)), 10, rng)
    assert sorted(out) == list(range(100)) and out != list(range(100))
    for emitted, index in enumerate(out):  # read at most `buffer` records ahead of emitting
        assert index <= emitted + 9


def test_resumed_pass_keeps_one_piece_per_worker():
    """Resuming at batch s, worker j gets batches s+j, s+j+W, ...: all of piece (s+j) % W."""
    order = StreamTrainOrder([40, 24], 2, 3, seed=1, buffer=4)
    indices = order.order(0)
    piece_of = {i: (k % 3) for k in range(order.batches) for i in indices[2 * k: 2 * k + 2]}
    start = 4
    for j in range(3):
        pieces = {piece_of[i] for k in range(start + j, order.batches, 3)
                  for i in indices[2 * k: 2 * k + 2]}
        assert pieces == {(start + j) % 3}


@pytest.mark.parametrize("world", [1, 2, 3])
def test_val_order_reads_every_record_once(world):
    orders = [StreamValOrder(16, 4, 2, r, world) for r in range(world)]
    flat = sorted(i for o in orders for i in o.order(0))
    assert flat == list(range(16))
    assert sum(len(o) for o in orders) == 16


# --- the loader ---------------------------------------------------------------------------

@pytest.fixture()
def http_root(shards):
    """An HTTP server on 127.0.0.1 serving the shard folder (as ``python -m http.server``)."""
    handler = functools.partial(_QuietHandler, directory=shards)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    paths: list = []  # the paths asked for, in order

    def log_message(self, *args):
        pass

    def do_GET(self):
        _QuietHandler.paths.append(self.path)
        super().do_GET()


@pytest.mark.parametrize("workers", [0, 2])
def test_http_streaming_equals_local_batch_for_batch(shards, http_root, workers):
    local = build(shards, workers=workers)
    remote = build(None, workers=workers, train_path=f"{http_root}/train",
                   val_path=http_root + "/val/val-{000000..000002}.tar")
    assert len(remote[0]) == len(local[0]) and len(remote[1]) == len(local[1])
    for a, b in zip(local, remote):
        for (ai, al), (bi, bl) in zip(a, b, strict=True):
            assert torch.equal(al, bl) and torch.equal(ai, bi)


def test_workers_kept_from_pass_to_pass_follow_each_streamed_plan(shards, http_root):
    """Streamed shards keep their workers as local ones do: each pass's plan reaches them with
    its batches, so they read the local shards' batches, each shard opened about once a pass
    (a piece boundary inside a shard opens it twice)."""
    local = build(shards, workers=2)[0]
    remote = build(None, workers=2, train_path=f"{http_root}/train",
                   val_path=f"{http_root}/val")[0]
    pids = []
    try:
        for epoch in (0, 1, 1):  # the last epoch twice: each pass plans anew
            local.set_epoch(epoch)
            remote.set_epoch(epoch)
            _QuietHandler.paths.clear()
            for (ai, al), (bi, bl) in zip(local, remote, strict=True):
                assert torch.equal(al, bl) and torch.equal(ai, bi)
            tars = [p for p in _QuietHandler.paths if p.endswith(".tar")]
            assert len(set(tars)) == 5 and len(tars) <= 6, tars
            pids.append(sorted(w.pid for w in remote.loader._iterator._workers))
        assert local.loader.persistent_workers and remote.loader.persistent_workers
        assert pids[0] == pids[1] == pids[2]
    finally:
        loaders.close_all(local, remote)


def test_stream_opens_each_shard_once_per_epoch(shards, monkeypatch):
    import loaders.readers.shards as shard_backend

    opened = []

    real = shard_backend.open_stream
    monkeypatch.setattr(shard_backend, "open_stream", lambda url: opened.append(url) or real(url))
    pattern = "pipe:cat " + os.path.join(shards, "train", "train-{000000..000004}.tar")
    train, _ = build(shards, workers=0, train_path=pattern)
    opened.clear()
    assert len(list(train)) == 8
    tars = [u for u in opened if u.endswith(".tar")]
    assert len(tars) == len(set(tars)) == 5


def test_pipe_and_brace_pattern(shards):
    train, val = build(None, train_path="pipe:cat " + os.path.join(
        shards, "train", "train-{000000..000004}.tar"), val_path=os.path.join(
        shards, "val", "val-{000000..000002}.tar"))
    assert len(list(train)) == 8 and sum(len(l) for _, l in val) == 16


@pytest.mark.slow
def test_two_process_gloo_training_over_uneven_shards(shards, tmp_path):
    out = str(tmp_path / "out")
    result = run_ranks(["--loader", "shards", shards, *SMALL_DISTRIBUTED, "-b", "4",
                        "--output-dir", out], 2)
    assert "world size 2" in result.stdout
    record = only_record(out)
    assert record["train_images"] == 32  # 2 ranks x 4 equal batches of 4, no hang
    assert record["val_images"] == 16  # every validation record exactly once


def test_sample_through_shards(sample_images, tmp_path):
    from torchvision import datasets

    for split in ("train", "val"):
        n = len(datasets.ImageFolder(os.path.join(sample_images, split)))
        write_split(os.path.join(sample_images, split), str(tmp_path / split),
                    [n // 2, n - n // 2], split)
    _, val = build(str(tmp_path), workers=2, batch_size=25, val_resize_size=64,
                   val_crop_size=56)
    labels = torch.cat([l for _, l in val])
    assert sorted(labels.tolist()) == sorted(datasets.ImageFolder(
        os.path.join(sample_images, "val")).targets)


# --- bad input: one line naming the shard -------------------------------------------------

def _copy_split(shards, tmp_path, split="train"):
    import shutil

    root = tmp_path / "copy"
    for s in ("train", "val"):
        shutil.copytree(os.path.join(shards, s), root / s)
    return root


def test_missing_shard(shards, tmp_path):
    root = _copy_split(shards, tmp_path)
    os.remove(root / "train" / "train-000002.tar")
    with pytest.raises(DataError, match="train-000002.tar: missing"):
        build(str(root))


def test_truncated_shard_local_and_streamed(shards, tmp_path):
    root = _copy_split(shards, tmp_path)
    path = root / "train" / "train-000001.tar"
    os.truncate(path, os.path.getsize(path) // 2)
    with pytest.raises(DataError, match="train-000001.tar: truncated"):
        build(str(root))
    # retried as a stream may be (3 tries, 0.05 + 0.1 s apart here, not 10 + 20 s), then one line
    train, _ = build(str(root), workers=2, shard_retry_delay=0.05, train_path="pipe:cat " + str(
        root / "train" / "train-{000000..000004}.tar"))
    with pytest.raises(DataError, match=r"train-000001.tar: (ended after|unreadable tar)") as info:
        list(train)
    assert "\n" not in str(info.value) and "3 tries" in str(info.value)


def test_record_without_cls(shards, tmp_path):
    root = _copy_split(shards, tmp_path)
    path = root / "train" / "train-000000.tar"
    with tarfile.open(path) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for member, data in members:
            if member.name != members[1][0].name:  # the first record's .cls
                tar.addfile(member, io.BytesIO(data))
    idx = root / "train" / "train-000000.idx"
    lines = idx.read_text().splitlines()
    lines[1] = " ".join(lines[1].split()[:4])  # as DALI's wds2idx.py indexes such a record
    idx.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match="line 2: a record without .jpg and .cls"):
        build(str(root))
    stream = "pipe:cat " + str(root / "train" / "train-{000000..000004}.tar")
    train, _ = build(str(root), train_path=stream)
    with pytest.raises(DataError, match="lacks a .jpg or .cls"):
        list(train)


def test_unreachable_url_and_missing_index(shards, tmp_path):
    port = free_port()  # closed once found: nothing listens there
    with pytest.raises(DataError, match="cannot open"):
        build(None, train_path=f"http://127.0.0.1:{port}/train", val_path=f"{shards}/val")
    os.makedirs(tmp_path / "train")
    with pytest.raises(DataError, match="no index.json"):
        build(None, train_path=str(tmp_path / "train"), val_path=f"{shards}/val")
    with pytest.raises(DataError, match="not in its index.json"):
        build(None, train_path=os.path.join(shards, "train", "train-000009.tar"),
              val_path=f"{shards}/val")


@pytest.mark.parametrize("stream", [False, True])
def test_mid_epoch_resume_gives_exactly_the_rest(shards, stream):
    """set_epoch(e, start_batch=s) (a --save-every checkpoint) yields the batches s.. of the
    uninterrupted pass, streams starting at the first record still needed."""
    path = ("pipe:cat " + os.path.join(shards, "train", "train-{000000..000004}.tar")
            if stream else os.path.join(shards, "train"))
    train, _ = build(shards, workers=2, batch_size=2, train_path=path)
    train.set_epoch(2)
    full = list(train)
    train.set_epoch(2, start_batch=5)
    rest = list(train)
    assert len(rest) == len(full) - 5 == len(train)
    for (ai, al), (bi, bl) in zip(full[5:], rest, strict=True):
        assert torch.equal(al, bl) and torch.equal(ai, bi)


@pytest.mark.parametrize("world", [1, 2])
def test_dali_cpu_reads_local_shards(shards, tiny, world):
    """--dali --loader shards: the same equal epochs and every val record once; CPU-only here
    (the mixed GPU decoder runs in tests/loaders/test_gpu_dali.py's loaders on a GPU machine)."""
    pytest.importorskip("nvidia.dali")
    per_rank = []
    for rank in range(world):
        train, val = loaders.build_loaders(
            loader_settings("dali", shards, shards=True, workers=1),
            DistInfo(rank=rank, world_size=world))
        batches = list(train)
        assert len(batches) == len(train) == 8 // world
        for images, labels in batches:
            pixels = to_uint8(images)
            assert [label_from_pixels(p, tiny.num_classes) for p in pixels] == labels.tolist()
        per_rank.append(torch.cat([labels for _, labels in val]))
    assert sorted(torch.cat(per_rank).tolist()) == sorted(list(range(4)) * 4)
    with pytest.raises(DataError, match="--dali reads local shards only"):
        loaders.build_loaders(loader_settings(
            "dali", shards, shards=True, train_path="pipe:cat " + os.path.join(
                shards, "train", "train-{000000..000004}.tar")), DistInfo())


def test_stream_without_idx_reads_through_the_tar_iterator(shards, tmp_path):
    """Shards whose location serves no .idx (indexed by other tools) are streamed through the
    webdataset library's tar iterator: the same batches as offset cutting."""
    root = _copy_split(shards, tmp_path)
    for name in os.listdir(root / "train"):
        if name.endswith(".idx"):
            os.remove(root / "train" / name)
    pattern = "train-{000000..000004}.tar"
    with_idx, _ = build(shards, workers=2, train_path="pipe:cat " + os.path.join(
        shards, "train", pattern))
    without, _ = build(shards, workers=2, train_path="pipe:cat " + str(root / "train" / pattern))
    for (ai, al), (bi, bl) in zip(with_idx, without, strict=True):
        assert torch.equal(al, bl) and torch.equal(ai, bi)


@pytest.mark.parametrize("stream", [False, True])
def test_damaged_record_is_replaced_and_named_once(tiny, tmp_path, capfd, stream):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(tiny.root, src, ignore=shutil.ignore_patterns("lmdb"))
    victim = sorted((src / "train" / "n00000002").iterdir())[0]
    victim.write_bytes(b"<html>not a JPEG</html>")
    write_split(str(src / "train"), str(tmp_path / "train"), UNEVEN, "train")
    write_split(str(src / "val"), str(tmp_path / "val"), [16], "val")
    path = ("pipe:cat " + str(tmp_path / "train" / "train-{000000..000004}.tar") if stream
            else str(tmp_path / "train"))
    train, _ = build(str(tmp_path), workers=2, train_path=path, max_bad_share=0.1)
    for epoch in (0, 1):
        train.set_epoch(epoch)
        assert sum(len(labels) for _, labels in train) == 32
    assert capfd.readouterr().err.count("skipping unreadable sample") == 1


def test_shard_writer_writes_the_bytes_tarfile_writes(tmp_path):
    """ShardWriter's one writev per member gives byte for byte what tarfile.addfile gives for
    the same members (ustar headers, 512-byte padding, end blocks, 10,240-byte records), its
    spans point at each member's data, and its running SHA-256 is the file's."""
    records = [("n01/a_0", b"\xff\xd8" + bytes(range(256)) * 3, 3), ("n02/b_1", b"x" * 512, 12),
               ("n03/c_2", b"", 0), ("n04/d_3", os.urandom(70_001), 999)]
    ours = tmp_path / "ours.tar"
    writer = ShardWriter(str(ours))
    spans = [writer.write(key, image, label) for key, image, label in records]
    assert writer.tell() == ours.stat().st_size
    writer.close(sync=True)
    assert writer.tell() == ours.stat().st_size  # the closed shard's size, as progress.json has
    reference = tmp_path / "reference.tar"
    with tarfile.open(reference, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, image, label in records:
            for name, data in ((f"{key}.jpg", image), (f"{key}.cls", str(label).encode())):
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(data), 0, 0o444
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(data))
    blob = ours.read_bytes()
    assert blob == reference.read_bytes() and len(blob) % 10_240 == 0
    assert writer.sha256() == hashlib.sha256(blob).hexdigest()  # what progress.json records
    for span, (_, image, label) in zip(spans, records):
        assert blob[span.image_offset:span.image_offset + span.image_size] == image
        assert blob[span.label_offset:span.label_offset + span.label_size] == str(label).encode()
