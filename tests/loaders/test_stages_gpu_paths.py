"""loaders.timing.stages: the stages of the batch-decode pipeline (``--decode-device``, on
nvImageCodec's CPU backend here) and of DALI (CPU-only here): the stages each has, with
positive figures inside the time measured around them, none it does not have, the same pixels
with or without them, and none at all with ``IMAGENET_FAST_STAGES=0``. How much of
that time they cover is a ratio for the benchmarks, not for a unit test on a busy machine."""
import numpy as np
import pytest
import torch

from engine.report import bounds
from loaders.timing.stages import StageLog
from tests.helpers.loading import batches_and_stages, loader_settings


def _same_batches_and_figures(settings, monkeypatch, count: int) -> dict:
    """The figures of ``count`` batches, after checking that the batches equal those of a
    run with ``IMAGENET_FAST_STAGES=0``, which measures nothing."""
    monkeypatch.setenv("IMAGENET_FAST_STAGES", "0")
    plain, none = batches_and_stages(settings, count)
    monkeypatch.delenv("IMAGENET_FAST_STAGES")
    timed, figures = batches_and_stages(settings, count)
    assert none is None
    for (a, la), (b, lb) in zip(plain, timed, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    return figures


def _check_readers(figures, images: int, ids: set) -> None:
    """The readers' (workers' or feed threads') figures: all images read, their stages
    inside their measured wall time."""
    assert {w["id"] for w in figures["workers"]} == ids
    assert sum(w["images"] for w in figures["workers"]) >= images  # feeds read ahead
    for worker in figures["workers"]:
        assert 0 < worker["stages_ms_per_image"] <= worker["ms_per_image"] * (1 + 1e-9)
        assert worker["images_per_sec"] > 0 and worker["cpu_share"] > 0
    assert figures["kb_per_image"] > 0


@pytest.mark.parametrize("workers", [0, 2])
def test_decode_device_stages(tiny, monkeypatch, workers):
    pytest.importorskip("nvidia.nvimgcodec")
    settings = loader_settings("folder", tiny.root, decode_device="cpu-nvimgcodec",
                               workers=workers, batch_size=4)
    figures = _same_batches_and_figures(settings, monkeypatch, 100)  # the epoch: 8
    assert figures["images"] == 32 and figures["workers_configured"] == workers
    st = figures["stages"]
    for name in ("read", "window", "decode", "resize", "augment"):
        assert st[name]["mean"] > 0 and st[name]["p90"] >= st[name]["p50"] > 0, name
    assert st["write"] is None and figures["decoders"] == {} and figures["sizes"] is None
    _check_readers(figures, 32, {0, 1} if workers else {-1})
    # the decode thread's stages and hand-over: inside its wall time
    side = figures["batch_decoder"]
    assert side["images"] == 32
    assert side["where"] == ("decode thread" if workers else "training thread's decode")
    staged = sum(st[s]["mean"] for s in ("decode", "resize", "augment"))
    copies = figures["copy_ms_per_batch"]
    assert copies["p90"] >= copies["p50"] > 0
    assert 0 < staged <= side["ms_per_image"] * (1 + 1e-9)
    assert figures["loader_images_per_sec"] == pytest.approx(min(
        sum(w["images_per_sec"] for w in figures["workers"]), side["images_per_sec"]))
    assert figures["wait_ms_per_batch"] is None


@pytest.mark.parametrize("workers", [1, 2])
def test_dali_cpu_stages(tiny, monkeypatch, workers):
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    settings = loader_settings("dali", tiny.root, workers=workers, batch_size=4)
    figures = _same_batches_and_figures(settings, monkeypatch, 100)  # the epoch: 8
    assert figures["images"] == 32
    st = figures["stages"]
    for name in ("read", "window", "resize", "augment"):
        assert st[name]["mean"] > 0 and st[name]["p90"] >= st[name]["p50"] > 0, name
    # DALI decodes inside its graph: no decode figure is made up, nor a rate without it
    assert st["decode"] is None and st["write"] is None
    assert figures["loader_images_per_sec"] is None
    _check_readers(figures, 32, set(range(workers)))
    side = figures["batch_decoder"]
    assert side["images"] == 32 and side["ms_per_image"] > 0
    waits = figures["wait_ms_per_batch"]
    assert waits["p90"] >= waits["p50"] >= 0
    # resize, flips and the hand-over are inside the training thread's time for the batches
    staged = st["resize"]["mean"] + st["augment"]["mean"]
    copies = figures["copy_ms_per_batch"]
    assert copies["p90"] >= copies["p50"] > 0
    assert 0 < staged <= side["ms_per_image"] * (1 + 1e-9)
    assert figures["readers"] == "feed threads"
    out = bounds.report(figures, None, bounds.Machine(cores=2, workers=workers, pipeline="dali"))
    text = "\n".join(out["lines"])
    assert "feed threads: stages' sum" in text and "waited for DALI's output" in text
    assert "outside DALI" in text and out["advice"] == []  # no rate: no estimate from it
    assert "stages_decode_ms_mean" not in out["metrics"]


def test_batch_stage_log_sums_and_absent_stages():
    log = StageLog(("read", "window", "decode"), "decode thread")
    log.add("read", [0.001, 0.002, 0.003, 0.010])
    log.add_batch("window", 0.004, 4)
    log.add_reader(0, 4, 0.05, 0.025, 0.020, 4096)
    log.add_hand_over(4, {"decode": 0.008, "copy": 0.002}, 0.01, 0.005)
    out = log.summary()
    assert out["images"] == 4 and out["kb_per_image"] == 1.0
    assert out["stages"]["read"]["mean"] == pytest.approx(4.0)
    assert out["stages"]["read"]["p90"] == pytest.approx(10.0, rel=0.03)
    assert out["stages"]["window"]["p50"] == pytest.approx(1.0, rel=0.03)
    assert out["stages"]["decode"]["mean"] == pytest.approx(2.0)
    for absent in ("resize", "augment", "write"):
        assert out["stages"][absent] is None
    assert out["stages"]["total"] == {"mean": pytest.approx(7.0), "p50": None, "p90": None}
    (reader,) = out["workers"]
    assert reader["images_per_sec"] == pytest.approx(80.0) and reader["cpu_share"] == 0.5
    assert reader["stages_ms_per_image"] == pytest.approx(5.0)
    assert out["batch_decoder"]["images_per_sec"] == pytest.approx(400.0)
    assert out["loader_images_per_sec"] == pytest.approx(80.0)  # the slower side
    assert out["copy_ms_per_batch"]["p50"] == pytest.approx(2.0)
    with pytest.raises(ValueError):
        StageLog(("read", "unpack"), "x")
    unrated = StageLog(("read",), "training thread", rated=False)
    unrated.add_reader(0, 4, 0.05, 0.02, 0.01)
    assert unrated.summary()["loader_images_per_sec"] is None
    log.reset()
    assert log.summary()["images"] == 0


def test_bounds_report_a_batch_pipeline():
    """engine.report.bounds takes a batch pipeline's figures: only its stages in the table and the
    stages_* keys, its decode thread's line, and advice that holds for it."""
    log = StageLog(("read", "window", "decode", "resize", "augment"), "decode thread")
    log.add("read", np.full(64, 0.0002))
    log.add("window", np.full(64, 0.0001))
    log.add_reader(0, 64, 0.04, 0.03, 0.0192)
    log.add_hand_over(64, {"decode": 0.064, "resize": 0.01, "augment": 0.001, "copy": 0.002},
                      0.08, 0.02)
    figures = log.summary()
    machine = bounds.Machine(cores=8, workers=1, device="cuda", pipeline="gpu_decode",
                             busy_cores=2.0)
    steps = bounds.Steps(images=64, seconds=1.0, waits=[0.5], steps=[0.1])
    out = bounds.report(figures, steps, machine)
    text = "\n".join(out["lines"])
    assert "decode thread: 1.25 ms per image" in text and "write" not in text
    assert out["bound"] == "data"
    assert "decode is 68% of an image's measured stages" in text
    assert "stages_write_ms_mean" not in out["metrics"]
    assert out["metrics"]["stages_decode_ms_mean"] == pytest.approx(1.0)
    assert out["metrics"]["stages_decoder_images_per_sec"] == pytest.approx(800.0)
    assert "stages_gt512_share" not in out["metrics"]
    # more workers would read faster, but the decode thread (800 images/s) stays the limit
    assert not any(a.startswith("-j ") for a in out["advice"])
    assert not any("RAW_BUDGET" in a or "--decode-device cuda" in a for a in out["advice"])
