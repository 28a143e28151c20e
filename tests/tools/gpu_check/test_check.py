"""The check (``python -m tools.gpu_check``, ``make gpu-check``): every row in priority order on
a host faked as one H100 (the decoders named, the sweeps, steady-state sizes, --compile on the
best loader, the target), the same code under a time budget, its CPU dry run end to end, its
one-line input errors, the install of the bundle's wheels and the Makefile targets."""
from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tarfile
from types import SimpleNamespace

import pytest

from tests.helpers import warm
from tests.helpers.gpu_fakes import fake_host as fake
from tests.helpers.gpu_fakes import fake_wheel, gpu_check_cli, make_bundle
from tests.helpers.paths import REPO
from tools.gpu_check import plan
from tools.gpu_check import report as judge
from tools.gpu_check.check import duration, main_cli
from tools.gpu_check import runner as gpu_runner
from tools.gpu_check.bundle import steps as install
from tools.gpu_check.rows import measure


@pytest.fixture
def fake_host(monkeypatch):
    fake(monkeypatch)


def run_check(sample_images, root, *argv):
    bundle = root / "bundle"
    if not bundle.exists():
        make_bundle(sample_images, bundle, classes=2)
    code, out, err = gpu_check_cli(["--bundle", str(bundle), "--out", str(root / "o"), *argv])
    report = json.loads((root / "o" / "report.json").read_text())
    return SimpleNamespace(code=code, out=out, err=err, report=report, root=root,
                           rows={r["name"]: r for r in report["rows"]},
                           calls=gpu_runner.Runner.calls)


@pytest.fixture(scope="module")
def every_row(sample_images, tmp_path_factory):
    """Every row on a host faked as one H100."""
    with pytest.MonkeyPatch.context() as patch:
        fake(patch)
        return run_check(sample_images, tmp_path_factory.mktemp("every-row"))


def test_every_row_runs_in_priority_order_and_passes(every_row):
    report, rows = every_row.report, every_row.rows
    assert every_row.code == 0 and "GPU path proven: every check ran and passed" in every_row.out
    assert report["summary"]["failed"] == report["summary"]["not_proven"] == 0
    # the set-up, then the list's order: its groups never go back
    order = [plan_row.name for plan_row in plan.all_rows()]
    ran = [n for n in rows if n in order]
    assert ran == [n for n in order if n in rows]
    groups = [rows[n]["group"] for n in ran]
    assert groups == sorted(groups) and set(groups) == set(range(1, 8))
    assert list(rows)[:3] == ["install", "environment", "data"]
    # --compile gained 20% on synthetic data: it runs on each model's best loader too
    assert rows["train-resnet50-best-compile"]["loader"] == "gpudecode-lmdb"
    assert rows["train-resnet50-synthetic-compile"]["speedup"] == 1.2
    # the best loader's 160 px row is group 3's: no second one
    assert "train-resnet50-best-160px" not in rows
    assert rows["train-resnet50-synthetic-160px"]["speedup"] == 1.8
    with tarfile.open(every_row.root / "o" / "gpu-check.tar.gz") as tar:
        names = tar.getnames()
    assert {"gpu-check/report.md", "gpu-check/report.json", "gpu-check/rows.jsonl",
            "gpu-check/logs/train-resnet50-synthetic.out"} <= set(names)


def test_the_decoders_are_named_and_both_swept(every_row):
    rows = every_row.rows
    assert rows["gpu-decode-probe"]["on_device"] == 2
    assert rows["gpu-decode-hardware"]["window"] is True
    # the hardware decoder takes windows: every batch-decode row names it
    assert {r.get("decoder") for r in rows.values() if r.get("loader") == "gpudecode-lmdb"} == {
        "nvImageCodec hardware"}
    assert rows["loader-gpudecode-cuda-j1"]["gpu_over_cpu"] == 5.12
    assert [rows[f"loader-gpudecode-hw{x}"]["workers"] for x in (0.0, 0.65, 0.9, 1.0)] == [4] * 4
    assert [rows[f"loader-gpudecode-j{j}"]["workers"] for j in (2, 4, 8, 15)] == [2, 4, 8, 15]
    assert "--decode-device" not in rows["loader-lmdb-cpu-j8"]["command"]
    assert rows["dali-gpu-decode"]["status"] == "passed"
    assert rows["loader-dali-mixed-j1"]["gpu_over_cpu"] == 5.12
    assert rows["loader-dali-mixed-j1"]["decoder"] == "DALI mixed"
    assert [rows[f"loader-dali-j{j}"]["workers"] for j in (2, 4, 8, 15)] == [2, 4, 8, 15]
    assert "--dali-hw-decoder-load 0.9" in rows["loader-dali-hw0.9"]["command"]
    assert rows["dali-memory"]["device_memory_mib"] == [20000.0] * 3
    assert rows["distributed"]["process_group"] is True


def test_steady_state_sizes_flags_shares_and_targets(every_row):
    """The flags the project fixes, the warm-up past every ready batch, the shares judged and
    the targets in the report."""
    report = every_row.report
    for row in every_row.rows.values():
        if row.get("model") and row.get("command") and "--multiprocessing" not in row["command"]:
            cmd = row["command"]
            jobs = int(row["jobs"]) if row["jobs"].isdigit() else 16
            warm = 5 + (0 if "--dummy" in cmd else 10 if "--dali" in cmd else 4 * jobs + 2 + (
                3 if "--decode-device" in cmd else 0))
            assert f"--train-batches {warm + 200} " in cmd and "--amp --channels-last" in cmd
            assert f"--benchmark-warmup {warm} -j {row['jobs']} --gpu 0" in cmd
    share = report["shares"]["train-resnet50-lmdb-jall"]
    assert share == {**share, "raw": 0.96, "alone": 5.12, "judged": 0.96}
    assert report["target"]["met"] is True
    assert report["target"]["best_loader"].startswith("gpudecode-lmdb")
    assert report["loaders"]["loader-gpudecode-j4"] == {"images_per_sec": 5120.0,
                                                        "target": 10000.0}
    text = (every_row.root / "o" / "report.md").read_text()
    assert "- Host: 1x NVIDIA H100 80GB HBM3 (79.2 GiB); driver -" in text
    assert "## Figures against the targets" in text and "| loader-dali-lmdb | 5,120.0 | >= 15,000 |" in text
    assert "| train-resnet50-gpudecode-lmdb | 98% | 512% | 98% |" in text


def test_a_time_budget_runs_what_fits_in_order_and_names_the_rest(sample_images, tmp_path,
                                                                  fake_host):
    """The same runner with --budget 1m: rows expected to take longer than the time left are
    left out (the GPU tests, --compile), named in the report, and the run is not proven."""
    result = run_check(sample_images, tmp_path, "--budget", "1m")
    left = result.report["left_out"]
    assert result.code == 3 and set(left) == {r.name for r in plan.all_rows()
                                              if r.expect > 60 - 5} | {"install-dali"}
    # DALI's install and its first row (60 + 10 s) did not fit: the host's own DALI serves
    assert all(result.rows[n]["reason"].startswith("time budget: ") for n in left)
    assert "pytest-test_gpu" in left and "train-resnet50-synthetic-compile" in left
    assert result.rows["train-resnet50-lmdb-jall"]["status"] == "passed"
    assert "left out by the time budget: " in result.out
    assert "## Left out by the time budget" in (tmp_path / "o" / "report.md").read_text()


@pytest.mark.parametrize("argv,message", [
    (["--bundle", "NOPE"], "--bundle NOPE: no such directory"),
    (["--data", "NOPE"], "--data NOPE: no such directory"),
    (["--step", "3"], "--step 3: no "),
    (["--rows", "nothing"], "--rows nothing: no row matches"),
])
def test_bad_input_is_one_line(sample_images, tmp_path, argv, message):
    make_bundle(sample_images, tmp_path / "b", classes=1)
    argv = [a.replace("NOPE", str(tmp_path / "nope")) for a in argv]
    code, out, err = gpu_check_cli(["--bundle", str(tmp_path / "b"), *argv, "--out",
                                    str(tmp_path / "o")])
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("gpu_check: error: ") and message.replace(
        "NOPE", str(tmp_path / "nope")) in err


def test_a_bad_budget_and_a_bundle_without_sample_are_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main_cli(["--budget", "soon"])
    assert "expected a duration such as 15m" in capsys.readouterr().err
    (tmp_path / "b" / "wheels").mkdir(parents=True)
    code, _, err = gpu_check_cli(["--bundle", str(tmp_path / "b"), "--out", str(tmp_path / "o")])
    assert code == 2 and err.count("\n") == 1 and "make gpu-bundle" in err
    assert [duration(x) for x in ("15m", "900", "1h30m", "90s", "2h")] == [
        900, 900, 5400, 90, 7200]


@pytest.mark.heavy
def test_dry_run_of_a_short_row_set_on_the_cpu(sample_images, tmp_path, monkeypatch):
    """The rows that prove each loader's code path, on the CPU: they pass, the report and its
    archive are written, the replicated data removed."""
    bundle = make_bundle(sample_images, tmp_path / "bundle", classes=4)
    monkeypatch.setattr(gpu_runner, "subprocess", warm)  # its main.py processes start warm
    code, out, err = gpu_check_cli([
        "--dry-run", "--bundle", str(bundle), "--out", str(tmp_path / "o"), "--rows",
        "gpu-decode-probe", "train-resnet50-synthetic", "loader-gpudecode-j4",
        "train-resnet50-gpudecode-lmdb", "loader-lmdb-jall", "train-resnet50-lmdb-jall",
        "dali-gpu-decode", "loader-dali-lmdb", "pytest-test_gpu", "distributed"])
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    failed = [r for r in report["rows"] if r["status"] == "failed"]
    assert code == 0 and not failed, (failed, err)
    assert "dry run on the CPU: checks this script, proves nothing about a GPU" in out
    rows = {r["name"]: r for r in report["rows"]}
    assert rows["train-resnet50-synthetic"]["arch"] == "resnet18"  # standing in, on the CPU
    assert rows["loader-gpudecode-j4"]["decoder"] == "nvImageCodec CPU"
    assert rows["train-resnet50-gpudecode-lmdb"]["base"] == "train-resnet50-synthetic"
    assert rows["distributed"]["backend"] == "gloo"
    assert all(x["judged"] is None or x["judged"] <= 1 for x in report["shares"].values())
    assert not (tmp_path / "o" / "data").exists()
    with tarfile.open(tmp_path / "o" / "gpu-check.tar.gz") as tar:
        assert "gpu-check/logs/train-resnet50-synthetic.out" in tar.getnames()


def test_missing_distributions_are_installed_from_the_wheels(tmp_path):
    """pip installs only the distributions this interpreter lacks (packaging is here, in
    another version than the bundle's 1.0: left alone); every later command sees them through
    PYTHONPATH."""
    wheels = [fake_wheel(str(tmp_path), "gpucheck_fake"), fake_wheel(str(tmp_path), "packaging")]
    runner = gpu_runner.Runner(str(tmp_path / "out"), budget=60)
    (record,), _ = install.install(runner, wheels, str(tmp_path / "site"))
    assert record["status"] == "passed" and record["installed"] == ["gpucheck_fake"]
    assert "-m pip install --no-index --no-deps" in record["command"]
    code = "import gpucheck_fake as m, packaging; print(m.VALUE, packaging.__version__)"
    result = subprocess.run([sys.executable, "-c", code], env=runner.env, capture_output=True,
                            text=True, timeout=60)
    import packaging

    assert result.stdout.split() == ["42", packaging.__version__], result.stderr


def test_without_pip_the_install_fails_in_one_line(tmp_path, monkeypatch):
    """A Python without pip (a venv made --without-pip): a failed row saying to install it."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")],
                   check=True, timeout=120)
    monkeypatch.setattr(install.sys, "executable", str(tmp_path / "v" / "bin" / "python"))
    runner = gpu_runner.Runner(str(tmp_path / "out"), budget=60)
    (record,), _ = install.install(runner, [fake_wheel(str(tmp_path), "gpucheck_fake")],
                                str(tmp_path / "site"))
    assert record["status"] == "failed" and "python3 -m ensurepip" in record["reason"]


def test_the_environment_probe_prints_the_hosts_facts():
    """``--probe`` (the environment row's command, faked in the other tests) runs for real."""
    result = subprocess.run([sys.executable, "-m", "tools.gpu_check", "--probe"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    facts = json.loads(result.stdout)
    assert result.returncode == 0 and facts["cpu_cores"] >= 1 and "gpu_count" in facts


def test_the_hosts_torch_and_nvidia_packages_are_never_replaced(tmp_path):
    """Wheels of distributions the host has (torch, nvidia-nvjpeg, here in other versions than
    the bundle's 1.0) are left alone: nothing installed, nothing put before the host's own."""
    runner = gpu_runner.Runner(str(tmp_path / "out"), budget=60)
    wheels = [fake_wheel(str(tmp_path), name) for name in ("torch", "nvidia_nvjpeg")]
    (record,), _ = install.install(runner, wheels, str(tmp_path / "s"))
    assert record["status"] == "passed" and record["installed"] == []
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
    ctx = SimpleNamespace(runner=gpu_runner.Runner(str(tmp_path / "out"), budget=60),
                          s=SimpleNamespace(train_src=str(tmp_path / "sample" / "train")))
    piece = plan.Row("pytest-test_gpu_dali", 6, "plain", None, None,
                     extra=("tests/loaders/test_gpu_dali.py",))
    row = measure.pytest_piece(ctx, piece, 600)
    assert row["status"] == "skipped", row
    assert row["reason"] == "could not import 'nvidia.dali': No module named 'nvidia.dali'"
    assert judge.not_proven([row]) == [{"name": row["name"], "reason": judge.status_of(row)}]
    out = out.replace("1 skipped", "1 failed, 1 skipped")
    monkeypatch.setattr(gpu_runner.Runner, "run", functools.partialmethod(run, code=1))
    assert measure.pytest_piece(ctx, piece, 600)["status"] == "failed"


def make_n(*args, **env_vars):
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "OUT", "ARGS", "GPU_PYTHON",
                        "BUDGET", "STEP", "STEP_SIZE", "HOST_PYTHON")}
    return subprocess.run(["make", "--no-print-directory", "-n", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env={**env, **env_vars})


@pytest.mark.skipif(shutil.which("make") is None, reason="GNU make not installed")
def test_make_targets_need_no_venv_on_the_gpu_host():
    check = make_n("gpu-check")
    assert check.returncode == 0, check.stderr
    assert "python3 -m tools.gpu_check --out gpu-check-output" in check.stdout
    assert ".venv" not in check.stdout and "pip install" not in check.stdout
    custom = make_n("gpu-check", "GPU_OUT=/x", "GPU_PYTHON=py", "BUDGET=15m", "STEP=2")
    assert "py -m tools.gpu_check --out /x --budget 15m --step 2" in custom.stdout
    bundle = make_n("gpu-bundle").stdout
    assert "-m tools.gpu_check.bundle.build --out .gpu-bundle --python-version 3.12" in bundle
    assert "--data" not in bundle and "--no-dali" not in bundle and "--step-size" not in bundle
    custom = make_n("gpu-bundle", "DATA=/imgs", "CUDA=12", "DALI=0", "STEP_SIZE=64M",
                    "HOST_PYTHON=3.10").stdout
    assert "--python-version 3.10" in custom
    assert "--data /imgs" in custom and "--cuda 12" in custom and "--no-dali" in custom
    assert "--step-size 64M" in custom
    assert "-m tools.gpu_check.bundle.dry_run" in make_n("gpu-dry-run").stdout
