"""An offline bundle in steps (``make gpu-bundle STEP_SIZE=64M``, ``--step N``): each step within
its size with the repository's files, step 1 standing alone without any DALI file, the steps
run one after another on a host faked as one H100 with the state kept in ``--out``, a step
that finds the earlier state gone saying so, and the dry run of the steps here (heavy)."""
from __future__ import annotations

import json
import os
import tarfile

import pytest

from tests.helpers.gpu_fakes import fake_host as fake
from tests.helpers.gpu_fakes import fake_wheel, gpu_check_cli, make_bundle
from tools.gpu_check import plan
from tools.gpu_check.bundle import dry_run, steps
from tools.gpu_check.bundle.steps import join_parts, link_tree, packages_folder
from tools.gpu_check.runner import REPO


@pytest.fixture(scope="module")
def small_bundle(sample_images, tmp_path_factory):
    """A bundle of 4 real images' classes, a small wheel, and a 3 MiB 'DALI' wheel with a small
    dependency, in steps of (the repository + 2 MiB margin + the sample + 2 MiB)."""
    root = tmp_path_factory.mktemp("steps") / "bundle"
    make_bundle(sample_images, root, classes=4)
    fake_wheel(str(root / "wheels"), "stepfake")
    (root / "wheels-dali").mkdir()
    fake_wheel(str(root / "wheels-dali"), "stepdalidep")
    fake_wheel(str(root / "wheels-dali"), "nvidia_dali_cuda130", blob=3 << 20)
    repo = steps.repository_bytes(REPO)
    limit = repo + (2 << 20) + steps.folder_bytes(str(root / "sample")) + (2 << 20)
    return root, steps.lay_out_steps(str(root), repo, limit), limit


def test_each_step_fits_and_step_1_holds_nothing_of_dali(small_bundle, tmp_path):
    root, laid, limit = small_bundle
    assert [s["step"] for s in laid] == [1, 2, 3] and all(s["bytes"] <= limit for s in laid)
    assert sorted(laid[0]["files"]) == ["sample", "wheels/stepfake-1.0-py3-none-any.whl"]
    assert laid[1]["files"][0] == "parts/SHA256SUMS"
    assert "wheels-dali/stepdalidep-1.0-py3-none-any.whl" in laid[1]["files"]
    assert [f[-6:] for s in laid[1:] for f in s["files"] if ".part" in f] == ["part00", "part01"]
    for s in laid:
        info = json.loads((root / "steps" / str(s["step"]) / "STEP.json").read_text())
        assert info["step"] == s["step"] and info["steps"] == 3 and info["size"] == limit
        assert info["bytes"] == [x["bytes"] for x in laid]
    _, (record,) = join_parts(str(root / "steps" / "2" / "parts"), str(tmp_path))
    assert "part01: missing" in record["reason"]  # in step 3, not step 2


def test_the_parts_of_every_step_make_the_wheel(small_bundle, tmp_path):
    root, _, _ = small_bundle
    stash = tmp_path / "stash"
    for number in (1, 2, 3):
        link_tree(str(root / "steps" / str(number)), str(stash))
    (joined,), _ = join_parts(str(stash / "parts"), str(tmp_path / "joined"))
    assert open(joined, "rb").read() == (root / "wheels-dali" / os.path.basename(
        joined)).read_bytes()
    info = json.loads((stash / "STEP.json").read_text())
    assert steps.missing_files(str(stash), info, 3) == []
    assert os.readlink(stash / "sample" / "val") == "train"  # a link to a folder stays one
    assert steps.missing_files(str(tmp_path), info, 1) == [
        "wheels/stepfake-1.0-py3-none-any.whl (step 1)", "sample (step 1)"]


@pytest.fixture(scope="module")
def stepped(small_bundle, tmp_path_factory):
    """The three steps run one after another with one --out on a host faked as one H100."""
    root, _, _ = small_bundle
    out = tmp_path_factory.mktemp("host") / "o"
    results = []
    with pytest.MonkeyPatch.context() as patch:
        fake(patch)
        for number in (1, 2, 3):
            code, stdout, _ = gpu_check_cli(["--bundle", str(root), "--out", str(out),
                                             "--step", str(number)])
            results.append((code, stdout, json.loads((out / "report.json").read_text())))
    return out, results


def test_step_1_runs_rows_1_to_4_and_its_own_archive(stepped):
    out, results = stepped
    code, stdout, report = results[0]
    rows = {r["name"]: r for r in report["rows"]}
    first = [r.name for r in plan.all_rows() if r.group <= 4]
    assert code == 0 and [n for n in rows if n in first] == first
    assert all(rows[n]["step"] == 1 and rows[n]["status"] == "passed" for n in first)
    assert not any(r["group"] > 4 for r in report["rows"])
    assert "dali-gpu-decode" in report["not_run"]
    assert "next: step 2 (python -m tools.gpu_check --step 2, the same --out)" in stdout
    assert "NOT proven yet" in stdout
    with tarfile.open(out / "gpu-check-step1.tar.gz") as tar:
        first_report = json.load(tar.extractfile("gpu-check/report.json"))
    assert first_report["step"]["step"] == 1


def test_the_last_step_joins_dali_and_runs_the_rest(stepped):
    out, results = stepped
    assert [code for code, *_ in results] == [0, 0, 0]
    report = results[2][2]
    rows = {r["name"]: r for r in report["rows"]}
    assert [r["step"] for r in report["rows"] if r["name"] == "install"] == [1]
    parts = rows["install-dali"]["parts"][0]
    assert parts["name"] == "parts" and parts["joined"] == [
        "nvidia_dali_cuda130-1.0-py3-none-any.whl"]
    assert rows["dali-gpu-decode"]["step"] == 3 and rows["distributed"]["step"] == 3
    assert report["not_run"] == [] and report["summary"]["failed"] == 0
    assert sorted(p for p in os.listdir(out) if p.endswith(".tar.gz")) == [
        f"gpu-check-step{n}.tar.gz" for n in (1, 2, 3)]


def test_a_step_that_finds_the_earlier_state_gone_says_so(small_bundle, tmp_path, monkeypatch):
    root, _, _ = small_bundle
    fake(monkeypatch)
    code, out, _ = gpu_check_cli(["--bundle", str(root), "--out", str(tmp_path / "o"),
                                  "--step", "3"])
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    rows = {r["name"]: r for r in report["rows"]}
    assert code == 1 and rows["state-lost-step3"]["status"] == "failed"
    assert rows["state-lost-step3"]["reason"].startswith(
        f"step 3 found no state of steps 1, 2 in {tmp_path / 'o'}")
    assert rows["environment"]["status"] == "passed"  # what still runs
    assert "dali-gpu-decode" not in rows
    assert (tmp_path / "o" / "gpu-check-step3.tar.gz").is_file()


def test_a_dry_run_without_git_is_one_line(tmp_path, monkeypatch):
    """A step's bytes count the repository's files from git's list: without git, one line."""
    os.makedirs(tmp_path / "bundle")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code = dry_run.main_cli(["--bundle", str(tmp_path / "bundle"), "--host",
                             str(tmp_path / "host")])
    assert code == 2


@pytest.mark.heavy
def test_the_dry_run_of_the_steps_holds(small_bundle, tmp_path, capsys):
    """The three steps here on the CPU, as on a host: sizes, step 1's rows, one archive per
    step, the install by pip into the state's prefix, judged shares."""
    root, _, _ = small_bundle
    code = dry_run.main_cli(["--bundle", str(root), "--host", str(tmp_path / "h"),
                             "--rows", "gpu-decode-probe", "loader-lmdb-jall",
                             "train-resnet50-synthetic", "train-resnet50-lmdb-jall"])
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "h" / "dry-run.json").read_text())
    assert code == 0, (out, result["problems"])
    assert "gpu-dry-run: every step holds" in out
    assert [s["archive"] is not None for s in result["steps"]] == [True] * 3
    assert [n for n, *_ in result["steps"][0]["rows"]] == [
        "install", "environment", "data", "gpu-decode-probe", "train-resnet50-synthetic",
        "loader-lmdb-jall", "train-resnet50-lmdb-jall"]
    site = packages_folder(str(tmp_path / "h" / "state" / "site"))
    assert os.path.isdir(os.path.join(site, "stepfake"))
