""":mod:`tools.gpu_check.report` and ``rows.measure``: what the check reads from main.py's runs and
pytest's output, and how it judges and shows them, on made-up rows and files (the dry run end
to end is ``test_check.py``)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tools.gpu_check import plan
from tools.gpu_check import report as gpu_report
from tools.gpu_check import report as markdown
from tools.gpu_check.rows import measure
from tools.gpu_check.runner import json_lines


def speed_of(folder):
    return measure.read_speed(json_lines((folder / "metrics.jsonl").read_text()))


def test_speed_falls_back_to_the_whole_epoch(tmp_path):
    def speed(**record):
        record = {"epoch": 0, "train_images_per_sec": 10.0, "data_time_fraction": 0.1, **record}
        (tmp_path / "metrics.jsonl").write_text(json.dumps(record) + "\n")
        return speed_of(tmp_path)

    assert speed(steady_images_per_sec=12.5)["images_per_sec"] == 12.5
    for missing in ({}, {"steady_images_per_sec": None}):
        fallback = speed(**missing)
        assert fallback["images_per_sec"] == 10.0 and fallback["includes_warmup"]
        assert fallback["speed_key"] == "train_images_per_sec"
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError):
        speed_of(tmp_path)


def test_a_run_whose_loss_is_nan_fails(tmp_path):
    """Diverged weights train as fast as healthy ones: such a speed proves nothing (the first
    H100 run's float16 rows did, before fused SGD was dropped under loss scaling)."""
    record = {"epoch": 0, "train_images_per_sec": 10.0, "train_loss": float("nan")}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(record) + "\n")  # NaN, as main.py writes
    with pytest.raises(ValueError, match="train loss nan: the weights diverged"):
        speed_of(tmp_path)
    record["train_loss"] = 4.5
    (tmp_path / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    assert speed_of(tmp_path)["train_loss"] == 4.5


def test_pytest_summary_and_failing_tests_are_parsed():
    text = ("..F.s\n=== short test summary info ===\n"
            "SKIPPED [1] tests/engine/test_gpu.py:14: needs a CUDA GPU\n"
            "FAILED tests/engine/test_gpu.py::test_amp_channels_last_training_on_gpu - RuntimeError: x\n"
            "ERROR tests/loaders/test_dali.py::test_contract[dali] - OSError\n"
            "1 failed, 3 passed, 1 skipped, 250 deselected, 1 error in 12.34s\n")
    parsed = measure.parse_pytest(text)
    assert parsed["counts"] == {"passed": 3, "failed": 1, "skipped": 1, "error": 1,
                                "deselected": 250}
    assert parsed["failed_tests"] == ["tests/engine/test_gpu.py::test_amp_channels_last_training_on_gpu",
                                      "tests/loaders/test_dali.py::test_contract[dali]"]
    assert measure.parse_pytest("ImportError while loading conftest")["counts"] == {}


def test_the_target_caps_a_training_share_by_the_loader_alone():
    """As on the first H100 run: folder trains at 99% of synthetic (the timed steps began with
    the batches queued during start-up), but alone it gives 62% of synthetic's images/s."""
    def row(loader, speed, bound=None):
        return {"name": f"train-resnet50-{loader}", "model": "resnet50",
                "loader": loader.split("-")[0],
                "status": "passed", "images_per_sec": speed,
                **({"base": "train-resnet50-synthetic", "bound": bound} if bound else {})}

    def alone(name, speed):
        return {"name": name, "status": "passed", "images_per_sec": speed}

    rows = [row("synthetic", 4575.5), row("folder", 4525.8, "loader-folder"),
            row("lmdb-jall", 4469.7, "loader-lmdb-jall"), alone("loader-folder", 2859.6),
            alone("loader-folder-jless", 4600.0),  # bounds no row: does not count
            alone("loader-lmdb-jall", 2933.6)]

    def target(rows, dry_run=False):
        by = {r["name"]: r for r in rows}
        return gpu_report.target({r["name"]: gpu_report.share_of(by, r) for r in rows
                                  if r.get("base")}, "resnet50", dry_run)

    capped = target(rows)
    assert capped["met"] is False and capped["best_loader"] == "lmdb-jall"
    assert capped["best_ratio"] == capped["loader_only_ratio"] == 0.641
    assert gpu_report.target_text(capped) == (
        "target: resnet50 best loader >= 95% of synthetic: NOT met (best: lmdb-jall at 64%)")
    uncapped = target([r for r in rows if not r["name"].startswith("loader")])
    assert uncapped["met"] is True and uncapped["best_loader"] == "folder"
    assert "no loader-only figure" in uncapped["note"]
    assert target(rows, dry_run=True)["met"] is None  # a dry run judges nothing


def test_the_figures_table_shows_each_share_raw_bounded_and_judged():
    """The report's shares: the training row's share of synthetic, the loader alone's, and
    the judged one (capped by both and by 100%), beside each loader alone's target."""
    by = [{"name": "train-resnet50-synthetic", "model": "resnet50", "loader": "synthetic",
           "status": "passed", "images_per_sec": 4575.5},
          {"name": "train-resnet50-lmdb-jall", "model": "resnet50", "loader": "lmdb",
           "status": "passed", "images_per_sec": 4525.8, "base": "train-resnet50-synthetic",
           "bound": "loader-lmdb-jall", "share_spread": 0.02},
          {"name": "loader-lmdb-jall", "status": "passed", "images_per_sec": 2859.6},
          {"name": "loader-gpudecode-j4", "status": "passed", "images_per_sec": 12000.0}]
    s = SimpleNamespace(batch=256, warmup=5, steps=200, workers="auto", models=["resnet50"],
                        rows=None, sizes=[], accel=["--gpu", "0"], dry_run=False, budget=None,
                        later=[], step_info=None)
    report = markdown.build(s, by)
    share = report["shares"]["train-resnet50-lmdb-jall"]
    assert (share["raw"], share["alone"], share["judged"]) == (0.989, 0.625, 0.625)
    assert report["loaders"]["loader-gpudecode-j4"] == {"images_per_sec": 12000.0,
                                                        "target": 10000.0}
    text = markdown.figures_md(report)
    assert "| train-resnet50-lmdb-jall | 99% | 62% | 62% | 2% | - | passed | >= 95% |" in text
    assert "| loader-gpudecode-j4 | 12,000.0 | >= 10,000 |" in text


def test_a_share_above_synthetic_beyond_the_steps_spread_fails(tmp_path):
    """Data-fed training cannot beat synthetic data: a share above 100% by more than the
    spread of either row's steps is a failed row, within it the share counts as 100%."""
    def record(p50, p90):
        return {"epoch": 0, "train_images_per_sec": 9.0, "steady_images_per_sec": 10.0,
                "stages_step_ms_p50": p50, "stages_step_ms_p90": p90}

    (tmp_path / "metrics.jsonl").write_text(json.dumps(record(50.0, 52.0)) + "\n")
    assert speed_of(tmp_path)["spread"] == 0.04
    synthetic = {"status": "passed", "loader": "synthetic", "images_per_sec": 4900.0,
                 "spread": 0.04}
    row = {"name": "train-resnet50-lmdb", "status": "passed", "loader": "lmdb",
           "model": "resnet50", "images_per_sec": 4900.0 * 1.48, "spread": 0.01}
    done = {"train-resnet50-synthetic": synthetic}
    failed = gpu_report.judged(dict(row), None, done)
    assert failed["status"] == "failed" and failed["ratio_to_synthetic"] == 1.48
    assert failed["reason"] == ("148% of synthetic, beyond the steps' spread of 4%: not a "
                                "steady-state figure")
    within = gpu_report.judged({**row, "images_per_sec": 4900.0 * 1.03}, None, done)
    assert within["status"] == "passed" and gpu_report.share_of(done, within)["judged"] == 1.0
    by = {"s": {"status": "passed", "images_per_sec": 100.0},
          "b": {"status": "passed", "images_per_sec": 60.0}}
    row = {"status": "passed", "images_per_sec": 90.0, "base": "s", "bound": "b"}
    assert gpu_report.share_of(by, row)["judged"] == 0.6  # capped by the loader alone
    assert gpu_report.share_of(by, {**row, "status": "failed"})["judged"] is None


def test_training_and_loader_rows_carry_the_stage_figures(tmp_path):
    from types import SimpleNamespace

    from tools.gpu_check.rows import measure as gpu_rows

    benchmark = {"loader": "lmdb", "images": 64, "seconds": 0.5, "images_per_sec": 128.0,
                 "device": "cpu", "stages_bound": None, "stages_read_ms_p50": 0.04,
                 "stages_advice": []}

    class Runner:
        def run(self, name, cmd, timeout, env=None):
            return {"name": name, "status": "passed", "command": " ".join(cmd)}

        def attach_tails(self, record):
            return record

        def text(self, name, stream="out"):
            if name.startswith("loader"):
                return json.dumps(benchmark) + "\n"
            return "device: cpu; 1 process\n"

    s = SimpleNamespace(steps=2, warmup=1, batch=8, sizes=[], accel=[], dry_run=True,
                        out=str(tmp_path), workers="1")
    data = SimpleNamespace(reason=None, lmdb=str(tmp_path), lmdb_reason=None)

    def ctx(runner):
        return SimpleNamespace(runner=runner, s=s, machine={}, data=data, done={})

    row = gpu_rows.main_row(ctx(Runner()), plan.Row("loader-lmdb", 4, "alone", "lmdb", "1"), 60)
    assert row["stages"] == {"stages_bound": None, "stages_read_ms_p50": 0.04,
                             "stages_advice": []}
    assert not any(k.startswith("stages_") for k in row) and row["images_per_sec"] == 128.0
    rundir = tmp_path / "runs" / "train-resnet18-lmdb"
    record = {"epoch": 0, "train_images_per_sec": 19.1, "stages_bound": "data",
              "stages_advice": ["-j 2 (now 1): about 1,600 images/s (2.00x)"]}

    class TrainRunner(Runner):
        def run(self, name, cmd, timeout, env=None):
            rundir.mkdir(parents=True, exist_ok=True)
            (rundir / "metrics.jsonl").write_text(json.dumps(record) + "\n")
            return super().run(name, cmd, timeout, env)

    row = gpu_rows.main_row(ctx(TrainRunner()), plan.Row("train-resnet18-lmdb", 4, "train",
                                                         "lmdb", "all"), 60)
    assert row["status"] == "passed" and row["stages"]["stages_bound"] == "data"
    assert row["stages"]["stages_advice"] == record["stages_advice"]
    md = markdown.rows_md({"rows": [row]})
    assert "| train-resnet18-lmdb |" in md and "main.py's stage table, bound and advice in the row's log, `logs/ROW.out`" in md
