"""The lease plan (``python -m tools.gpu_check --lease``) and its rehearsal (``--rehearse``,
``make gpu-rehearse``): rows declared once in the issue's order and sized to 13 minutes, the
bundle laid out per device call within its bytes, and a short row set rehearsed end to end on
the CPU backends over two calls (a DALI-sized wheel carried in parts), leaving one archive
under $OUT."""
from __future__ import annotations

import json
import os
import tarfile

import pytest

from tests.helpers.gpu_fakes import fake_wheel, gpu_check_cli, make_bundle
from tools import _gpu_plan, gpu_bundle
from tools.wheel_parts import reassemble


def test_rows_are_declared_once_in_the_issues_order_and_fit_13_minutes():
    rows = _gpu_plan.plan_rows()
    names = [r.name for r in rows]
    assert len(names) == len(set(names))
    groups = [r.group for r in rows]
    assert groups == sorted(groups) and set(groups) == {1, 2, 3, 4, 5, 6}
    assert all(r.expect < r.box <= _gpu_plan.CALL_SECONDS for r in rows)
    assert all(r.needs_dali for r in rows if r.group == 5)
    # the plan's own estimate, 5 calls (DALI 2.4.0 and its dependencies), before any rehearsal
    assert _gpu_plan.expected_core_seconds(rows, calls=5) <= _gpu_plan.CORE_DEADLINE
    assert [r.name for r in _gpu_plan.select(rows, ["loader-lmdb-*"])] == [
        "loader-lmdb-jall", "loader-lmdb-jless"]
    with pytest.raises(ValueError, match="--rows nothing: no row of the plan matches"):
        _gpu_plan.select(rows, ["nothing"])


@pytest.fixture(scope="module")
def small_bundle(sample_images, tmp_path_factory):
    """A bundle of 4 real images, a small wheel and a 3 MiB 'DALI' wheel, laid out for calls
    of (the repository + 2 MiB margin + the sample + 2 MiB): two calls, a part in each."""
    root = tmp_path_factory.mktemp("lease") / "bundle"
    make_bundle(sample_images, root, classes=4)
    fake_wheel(str(root / "wheels"), "leasefake")
    (root / "wheels-dali").mkdir()
    fake_wheel(str(root / "wheels-dali"), "leasedalidep")
    big = root / "wheels-dali" / "nvidia_dali_cuda130-9.9-py3-none-any.whl"
    big.write_bytes(os.urandom(3 << 20))
    repo = gpu_bundle.carried_bytes(gpu_bundle.REPO)
    limit = repo + (2 << 20) + gpu_bundle.folder_bytes(str(root / "sample")) + (2 << 20)
    calls = gpu_bundle.lay_out_calls(str(root), repo, call_bytes=limit)
    return root, calls, limit


def test_calls_carry_the_bundle_within_their_bytes(small_bundle, tmp_path):
    root, calls, limit = small_bundle
    assert [c["call"] for c in calls] == [1, 2]
    assert all(c["bytes"] <= limit for c in calls)
    assert "sample" in calls[0]["files"] and "parts/SHA256SUMS" in calls[0]["files"]
    assert "wheels-dali/WHEELS" in calls[0]["files"]  # what DALI's install waits for
    assert "wheels-dali/leasedalidep-1.0-py3-none-any.whl" in calls[0]["files"]
    assert calls[0]["files"][-1].endswith(".part00")  # call 1 carries a part too
    assert calls[1]["files"] == [calls[0]["files"][-1].replace("part00", "part01")]
    (joined,) = reassemble(str(root / "parts"), str(tmp_path))  # the parts are the wheel
    assert os.path.getsize(joined) == 3 << 20


def test_rehearsal_of_a_short_row_set_fits_and_leaves_one_archive(small_bundle, tmp_path,
                                                                    monkeypatch):
    root, _, _ = small_bundle
    out = tmp_path / "OUT"
    monkeypatch.setenv("OUT", str(out))
    code, stdout, err = gpu_check_cli(["--rehearse", "--bundle", str(root), "--state",
                                       str(tmp_path / "m"), "--rows", "gpu-decode-probe",
                                       "loader-lmdb-jall"])
    report = json.loads((tmp_path / "m" / "rehearsal.json").read_text())
    assert code == 0, (stdout, err, report["summary"])
    assert "gpu-rehearse: the plan fits" in stdout
    assert os.listdir(out) == ["gpu-check.tar.gz"]  # what would come back: one file
    assert [c["out_check"]["files"] for c in report["calls"]] == [["gpu-check.tar.gz"]] * 2
    rows = {r["name"]: r for r in report["rows"]}
    assert list(rows) == ["install", "environment", "data", "gpu-decode-probe",
                          "loader-lmdb-jall"]
    assert all(r["status"] == "passed" and r["call"] == 1 for r in rows.values()), rows
    # scaled to an H100: its processes' CPU seconds + CUDA start + 50 batches of 256 at 2,900
    # images/s
    jall = rows["loader-lmdb-jall"]
    assert 0 < jall["cpu_seconds"] and jall["gpu_seconds"] == pytest.approx(
        jall["cpu_seconds"] + 10 + 50 * 256 / 2900, abs=0.02)
    assert report["summary"]["total_gpu_seconds"] <= 900
    # the second call's part joined the first's on the 'machine': both kept for DALI's rows
    parts = os.listdir(tmp_path / "m" / "state" / "bundle" / "parts")
    assert sorted(p[-6:] for p in parts) == ["256SUMS"[-6:], "part00", "part01"]
    with tarfile.open(out / "gpu-check.tar.gz") as tar:
        names = tar.getnames()
        lease = json.load(tar.extractfile("gpu-check/report.json"))
    assert lease["not_run"] == [] and lease["dry_run"] is True
    assert lease["figures"]["loader-gpudecode-j4"] is None  # not among the rows asked for
    assert "gpu-check/rows.jsonl" in names and "gpu-check/report.md" in names
    assert "gpu-check/logs/loader-lmdb-jall.out" in names


def test_lease_state_inside_out_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    code, _, err = gpu_check_cli(["--lease", "--dry-run", "--state", str(tmp_path / "s")])
    assert code == 2 and err.count("\n") == 1 and "is inside $OUT" in err
