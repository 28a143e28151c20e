"""The check never reports an unproven GPU path as passed, and always writes its report:
one GPU per single-process run on a many-GPU machine, skipped / timed-out checks as not proven
(exit status 3), a timeout as "timed out", its own crash as a failed row, and a machine with
no ``nvidia`` package at all (conda or source-built torch)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from types import SimpleNamespace

import pytest

from tests.helpers.paths import REPO
from tests.helpers.gpu_fakes import (MACHINE, fake_gpu_run, fake_wheel, gpu_check_cli,
                                     make_bundle)
from tools.gpu_check import check as full
from tools.gpu_check import report as gpu_report
from tools.gpu_check import plan
from tools.gpu_check import runner as gpu_runner
from tools.gpu_check.bundle import steps as install
from tools.gpu_check.rows import measure, probes


# A sitecustomize that makes every ``nvidia`` import fail as where no such package exists.
HIDE_NVIDIA = textwrap.dedent("""\
    import sys

    class _NoNvidia:
        def find_spec(self, name, path=None, target=None):
            if name == "nvidia" or name.startswith("nvidia."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _NoNvidia())
    """)


@pytest.fixture
def fake_machine(monkeypatch):
    """Every command faked (:func:`tests.helpers.gpu_fakes.fake_gpu_run`); returns a function
    that sets the machine's facts and pytest's output."""
    monkeypatch.setattr(gpu_runner.Runner, "calls", [], raising=False)
    monkeypatch.setattr(gpu_runner.Runner, "run", fake_gpu_run)
    monkeypatch.setattr(measure.shutil, "which", lambda name: None)  # no nvidia-smi
    monkeypatch.setattr(measure, "data_batches", lambda s, m: 8)  # the commands are faked

    def configure(pytest_out=None, **facts):
        monkeypatch.setattr(gpu_runner.Runner, "machine", {**MACHINE, **facts}, raising=False)
        if pytest_out:
            monkeypatch.setattr(gpu_runner.Runner, "pytest_out", pytest_out, raising=False)

    return configure


def gpu_run(sample_images, tmp_path, *extra):
    bundle = make_bundle(sample_images, tmp_path / "bundle", classes=2)
    code, out, err = gpu_check_cli(["--bundle", str(bundle), "--out", str(tmp_path / "o"),
                                    *extra])
    return code, out, json.loads((tmp_path / "o" / "report.json").read_text())


def test_single_process_runs_pin_one_gpu_on_an_eight_gpu_machine(sample_images, tmp_path, fake_machine):
    """Without --gpu, main.py would wrap the model in DataParallel over the 8 GPUs: every
    single-process main.py command names GPU 0; the distributed run uses all 8."""
    fake_machine(gpu_count=8, gpus=[MACHINE["gpus"][0]] * 8)
    code, _, report = gpu_run(sample_images, tmp_path)
    assert code == 0, report["not_proven"]
    runs = [c for c in gpu_runner.Runner.calls if "main.py" in c]
    single = [c for c in runs if "--multiprocessing-distributed" not in c]
    # every training and loader-alone row (--compile on each model's best loader after its 20%
    # gain on synthetic data) but ResNet-50 at 160 px from its best loader, which has its
    # own; DALI's memory run
    assert len(single) == len([r for r in plan.all_rows() if r.kind != "plain"]) - 1 + 1
    for cmd in single:
        assert cmd.count("--gpu") == 1 and cmd[cmd.index("--gpu") + 1] == "0", cmd
    (distributed,) = [c for c in runs if "--multiprocessing-distributed" in c]
    assert "--gpu" not in distributed and distributed[distributed.index("-b") + 1] == "2048"
    assert next(r for r in report["rows"] if r["name"] == "distributed")["world_size"] == 8


@pytest.mark.parametrize("facts,pytest_out,unproven", [
    ({"dali": None}, None, {r.name for r in plan.all_rows() if r.dali}),
    ({}, "...\n3 passed, 2 skipped, 259 deselected in 5.01s\n",
     {"pytest-test_gpu", "pytest-test_gpu_dali", "pytest-test_gpu_decode_cuda",
      "pytest-test_erasing_feed"}),
])
def test_a_skipped_gpu_check_is_not_proven_and_exits_3(sample_images, tmp_path, fake_machine, facts,
                                                       pytest_out, unproven):
    fake_machine(pytest_out, **facts)
    code, out, report = gpu_run(sample_images, tmp_path)
    assert code == 3 and report["summary"]["failed"] == 0
    assert {x["name"] for x in report["not_proven"]} == unproven
    assert "GPU path NOT proven: " in out and "GPU path proven" not in out
    md = (tmp_path / "o" / "report.md").read_text()
    assert "## Not proven on a GPU" in md and "- GPU path NOT proven" in md


def test_a_slow_check_is_timed_out_not_failed(tmp_path):
    runner = gpu_runner.Runner(str(tmp_path), budget=600)
    record = runner.run("slow", [sys.executable, "-c", "import time; time.sleep(60)"], timeout=1)
    assert record["status"] == "timed out" and record["returncode"] is None
    assert record["reason"].startswith("still running after its 1 s limit (slow, not failed")
    s = SimpleNamespace(step_info=None, dry_run=False, budget=600, batch=256, warmup=5,
                        steps=200, workers="auto", rows=None, sizes=[], accel=[], later=[])
    report = gpu_report.build(s, [record])
    assert report["summary"]["timed_out"] == 1 and report["summary"]["failed"] == 0
    assert gpu_report.exit_status(report) == 3


def test_a_crash_of_the_script_still_writes_the_report(sample_images, tmp_path, fake_machine,
                                                       monkeypatch):
    fake_machine()

    def broken(*args):
        raise KeyError("lmdb")

    monkeypatch.setattr(full, "prepare_data", broken)
    code, out, report = gpu_run(sample_images, tmp_path)
    assert code == 1
    rows = {r["name"]: r for r in report["rows"]}
    assert rows["data"]["status"] == "failed" and rows["data"]["reason"] == "KeyError: 'lmdb'"
    assert "Traceback" in rows["data"]["stderr_tail"]
    assert rows["environment"]["status"] == "passed"  # what ran is kept
    assert "### data: KeyError" in (tmp_path / "o" / "report.md").read_text()
    assert (tmp_path / "o" / "gpu-check.tar.gz").is_file()


def hidden_nvidia_env(tmp_path) -> dict:
    hider = tmp_path / "hide-nvidia"
    hider.mkdir()
    (hider / "sitecustomize.py").write_text(HIDE_NVIDIA)
    return {**os.environ, "PYTHONPATH": str(hider)}


@pytest.mark.heavy
def test_dry_run_without_any_nvidia_package_writes_both_reports(sample_images, tmp_path):
    bundle = make_bundle(sample_images, tmp_path / "bundle", classes=2)
    fake_wheel(str(bundle / "wheels"), "nvidia_nvimgcodec_cu13")
    out = tmp_path / "o"
    result = subprocess.run(
        [sys.executable, "-m", "tools.gpu_check", "--dry-run", "--bundle", str(bundle),
         "--out", str(out), "--rows", "train-resnet50-synthetic", "train-resnet50-folder",
         "train-resnet50-lmdb-jall", "train-resnet50-dali"], cwd=REPO, capture_output=True,
        text=True, timeout=900, env=hidden_nvidia_env(tmp_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert (out / "report.md").read_text().startswith("# GPU check (dry run on the CPU")
    assert report["machine"]["dali"] is None  # hidden, as on such a host
    rows = {r["name"][len("train-resnet50-"):]: r for r in report["rows"]
            if r["name"].startswith("train-")}
    assert rows["dali"]["status"] == "skipped" and rows["dali"]["reason"] == "not installed"
    assert all(rows[k]["status"] == "passed" for k in ("synthetic", "folder", "lmdb-jall"))


def dali_wheel(folder, cuda: str) -> str:
    path = os.path.join(folder, f"nvidia_dali_cuda{cuda}0-2.4.0-py3-none-manylinux_2_28_x86_64.whl")
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("nvidia/dali/__init__.py", "")
        zf.writestr("wds2idx.py", "")
    return path


def test_a_dali_wheel_for_another_cuda_major_is_left_out(tmp_path, monkeypatch):
    """The bundle's DALI must match torch's CUDA major: else it is not installed, and its
    record (skipped) makes the run not proven."""
    monkeypatch.setattr(install, "torch_cuda", lambda: "12.8")
    runner = gpu_runner.Runner(str(tmp_path / "out"), budget=60)
    wheel = dali_wheel(str(tmp_path), "13")
    (record,), _ = install.install(runner, [wheel], str(tmp_path / "site"))
    assert record["name"] == "dali-wheel" and record["status"] == "skipped"
    assert "is for CUDA 13, torch here for CUDA 12.8 (make gpu-bundle CUDA=12)" in record["reason"]
    assert install.dali_wheel_mismatch(dali_wheel(str(tmp_path), "12"), "12.8") is None


def _driver_api_in_a_process(library_path) -> str:
    """``cuda_driver_api()`` printed by a new process whose ``import torch`` fails and whose
    dynamic loader looks in ``library_path`` first."""
    code = (f"import sys; sys.modules['torch'] = None; from {probes.__name__} import "
            "cuda_driver_api; print(cuda_driver_api())")
    env = {**os.environ, "LD_LIBRARY_PATH": str(library_path)}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (as make install)")
def test_driver_api_version_needs_no_torch_internals(tmp_path):
    """torch 2.14 has no torch._C._cuda_getDriverVersion: the version comes from libcuda's
    cuDriverGetVersion, here a stand-in libcuda.so.1 built with that one function, in a process
    that cannot import torch. 13000 is "13.0", 12080 "12.8"; an error status or 0 is None."""
    cases = ((13000, 0, "13.0"), (12080, 0, "12.8"), (13000, 100, "None"), (0, 0, "None"))
    for version, status, expected in cases:
        folder = tmp_path / f"{version}-{status}"
        folder.mkdir()
        (folder / "cuda.c").write_text(
            f"int cuDriverGetVersion(int *v) {{ *v = {version}; return {status}; }}\n")
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(folder / "libcuda.so.1"),
                        str(folder / "cuda.c")], check=True, timeout=60)
        assert _driver_api_in_a_process(folder) == expected, (version, status)


def test_dali_section_fails_what_a_gpu_decode_must_prove(sample_images, tmp_path, fake_machine,
                                                         monkeypatch):
    """A machine where nvJPEG does not decode on the GPU, and whose device memory grows epoch
    after epoch under DALI: both rows fail with the reason, and the check exits 1."""
    fake_machine()
    monkeypatch.setattr(gpu_runner.Runner, "dali_on_cpu", True, raising=False)
    monkeypatch.setattr(gpu_runner.Runner, "memory_growth_mib", 4000.0, raising=False)
    code, _, report = gpu_run(sample_images, tmp_path, "--rows", "dali-*", "loader-dali-*")
    rows = {r["name"]: r for r in report["rows"]}
    assert code == 1
    assert rows["dali-gpu-decode"]["status"] == "failed"
    assert rows["dali-gpu-decode"]["reason"] == (
        "DALI's mixed decode gave TensorListGPU, nvImageCodec's GPU backends did not into device "
        "memory, libnvjpeg mapped: none")
    assert rows["dali-memory"]["status"] == "failed"
    assert "device memory grew from 20000 to 28000 MiB" in rows["dali-memory"]["reason"]
    assert rows["loader-dali-mixed-j1"]["status"] == "passed"  # 5.12x the CPU decode


def test_gpu_tests_find_the_bundles_sample_and_batch_rows_fail_on_cpu_fallbacks(
        sample_images, tmp_path, fake_machine, monkeypatch):
    """The GPU-vs-CPU pixel tests read the sample through IMAGENET_SAMPLE (``../shared`` does
    not travel): every pytest row gets the bundle's; and a ``--decode-device cuda`` row whose
    run sent samples to the CPU fallback fails, naming how many."""
    fake_machine()
    monkeypatch.setattr(gpu_runner.Runner, "cpu_fallbacks", 3, raising=False)
    code, _, report = gpu_run(sample_images, tmp_path, "--rows", "pytest-*", "*gpudecode*")
    assert code == 1
    rows = {r["name"]: r for r in report["rows"]}
    for name in [n for n in rows if n.startswith("pytest-")]:
        assert rows[name]["env"] == {"IMAGENET_SAMPLE": str(tmp_path / "bundle" / "sample")}
    for name in ("loader-gpudecode-cuda-j1", "train-resnet50-gpudecode-lmdb-160px"):
        assert rows[name]["status"] == "failed" and rows[name]["cpu_fallbacks"] == 3
        assert rows[name]["reason"].startswith("3 samples decoded on the CPU fallback")
    assert rows["loader-gpudecode-cpu-j1"]["status"] == "passed"  # the workers' decode
