"""loaders.timing.stages: per-image stage times written beside the pixels by real DataLoader workers,
summed by the main process; the same pixels with or without them."""
import glob
import os

import numpy as np
import pytest
import torch

import decode
from decode import acceptance, raw
from loaders.timing import stages
from tests.helpers.loading import batches_and_stages, loader_settings


@pytest.mark.parametrize("workers", [0, 2])
def test_measuring_changes_no_pixel(tiny, monkeypatch, workers):
    settings = loader_settings("lmdb", tiny.lmdb, workers=workers, batch_size=4)
    monkeypatch.setenv("IMAGENET_FAST_STAGES", "0")
    plain, none = batches_and_stages(settings, 5)
    monkeypatch.delenv("IMAGENET_FAST_STAGES")
    timed, figures = batches_and_stages(settings, 5)
    assert none is None and figures["images"] == 5 * 4
    for (a, la), (b, lb) in zip(plain, timed):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_workers_stages_add_up_to_their_time(sample_images_lmdb):
    """Every stage measured, and the figures consistent with one another: the stages sum to
    the total, per decoder and per size class to the decode and the total, per worker to all
    workers', and lie inside the workers' wall time (measured around them by the same clock).
    How much of the wall time they cover is a ratio for benchmarks/loading/stage_cost.py, not a
    unit test: a busy machine takes a worker off its core between two stages."""
    settings = loader_settings("lmdb", sample_images_lmdb, workers=2, batch_size=16,
                               train_crop_size=224)
    _, figures = batches_and_stages(settings, 4)
    assert figures["images"] == 64 and figures["workers_configured"] == 2
    assert {w["id"] for w in figures["workers"]} == {0, 1}
    assert sum(w["images"] for w in figures["workers"]) == 64
    st = figures["stages"]
    for name in ("read", "window", "decode", "resize", "write"):
        assert st[name]["mean"] > 0, name
        assert st[name]["p90"] >= st[name]["p50"] > 0, name
    stage_sum = sum(st[s]["mean"] for s in stages.STAGES)
    assert stage_sum == pytest.approx(st["total"]["mean"])
    decoders, sizes = figures["decoders"].values(), figures["sizes"].values()
    assert sum(d["share"] for d in decoders) == pytest.approx(1.0)
    assert sum(d["share"] * d["mean"] for d in decoders) == pytest.approx(st["decode"]["mean"])
    assert sum(s["share"] for s in sizes) == pytest.approx(1.0)
    assert sum(s["share"] * s["ms"] for s in sizes if s["ms"] is not None) == pytest.approx(
        st["total"]["mean"])
    assert figures["sizes"]["gt512"]["share"] > 0  # the sample has images above 512 px
    workers = figures["workers"]
    assert sum(w["stages_ms_per_image"] * w["images"] for w in workers) / 64 == pytest.approx(
        stage_sum)
    assert sum(w["ms_per_image"] * w["images"] for w in workers) / 64 == pytest.approx(
        figures["worker_ms_per_image"])
    for worker in workers:  # inside the wall time
        assert 0 < worker["stages_ms_per_image"] <= worker["ms_per_image"] * (1 + 1e-9)
    assert 0 < stage_sum <= figures["worker_ms_per_image"] * (1 + 1e-9)
    assert figures["loader_images_per_sec"] == pytest.approx(
        sum(w["images_per_sec"] for w in workers))
    assert figures["kb_per_image"] > 10 and figures["copy_ms_per_batch"]["p50"] > 0


def _sample_jpeg(sample) -> bytes:
    path = sorted(glob.glob(os.path.join(sample, "train", "*", "*.JPEG")))[0]
    with open(path, "rb") as f:
        return f.read()


def test_decode_crop_names_the_decoder_and_keeps_the_pixels(sample_images):
    data = _sample_jpeg(sample_images)
    frame = acceptance.check(data)
    height, width = decode.image_size(data)
    assert (frame.height, frame.width) == (height, width) and frame.components == 3
    whole = decode.decode(data)
    cases = {"scaled": (data, (0, 0, height, width), None),
             "window": (data, (10, 20, 40, 40), None),
             "whole": (data, (10, 20, 40, 40), whole),
             "raw": (raw.encode_raw(whole), (5, 6, 50, 60), None)}
    for kind, (record, window, image) in cases.items():
        got, pixels = decode.decode_crop(record, window, (32, 32), image)
        assert got == kind
        resized = pixels if kind == "scaled" else decode.resize(pixels, (32, 32))
        assert torch.equal(resized, decode.decode_window(record, window, (32, 32), image)), kind
        if kind != "raw":  # the frame check() read gives the same pixels as none
            assert torch.equal(resized, decode.decode_window(record, window, (32, 32), image,
                                                             frame=frame)), kind


def test_stage_log_sums_and_quantiles():
    log = stages.StageLog()
    rows = np.zeros(4 * stages.IMAGE_COLUMNS)
    per_image = rows.reshape(4, stages.IMAGE_COLUMNS)
    per_image[:, stages.DECODE] = [0.001, 0.002, 0.003, 0.010]  # seconds
    per_image[:, stages.READ] = 0.0005
    per_image[:, stages.KIND] = [1, 2, 2, 3]  # scaled, window, window, whole
    per_image[:, stages.SIDE] = [200, 500, 500, 1000]
    per_image[:, stages.BYTES] = 1024
    batch = np.array([1.0, 0.02, 0.01, 0.001])  # worker 1, 20 ms wall, 10 ms CPU, 1 ms wait
    log.add_slot(rows, batch, 4)
    log.add_copy(0.004)
    out = log.summary()
    assert out["images"] == 4 and out["kb_per_image"] == 1.0
    assert out["stages"]["decode"]["mean"] == pytest.approx(4.0)
    assert out["stages"]["decode"]["p50"] == pytest.approx(2.0, rel=0.03)
    assert out["stages"]["decode"]["p90"] == pytest.approx(10.0, rel=0.03)
    assert out["stages"]["read"]["p50"] == pytest.approx(0.5, rel=0.03)
    assert out["stages"]["total"]["mean"] == pytest.approx(4.5)
    assert {k: d["share"] for k, d in out["decoders"].items()} == {
        "scaled": 0.25, "window": 0.5, "whole": 0.25}
    assert out["decoders"]["window"]["mean"] == pytest.approx(2.5)
    assert out["sizes"]["gt512"] == {"share": 0.25, "decode_ms": pytest.approx(10.0),
                                     "ms": pytest.approx(10.5)}
    (worker,) = out["workers"]
    assert worker["id"] == 1 and worker["images_per_sec"] == pytest.approx(200.0)
    assert worker["cpu_share"] == pytest.approx(0.5) and worker["slot_wait_ms"] == 1.0
    assert worker["stages_ms_per_image"] == pytest.approx(4.5)
    assert out["loader_images_per_sec"] == pytest.approx(200.0)
    assert out["copy_ms_per_batch"]["p50"] == pytest.approx(4.0)
    log.reset()
    assert log.summary()["images"] == 0
