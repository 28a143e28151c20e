"""engine.report.bounds on constructed stage figures: the table's fields, the bound line and each
advice rule (-j 1 on 2 cores names more workers; mostly >512 px images
name a cap or a raw share; nothing when the run is not data-bound)."""
import json

import pytest

from engine.report import bounds
from engine.report.advice import advise as advice_of
from engine.report.bounds import Machine, Steps

STAGES = ("read", "window", "decode", "resize", "augment", "write")


def figures(ms: dict, workers: int = 2, cpu_share: float = 0.97, gt512: float = 0.1,
            big_decode: float | None = None, images: int = 1000, kinds=None) -> dict:
    """A ``StageLog.summary()``-shaped dict: mean ms per stage ``ms`` (p50 = mean, p90 =
    1.5 x), ``workers`` each at the images/s the stages' sum gives, ``gt512`` of the images
    above 512 px decoding in ``big_decode`` ms (the rest in the mean decode)."""
    stages = {s: {"mean": ms.get(s, 0.0), "p50": ms.get(s, 0.0), "p90": 1.5 * ms.get(s, 0.0)}
              for s in STAGES}
    total = sum(v["mean"] for v in stages.values())
    stages["total"] = {"mean": total, "p50": total, "p90": 1.5 * total}
    small = ms.get("decode", 0.0)
    per_worker = 1000.0 / total
    return {
        "images": images, "stages": stages,
        "decoders": kinds or {"window": {"share": 1.0, "mean": small, "p50": small,
                                         "p90": small}},
        "workers": [{"id": i, "images": images // workers, "ms_per_image": total * 1.02,
                     "stages_ms_per_image": total,
                     "images_per_sec": per_worker, "cpu_share": cpu_share, "slot_wait_ms": 0.0}
                    for i in range(workers)],
        "worker_ms_per_image": total * 1.02, "loader_images_per_sec": per_worker * workers,
        "sizes": {"le256": {"share": 0.0, "decode_ms": None, "ms": None},
                  "le512": {"share": 1 - gt512, "decode_ms": small, "ms": total},
                  "gt512": {"share": gt512, "decode_ms": big_decode or small, "ms": total}},
        "kb_per_image": 110.0, "copy_ms_per_batch": {"p50": 2.0, "p90": 3.0}}


def data_bound(images: int = 6400, wait: float = 0.5) -> Steps:
    """An epoch of 100 s whose training thread waited ``wait`` of it; steps of 10 ms (the
    model alone: 6,400 images/s, above every loader estimate here)."""
    batches = 100
    return Steps(images, 100.0, [wait * 100.0 / batches] * batches, [0.01] * batches)


def model_bound() -> Steps:
    return Steps(6400, 100.0, [0.02] * 100, [0.95] * 100)


def test_table_has_every_stage_with_median_p90_and_share():
    loader = figures({"read": 0.1, "window": 0.1, "decode": 3.0, "resize": 0.5,
                      "augment": 0.2, "write": 0.1})
    lines = bounds.table(loader, data_bound(), Machine(cores=8, workers=2))
    text = "\n".join(lines)
    for stage in STAGES:
        (row,) = [line for line in lines if line.split()[:1] == [stage]]
        p50, p90 = loader["stages"][stage]["p50"], loader["stages"][stage]["p90"]
        assert f"{p50:.2f} /" in row and f"{p90:.2f}" in row, row
    assert "75%" in [line for line in lines if line.split()[:1] == ["decode"]][0]  # 3 of 4 ms
    assert "stages' sum 4.00 ms per image, the workers measured 4.08 (98%)" in text
    assert "training thread per batch (median / p90): wait 500.00 / 500.00 ms" in text
    assert "step 10.00 / 10.00 ms" in text and "copy 2.00 / 3.00 ms" in text


def test_bound_line_names_capacity_model_rate_and_top_stage():
    loader = figures({"read": 0.29, "decode": 1.96, "write": 0.51}, workers=8)
    steps = Steps(4900, 10.0, [3.0], [1.0])  # the model alone: 4,900 images/s
    kind, line = bounds.bound(loader, steps, 8)
    assert kind == "data"
    assert line == ("data-bound: the 8 workers can give 2,899 images/s, the model takes 4,900 "
                    "images/s; waited for data 30% of the epoch; decode is 71% of a worker's time")
    kind, line = bounds.bound(loader, model_bound(), 8)
    assert kind == "model" and line.startswith("model-bound: the model takes 67 images/s")
    kind, line = bounds.bound(loader, None, 8)
    assert kind is None and line.startswith("loader alone: the 8 workers can give 2,899")


def test_one_worker_on_two_idle_cores_names_more_workers():
    loader = figures({"read": 0.1, "decode": 1.2, "resize": 0.4, "write": 0.1}, workers=1)
    machine = Machine(cores=2, workers=1, busy_cores=1.2)
    advice = advice_of(loader, data_bound(), machine)
    assert advice and advice[0].startswith("-j 2 (now 1): about 1,111 images/s (2.00x)")
    assert "kept 1.2 of the 2 cores busy, 0.8 idle" in advice[0]


def test_more_workers_only_for_idle_cores_and_one_kept_on_a_gpu():
    loader = figures({"read": 0.1, "decode": 1.2, "resize": 0.4, "write": 0.1}, workers=1)
    busy = advice_of(loader, data_bound(), Machine(cores=2, workers=1, busy_cores=1.9))
    assert not any(line.startswith("-j") for line in busy)
    gpu = Machine(cores=8, workers=4, device="cuda", busy_cores=4.2)
    line = next(a for a in advice_of(loader, data_bound(), gpu) if a.startswith("-j"))
    assert line.startswith("-j 7 (now 4)") and "the training process keeps one" in line
    full = Machine(cores=8, workers=7, device="cuda", busy_cores=6.0)
    assert not any(a.startswith("-j") for a in advice_of(loader, data_bound(), full))
    starved = figures({"read": 0.1, "decode": 1.2, "resize": 0.4, "write": 0.1}, workers=1,
                      cpu_share=0.3)
    (line, *_) = advice_of(starved, data_bound(), Machine(cores=2, workers=1, busy_cores=1.0))
    assert line.startswith("-j 2") and "the workers got 30% of their cores" in line


def test_mostly_large_images_name_a_cap_or_raw_share():
    loader = figures({"read": 0.1, "window": 0.1, "decode": 6.0, "resize": 0.5, "write": 0.1},
                     gt512=0.7, big_decode=7.5)
    loader["sizes"]["le512"]["decode_ms"] = 2.5
    advice = advice_of(loader, data_bound(), Machine(cores=2, workers=2, busy_cores=1.9))
    assert advice and ("MAX_SIDE=512" in advice[0] or "RAW_BUDGET" in advice[0])
    # the cap's estimate: 70% of the images 5 ms faster per image of 6.8 ms
    assert "MAX_SIDE=512" in advice[0] and f"({6.8 / (6.8 - 0.7 * 5.0):.2f}x)" in advice[0]
    assert any("RAW_BUDGET=1.5x" in line for line in advice)


def test_decode_bound_on_a_gpu_names_decode_device_cuda():
    loader = figures({"read": 0.1, "window": 0.1, "decode": 3.0, "resize": 0.6, "write": 0.2})
    advice = advice_of(loader, data_bound(), Machine(cores=16, workers=16, device="cuda",
                                                         busy_cores=15.5))
    assert advice[0].startswith("--decode-device cuda")
    cpu = advice_of(loader, data_bound(), Machine(cores=16, workers=16, busy_cores=15.5))
    assert not any("--decode-device" in line for line in cpu)


@pytest.mark.parametrize("source,order,expected", [
    ("lmdb", "random", "--lmdb-order block --lmdb-readahead on"),
    ("folder", "random", "a copy of the dataset on a local disk"),
    ("lmdb", "block", "a copy of the LMDB on a local disk")])
def test_read_bound_names_block_order_or_a_local_copy(source, order, expected):
    loader = figures({"read": 4.0, "decode": 1.0, "write": 0.1})
    advice = advice_of(loader, data_bound(), Machine(cores=2, workers=2, source=source,
                                                         lmdb_order=order, busy_cores=1.9))
    assert advice and advice[0].startswith(expected)


def test_augment_bound_names_a_lighter_policy():
    loader = figures({"read": 0.1, "decode": 1.0, "augment": 2.0, "write": 0.1})
    machine = Machine(cores=2, workers=2, auto_augment="ta_wide", busy_cores=1.9)
    assert advice_of(loader, data_bound(), machine)[0].startswith("drop --auto-augment ta_wide")
    plain = Machine(cores=2, workers=2, busy_cores=1.9)  # the flip alone: nothing to drop
    assert not any("--auto-augment" in line for line in advice_of(loader, data_bound(), plain))


def test_no_advice_when_not_data_bound_or_not_measured():
    loader = figures({"read": 0.1, "decode": 6.0, "write": 0.1}, workers=1, gt512=0.9,
                     big_decode=8.0)
    machine = Machine(cores=8, workers=1, device="cuda", busy_cores=1.0)
    assert advice_of(loader, model_bound(), machine) == []
    assert advice_of(None, data_bound(), machine) == []
    assert len(advice_of(loader, data_bound(), machine)) == 2  # at most two lines


def test_report_metrics_are_flat_json_and_numbers():
    loader = figures({"read": 0.1, "decode": 3.0, "resize": 0.5, "write": 0.1})
    out = bounds.report(loader, data_bound(), Machine(cores=2, workers=1, busy_cores=1.2))
    metrics = json.loads(json.dumps(out["metrics"]))
    assert metrics["stages_bound"] == "data" and metrics["stages_advice"] == out["advice"]
    for key, value in metrics.items():
        assert key.startswith("stages_")
        if key not in ("stages_bound", "stages_advice", "stages_worker_coverage"):
            assert value is None or isinstance(value, (int, float)), key
    assert metrics["stages_worker_coverage"] == [pytest.approx(1 / 1.02)] * 2
    assert metrics["stages_decode_ms_p50"] == 3.0 and metrics["stages_wait_ms_p50"] == 500.0
    assert metrics["stages_step_images_per_sec"] == pytest.approx(6400.0)
    assert metrics["stages_loader_images_per_sec"] == pytest.approx(2 * 1000 / 3.7)
    # a training run's table ends with the bound and the advice
    tail = len(out["advice"]) + 1
    assert len(out["advice"]) == 2 and out["lines"][-tail].startswith("  data-bound:")
    assert out["lines"][-tail + 1:] == [f"  try {line}" for line in out["advice"]]
