"""The full check (``make gpu-check``): its CPU dry run end to end on 8 real ImageNet classes,
its one-line input errors, and what a GPU run relies on that the dry run cannot reach here:
installing the bundle's wheels, a test file skipped at collection, the time budget and the
Makefile targets (reading main.py's figures and the report: test_report.py)."""
from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.helpers import warm
from tests.helpers.paths import REPO
from tests.helpers.gpu_fakes import fake_gpu_run, fake_wheel, gpu_check_cli, make_bundle
from tools.gpu_check import full
from tools.gpu_check.machine import data, install
from tools.gpu_check.machine import environment as machine
from tools.gpu_check import report as gpu_report
from tools.gpu_check.rows import base as gpu_rows
from tools.gpu_check import runner as gpu_runner


@pytest.fixture(scope="module")
def dry_run(sample_images, tmp_path_factory):
    """One CPU dry run (tiny sizes: 32 px, -b 4, 1 + 2 steps) over a bundle of 8 classes."""
    root = tmp_path_factory.mktemp("gpu-check")
    bundle = make_bundle(sample_images, root / "bundle")
    with pytest.MonkeyPatch.context() as patch:  # its main.py processes start warm
        patch.setattr(gpu_runner, "subprocess", warm)
        code, out, err = gpu_check_cli(["--dry-run", "--bundle", str(bundle), "--out",
                                        str(root / "out")])
    report = json.loads((root / "out" / "report.json").read_text())
    return SimpleNamespace(code=code, stdout=out, stderr=err, out=root / "out", report=report,
                           sections=report["sections"])


@pytest.mark.heavy
def test_dry_run_passes_and_ends_with_a_summary(dry_run):
    failed = [r for r in gpu_report.rows_of(dry_run.report) if r["status"] == "failed"]
    assert dry_run.code == 0, (failed, dry_run.stderr)
    summary = dry_run.report["summary"]
    assert summary["failed"] == 0 and summary["passed"] >= 10
    assert (f"gpu-check: {summary['passed']} checks passed, 0 failed, 0 timed out, "
            f"{summary['skipped']} not run" in dry_run.stdout)
    # a dry run proves nothing about a GPU: it says so, and still exits 0
    assert "dry run on the CPU: checks this script, proves nothing about a GPU" in dry_run.stdout
    assert summary["not_proven"] == len(dry_run.report["not_proven"]) >= 1
    assert not (dry_run.out / "data").exists()  # the replicated data is removed unless --keep-data
    assert (dry_run.out / "logs" / "pytest-test_gpu.out").exists()


@pytest.mark.heavy
def test_environment_is_reported(dry_run):
    machine = dry_run.report["machine"]
    for key in ("python", "cpu_cores", "torch", "torchvision", "cuda", "gpus", "gpu_count",
                "driver", "dali", "lmdb", "pytest"):
        assert key in machine, key
    assert machine["cpu_cores"] == len(os.sched_getaffinity(0))
    assert [r["status"] for r in dry_run.sections["environment"]] == ["passed"]


@pytest.mark.heavy
def test_pytest_section_runs_each_gpu_test_file_and_parses_the_skipped_tests(dry_run):
    rows = dry_run.sections["pytest"]
    assert [r["name"] for r in rows] == ["pytest-test_gpu", "pytest-test_gpu_dali",
                                         "pytest-test_gpu_decode_cuda"]
    for row in rows:
        assert row["status"] == "passed" and "-m gpu" in row["command"]
        assert row["counts"]["failed"] == 0 and row["counts"]["skipped"] >= 1  # no CUDA here
        assert row["failed_tests"] == []
    # skipped GPU tests prove nothing
    not_proven = {x["name"]: x["reason"] for x in dry_run.report["not_proven"]}
    assert all(not_proven[r["name"]].endswith("GPU tests skipped") for r in rows)


@pytest.mark.heavy
def test_training_rows_through_main_py(dry_run):
    rows = {r["loader"]: r for r in dry_run.sections["training"]}
    assert list(rows) == ["synthetic", "folder", "lmdb", "dali", "dali-lmdb"]
    ran = [r for r in rows.values() if r.get("reason") != "not installed"]
    assert {"synthetic", "folder", "lmdb"} <= {r["loader"] for r in ran}
    for row in ran:
        assert row["status"] == "passed" and row["model"] == "resnet18", row
        assert row["images_per_sec"] > 0 and row["ratio_to_synthetic"] > 0
        # main.py's steady figure, or the whole-epoch fallback marked as including warm-up
        assert row["speed_key"] in ("steady_images_per_sec", "train_images_per_sec")
        assert row["includes_warmup"] == (row["speed_key"] == "train_images_per_sec")
        assert "main.py" in row["command"] and "--amp --channels-last -b 4" in row["command"]
        # steady state: warmed up past every batch the pipeline holds ready, then 2 steps
        warm = row["warmup_steps"]
        assert row["timed_steps"] == 2 and warm == gpu_rows.ready_batches(row["loader"], 0) + 1
        assert f"--train-batches {warm + 2} " in row["command"]
        assert f"--benchmark-warmup {warm} " in row["command"]
    assert rows["synthetic"]["ratio_to_synthetic"] == 1.0
    (low, *_) = dry_run.sections["resolution"]
    assert low["status"] == "passed" and low["res"] == 16 and low["speedup"] > 0, low
    assert low["command"].endswith("--train-crop-size 16")
    assert dry_run.sections["compile"] == [
        {"name": "compile", "status": "skipped", "reason": "dry run"}]
    target = dry_run.report["target"]
    assert target["min_ratio"] == 0.95 and target["met"] is None and target["best_loader"]


@pytest.mark.heavy
def test_loader_only_rows(dry_run):
    rows = {r["loader"]: r for r in dry_run.sections["loaders"]}
    assert list(rows) == ["folder", "lmdb", "dali", "dali-lmdb"]
    for loader in ("folder", "lmdb"):
        row = rows[loader]
        assert row["status"] == "passed" and row["images_per_sec"] > 0
        assert row["batch_size"] == 4 and row["device"] == "cpu" and "--benchmark-data" in \
            row["command"]
    for loader in ("dali", "dali-lmdb"):
        assert rows[loader]["status"] == "passed" or rows[loader]["reason"] == "not installed"
    assert "--dali --lmdb --train" in rows["dali-lmdb"]["command"]


@pytest.mark.heavy
def test_gpu_decode_section(dry_run):
    """The batch decode's rows, run on nvImageCodec's CPU backend in a dry run: the GPU probe
    is not proven here; the one-worker timing pair and ResNet-18 at a low side run the
    pipeline, each naming the decoder that did the work."""
    rows = {r["name"]: r for r in dry_run.sections["gpudecode"]}
    # the probe runs on nvImageCodec's CPU backend and torchvision on the CPU: the code only
    assert rows["gpu-decode-probe"]["status"] == "passed", rows["gpu-decode-probe"]
    assert rows["gpu-decode-probe"]["torchvision"]["fallback"] == 0
    assert any("libnvimgcodec" in p for p in rows["gpu-decode-probe"]["libraries"])
    assert rows["gpu-decode-hardware"]["status"] == "skipped"  # no JPEG engine on a CPU
    for name in ("loader-gpudecode-cuda-j1", "loader-gpudecode-cpu-j1"):
        assert rows[name]["status"] == "passed" and rows[name]["images_per_sec"] > 0
        assert rows[name]["workers"] == 1
    assert "--decode-device cpu-nvimgcodec" in rows["loader-gpudecode-cuda-j1"]["command"]
    assert rows["loader-gpudecode-cpu-j1"]["decode_device"] == "cpu"
    assert rows["loader-gpudecode-cuda-j1"]["gpu_over_cpu"] > 0
    assert rows["loader-gpudecode-cuda-j1"]["decoder"] == "nvImageCodec CPU"
    (low,) = [r for r in dry_run.sections["gpudecode"] if r.get("res") == 16]
    assert low["status"] == "passed" and low["loader"] == "gpudecode-lmdb"
    assert low["decoder"] == "nvImageCodec CPU"
    assert "## 8. GPU decoding without DALI" in (dry_run.out / "report.md").read_text()


@pytest.mark.heavy
def test_dali_section(dry_run):
    """DALI's rows, run on DALI's CPU backend in a dry run: the probe imports DALI first and
    decodes (on the CPU), the one-thread timing pair and ResNet-18 at a low side run, and the
    memory row records host RSS after each of 3 epochs (no device memory off CUDA)."""
    rows = {r["name"]: r for r in dry_run.sections["dali"]}
    if "dali" in rows:  # DALI not installed: one skipped row
        assert rows["dali"]["reason"] == "not installed"
        return
    probe = rows["dali-gpu-decode"]
    assert probe["status"] == "passed" and probe["shape"] == [48, 64, 3], probe
    assert probe["output"] == "TensorListCPU" and probe["dali_file"]
    for name in ("loader-dali-mixed-j1", "loader-dali-cpu-j1"):
        assert rows[name]["status"] == "passed" and rows[name]["images_per_sec"] > 0
        assert rows[name]["workers"] == 1
    assert "--dali-cpu" in rows["loader-dali-cpu-j1"]["command"]
    assert rows["loader-dali-mixed-j1"]["gpu_over_cpu"] > 0
    low = [r for r in dry_run.sections["dali"] if r.get("res") == 16]
    assert [r["loader"] for r in low] == ["synthetic", "dali-lmdb"]
    assert all(r["status"] == "passed" and r["model"] == "resnet18" for r in low)
    memory = rows["dali-memory"]
    assert memory["status"] == "passed" and len(memory["host_rss_mib"]) == 3
    assert all(m > 0 for m in memory["host_rss_mib"])
    assert memory["device_memory_mib"] == [None, None, None]
    assert "## 7. DALI's GPU decoding" in (dry_run.out / "report.md").read_text()


@pytest.mark.heavy
def test_distributed_row(dry_run):
    (row,) = dry_run.sections["nccl"]
    assert row["status"] == "passed", row
    assert row["world_size"] == 2 and row["backend"] == "gloo" and row["val_acc1"] is not None
    assert row["process_group"] is True
    assert "--multiprocessing-distributed" in row["command"]


@pytest.mark.heavy
def test_report_md_has_the_tables_and_commands(dry_run):
    text = (dry_run.out / "report.md").read_text()
    assert text.startswith("# GPU check (dry run on CPU)")
    assert ("| model | loader | --compile | images/s | vs synthetic | loader alone vs synthetic |"
            in text)
    assert "| resnet18 | lmdb |" in text and "| folder |" in text
    for heading in ("## 1. Environment", "## 2. GPU tests", "## 3. Training", "## 4. Loader-only",
                    "## 5. Distributed", "## 6. Progressive resizing", "## Not proven on a GPU",
                    "## Commands"):
        assert heading in text
    assert "main.py --multiprocessing-distributed" in text


@pytest.mark.parametrize("flag", ["--bundle", "--data"])
def test_bad_path_is_one_line(tmp_path, flag):
    code, out, err = gpu_check_cli([flag, str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"gpu_check: error: {flag} ")


def test_bundle_without_sample_is_one_line(tmp_path):
    (tmp_path / "b" / "wheels").mkdir(parents=True)
    code, _, err = gpu_check_cli(["--bundle", str(tmp_path / "b"), "--out", str(tmp_path / "o")])
    assert code == 2 and err.count("\n") == 1 and "make gpu-bundle" in err


def test_spent_budget_skips_every_command(sample_images, tmp_path):
    bundle = make_bundle(sample_images, tmp_path / "bundle", classes=2)
    code, out, _ = gpu_check_cli(["--dry-run", "--bundle", str(bundle), "--out", str(tmp_path / "o"),
                            "--budget", "0", "--only", "train", "nccl"])
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert code == 0 and report["summary"]["failed"] == 0  # a dry run: not proven is no error
    rows = report["sections"]["training"] + report["sections"]["nccl"]
    assert all(r["status"] == "skipped" for r in rows)
    assert report["summary"]["not_proven"] >= len(rows)
    assert report["sections"]["nccl"][0]["reason"] == "time budget"


@pytest.fixture(scope="module")
def gpu_plan(sample_images, tmp_path_factory):
    """The GPU mode with every command faked as on one H100: (exit status, stdout, the report,
    the commands run, the output folder)."""
    root = tmp_path_factory.mktemp("gpu-plan")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gpu_runner.Runner, "calls", [], raising=False)
        patch.setattr(gpu_runner.Runner, "run", fake_gpu_run)
        patch.setattr(machine.shutil, "which", lambda name: None)  # no nvidia-smi
        # a short epoch: each symlink costs ~0.5 ms on this disk, and the commands are faked
        patch.setattr(data, "data_batches", lambda s, m: 8)
        bundle = make_bundle(sample_images, root / "bundle", classes=2)
        code, out, _ = gpu_check_cli(["--bundle", str(bundle), "--out", str(root / "o")])
        calls = gpu_runner.Runner.calls
    report = json.loads((root / "o" / "report.json").read_text())
    return SimpleNamespace(code=code, out=out, report=report, calls=calls, root=root)


def test_gpu_plan_decoders_named_and_swept(gpu_plan):
    """Both GPU decoders' sections: the probes, the hardware decoder's share and -j swept,
    the decoder named on every batch-decode row, DALI's proof rows and memory."""
    report = gpu_plan.report
    gpudecode = {r["name"]: r for r in report["sections"]["gpudecode"]}
    assert gpu_plan.code == 0 and report["summary"] == {
        "passed": 59, "failed": 0, "timed_out": 0, "skipped": 0, "not_proven": 0}
    assert gpudecode["gpu-decode-probe"]["on_device"] == 2
    assert gpudecode["gpu-decode-hardware"]["window"] is True
    # the hardware decoder takes windows: every batch-decode row names it
    assert {r.get("decoder") for r in report["sections"]["gpudecode"] if r.get("loader") ==
            "gpudecode-lmdb"} == {"nvImageCodec hardware"}
    assert gpudecode["loader-gpudecode-cuda-j1"]["gpu_over_cpu"] == 5.12
    assert [gpudecode[f"loader-gpudecode-hw{x}"]["hw_decoder_load"] for x in (0.0, 0.65, 1.0)
            ] == [0.0, 0.65, 1.0]
    assert [gpudecode[f"loader-gpudecode-j{j}"]["workers"] for j in (2, 4, 8, 15)] == [
        2, 4, 8, 15]
    assert "--decode-device" not in gpudecode["loader-lmdb-cpu-j8"]["command"]
    dali = {r["name"]: r for r in report["sections"]["dali"]}
    assert dali["dali-gpu-decode"]["status"] == "passed"
    assert dali["loader-dali-mixed-j1"]["gpu_over_cpu"] == 5.12
    assert [dali[f"loader-dali-hw{x}"]["hw_decoder_load"] for x in (0.65, 0.9, 1.0)] == [
        0.65, 0.9, 1.0]
    assert [dali[f"loader-dali-j{j}"]["workers"] for j in (2, 4, 8, 15)] == [2, 4, 8, 15]
    assert dali["dali-memory"]["device_memory_mib"] == [20000.0] * 3


def test_gpu_plan_commands_compile_and_target(gpu_plan):
    """The flags the brief fixes, steady-state sizes, --compile on the best loader after a 20%
    gain, the target judged."""
    report, out = gpu_plan.report, gpu_plan.out
    assert "GPU path proven: every check ran and passed" in out
    train = [c for c in gpu_plan.calls if "--epochs" in c and "-a" in c]
    # NCCL, ResNet-50 from 5 loaders, DALI's section (ResNet-18 at 160 px from synthetic data
    # and DALI, 3 epochs for memory), the batch decode's (ResNet-50 and -18 at 224 and 160
    # px), 160 px, ResNet-18 from 5 loaders, --compile
    assert [c[c.index("-a") + 1] for c in train] == ["resnet18"] + ["resnet50"] * 5 + [
        "resnet18"] * 3 + ["resnet50"] * 2 + ["resnet18"] * 2 + ["resnet50"] * 3 + [
        "resnet18"] * 5 + ["resnet50", "resnet50", "resnet18", "resnet18"]
    assert all(" ".join(c).endswith("--decode-device cuda") for c in train[9:13])
    assert ["--train-crop-size" in c for c in train[9:13]] == [False, True, False, True]
    # progressive resizing's gain: ResNet-50 at 160 px on synthetic data, the best loader and
    # DALI reading the LMDB
    resolution = [(r["loader"], r["res"], r["speedup"]) for r in report["sections"]["resolution"]]
    assert resolution == [("synthetic", 160, 1.8), ("dali", 160, 1.8), ("dali-lmdb", 160, 1.8)]
    assert all(" ".join(c).endswith("--train-crop-size 160") for c in train[6:8] + train[13:16])
    train = [c for c in train if "--epochs 3" not in " ".join(c)]  # the memory run
    for cmd in train[1:]:  # 16 cores, -j auto: warmed up past 4 x 16 + 2 ready batches
        line = " ".join(cmd)
        warm = 5 + (0 if "--dummy" in cmd else 10 if "--dali" in cmd else 4 * 16 + 2 + (
            3 if "--decode-device" in cmd else 0))
        assert f"--amp --channels-last -b 256 --epochs 1 --train-batches {warm + 200} " in line
        assert f"--benchmark-warmup {warm} -j auto --gpu 0" in line and "--no-accel" not in line
    assert "--dist-backend nccl" in " ".join(train[0]) and "-b 256" in " ".join(train[0])
    compiled = [(r["model"], r["loader"]) for r in report["sections"]["compile"]]
    assert compiled == [("resnet50", "synthetic"), ("resnet50", "dali"),
                        ("resnet18", "synthetic"), ("resnet18", "dali")]
    assert report["sections"]["compile"][0]["speedup"] == 1.2
    assert report["target"]["met"] is True and report["target"]["best_loader"] == "dali"
    folder = gpu_report.find(report["sections"]["training"], "resnet50", "folder")
    assert folder["ratio_to_synthetic"] == 0.7 and folder["device"] == "cuda:0"
    assert "target: resnet50 best loader >= 95% of synthetic: met (best: dali at 98%)" in out
    text = (gpu_plan.root / "o" / "report.md").read_text()
    assert "1x NVIDIA H100 80GB HBM3" in text and "| resnet50 | dali | yes |" in text
    assert "| resnet50 | dali | 160 |" in text
    assert report["sections"]["nccl"][0]["process_group"] is True
    # -j auto takes every core: the folder and LMDB loaders alone again with 15 of 16
    alone = [(r["name"], " ".join(c[c.index("-j"):c.index("-j") + 2]))
             for r in report["sections"]["loaders"] for c in gpu_plan.calls
             if r.get("command") == " ".join(c)]
    assert alone == [("loader-folder", "-j auto"), ("loader-folder-j15", "-j 15"),
                     ("loader-lmdb", "-j auto"), ("loader-lmdb-j15", "-j 15"),
                     ("loader-dali", "-j auto"), ("loader-dali-lmdb", "-j auto")]


@pytest.mark.parametrize("with_pip", [True, False])
def test_missing_modules_are_installed_from_the_wheels(tmp_path, monkeypatch, with_pip):
    """Only wheels of modules this interpreter lacks are installed, with pip or, without it,
    unpacked; every later command sees them through PYTHONPATH."""
    wheels = [fake_wheel(str(tmp_path), "gpucheck_fake"), fake_wheel(str(tmp_path), "json")]
    monkeypatch.setattr(install, "has_pip", lambda: with_pip)
    runner = gpu_runner.Runner(str(tmp_path / "out"), budget=60)
    (record,) = install.install(runner, wheels, str(tmp_path / "site"))
    assert record["status"] == "passed" and record["installed"] == ["gpucheck_fake"]
    assert ("-m pip install" in record["command"]) == with_pip
    result = subprocess.run([sys.executable, "-c", "import gpucheck_fake as m; print(m.VALUE)"],
                            env=runner.env, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "42", result.stderr


def test_looking_for_pip_leaves_setuptools_distutils_shim_on():
    """has_pip() must not import-probe pip: setuptools' _distutils_hack then turns its distutils
    shim off for the whole process, and torch.compile later in the suite failed with
    ``AssertionError: .../distutils/core.py``."""
    probe = ("import sys; from tools.gpu_check.machine import install; "
             "install.has_pip() if sys.argv[1] == '1' else None; "
             "import warnings; warnings.simplefilter('ignore'); import distutils; "
             "print(distutils.__file__)")
    where = [subprocess.run([sys.executable, "-c", probe, flag], cwd=REPO, capture_output=True,
                            text=True, timeout=60).stdout.strip() for flag in ("0", "1")]
    if "setuptools" not in where[0]:
        pytest.skip(f"no setuptools distutils shim in this environment ({where[0] or 'none'})")
    assert where[1] == where[0]


def test_nothing_is_installed_when_nothing_is_missing(tmp_path):
    runner = gpu_runner.Runner(str(tmp_path / "out"), budget=60)
    wheels = [fake_wheel(str(tmp_path), "json")]
    assert install.install(runner, wheels, str(tmp_path / "s")) == []
    assert "PYTHONPATH" not in runner.env or str(tmp_path) not in runner.env["PYTHONPATH"]


def test_a_test_file_skipped_at_collection_is_not_proven_not_failed(tmp_path, monkeypatch):
    """pytest exits 5 when a module skips itself (DALI not installed): a skip, with its reason."""
    out = ("s\n=== short test summary info ===\nSKIPPED [1] tests/loaders/test_gpu_dali.py:7: could "
           "not import 'nvidia.dali': No module named 'nvidia.dali'\n1 skipped in 0.92s\n")

    def run(self, name, cmd, timeout, env=None, code=5):
        with open(self.log(name, "out"), "w") as f:
            f.write(out)
        return {"name": name, "command": " ".join(cmd), "returncode": code,
                "status": "passed" if code == 0 else "failed", "reason": f"exit status {code}"}

    monkeypatch.setattr(gpu_runner.Runner, "run", run)
    runner = gpu_runner.Runner(str(tmp_path / "out"), budget=60)
    row = gpu_rows.pytest_piece(runner, "tests/loaders/test_gpu_dali.py")
    assert row["status"] == "skipped", row
    assert row["reason"] == "could not import 'nvidia.dali': No module named 'nvidia.dali'"
    out = out.replace("1 skipped", "1 failed, 1 skipped")
    monkeypatch.setattr(gpu_runner.Runner, "run", functools.partialmethod(run, code=1))
    assert gpu_rows.pytest_piece(runner, "tests/loaders/test_gpu_dali.py")["status"] == "failed"


def make_n(*args, **env_vars):
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "OUT", "ARGS", "GPU_PYTHON")}
    return subprocess.run(["make", "--no-print-directory", "-n", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env={**env, **env_vars})


@pytest.mark.skipif(shutil.which("make") is None, reason="GNU make not installed")
def test_make_targets_need_no_venv_on_the_gpu_machine():
    check = make_n("gpu-check")
    assert check.returncode == 0, check.stderr
    assert "python3 -m tools.gpu_check --out gpu-check-output" in check.stdout
    assert ".venv" not in check.stdout and "pip install" not in check.stdout
    custom = make_n("gpu-check", "GPU_OUT=/x", "GPU_PYTHON=py", "ARGS=--budget 900")
    assert "py -m tools.gpu_check --out /x --budget 900" in custom.stdout
    # a borrowed machine's $OUT (the folder that comes back) is never the check's scratch
    borrowed = make_n("gpu-check", OUT="/borrowed/out").stdout
    assert "--out gpu-check-output" in borrowed and "/borrowed/out" not in borrowed
    parts = make_n("gpu-check", "PARTS=/tmp/gpu-parts")
    assert "-m tools.gpu_check --out gpu-check-output --parts /tmp/gpu-parts" in parts.stdout
    bundle = make_n("gpu-bundle").stdout
    assert "-m tools.gpu_check.machine.bundle --out .gpu-bundle" in bundle and "../shared" not in bundle
    assert "--data" not in bundle and "--no-dali" not in bundle
    custom = make_n("gpu-bundle", "DATA=/imgs", "CUDA=12", "DALI=0").stdout
    assert "--data /imgs" in custom and "--cuda 12" in custom and "--no-dali" in custom


def test_out_inside_the_borrowed_machines_out_is_refused(tmp_path, monkeypatch):
    """$OUT comes back from a borrowed machine (8 files at most): a scratch folder there is
    bad input, one line, exit status 2."""
    monkeypatch.setenv("OUT", str(tmp_path))
    code, _, err = gpu_check_cli(["--dry-run", "--out", str(tmp_path / "gc")])
    assert code == 2 and err.count("\n") == 1
    assert "is inside $OUT" in err and "--archive" in err
