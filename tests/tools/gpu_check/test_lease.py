"""The lease plan (``python -m tools.gpu_check --lease``) and its rehearsal (``--rehearse``,
``make gpu-rehearse``): rows declared once in the plan's order, call 1 standing alone, the bundle
laid out per device call within its bytes, a short row set rehearsed end to end over two calls,
a machine lost between calls reported, a later call given up when the time left cannot cover
DALI, and a row that raises recorded as failed with the archive still written."""
from __future__ import annotations

import json
import os
import tarfile

import pytest

from tests.helpers.gpu_fakes import fake_wheel, gpu_check_cli, make_bundle
from tools.gpu_check.lease import calls, plan
from tools.gpu_check.machine import layout
from tools.gpu_check.rows import lease as lease_rows
from tools.gpu_check.machine.wheel_parts import reassemble


def test_rows_are_declared_once_and_call_1_stands_alone():
    rows = plan.plan_rows()
    names = [r.name for r in rows]
    assert len(names) == len(set(names))
    groups = [r.group for r in rows]
    assert groups == sorted(groups) and set(groups) == {1, 2, 3, 4, 5, 6}
    assert all(r.expect < r.box <= plan.CALL_SECONDS for r in rows)
    assert [r.needs_dali for r in rows if r.group <= 5] == [r.group == 5 for r in rows
                                                            if r.group <= 5]
    # call 1's set-up and rows fit 7 minutes by the plan's own estimate
    call1 = sum(plan.SETUP_EXPECT[k] for k in ("install", "environment", "data"))
    assert call1 + sum(r.expect for r in rows if r.group <= 4) <= plan.CALL1_WALL
    # steady state: ResNet-50 rows time 200 steps after more warm-up than 16 workers hold
    jall = next(r for r in rows if r.name == "train-resnet50-lmdb-jall")
    assert jall.gpu_batches() == 4 * 16 + 2 + 5 + 200
    assert [r.name for r in plan.select(rows, ["loader-lmdb-*"])] == [
        "loader-lmdb-jall", "loader-lmdb-jless"]
    with pytest.raises(ValueError, match="--rows nothing: no row of the plan matches"):
        plan.select(rows, ["nothing"])


@pytest.fixture(scope="module")
def small_bundle(sample_images, tmp_path_factory):
    """A bundle of 4 real images, a small wheel, and a 3 MiB 'DALI' wheel with a small
    dependency, laid out for calls of (the repository + 2 MiB margin + the sample + 2 MiB)."""
    root = tmp_path_factory.mktemp("lease") / "bundle"
    make_bundle(sample_images, root, classes=4)
    fake_wheel(str(root / "wheels"), "leasefake")
    (root / "wheels-dali").mkdir()
    fake_wheel(str(root / "wheels-dali"), "leasedalidep")
    big = root / "wheels-dali" / "nvidia_dali_cuda130-9.9-py3-none-any.whl"
    big.write_bytes(os.urandom(3 << 20))
    repo = layout.carried_bytes(layout.REPO)
    limit = repo + (2 << 20) + layout.folder_bytes(str(root / "sample")) + (2 << 20)
    return root, layout.lay_out_calls(str(root), repo, call_bytes=limit), limit


def test_call_1_carries_nothing_of_dali_and_every_call_names_itself(small_bundle, tmp_path):
    root, laid, limit = small_bundle
    assert [c["call"] for c in laid] == [1, 2, 3] and all(c["bytes"] <= limit for c in laid)
    assert sorted(laid[0]["files"]) == ["sample", "wheels/leasefake-1.0-py3-none-any.whl"]
    assert laid[1]["files"][:2] == ["wheels-dali/WHEELS", "parts/SHA256SUMS"]
    assert "wheels-dali/leasedalidep-1.0-py3-none-any.whl" in laid[1]["files"]
    assert [f[-6:] for c in laid[1:] for f in c["files"] if ".part" in f] == [
        "part00", "part01"]
    for c in laid:
        call = json.loads((root / "calls" / str(c["call"]) / calls.CALL_FILE).read_text())
        assert call["call"] == c["call"] and call["calls"] == 3
        assert call["bytes"] == [x["bytes"] for x in laid]
    (joined,) = reassemble(str(root / "parts"), str(tmp_path))  # the parts are the wheel
    assert os.path.getsize(joined) == 3 << 20


@pytest.mark.heavy
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
    assert [c["out_check"]["files"] for c in report["calls"]] == [["gpu-check.tar.gz"]] * 3
    # each later call got the time a lender would report left, after start, gaps and uploads
    first, second = report["calls"][:2]
    assert first["lease_left"] is None and first["lead"] == "next call"
    assert second["lease_left"] == pytest.approx(900 - first["back_at"], abs=1)
    assert second["gap_seconds"] == 30 and "--lease-left" in second["command"]
    rows = {r["name"]: r for r in report["rows"]}
    assert list(rows) == ["install", "environment", "data", "gpu-decode-probe",
                          "loader-lmdb-jall"]
    assert all(r["status"] == "passed" and r["call"] == 1 for r in rows.values()), rows
    # the installable wheel went into a clean --target with this environment's copy hidden
    assert rows["install"]["installed"] == ["leasefake"]
    site = str(tmp_path / "m" / "state" / "site")
    assert os.path.isdir(os.path.join(site, "leasefake"))
    # scaled to an H100: its processes' CPU seconds + a CUDA context (no cuDNN tuning) + its
    # batches at 2,900 images/s: warm-up past 16 workers' ready batches, 10 waves timed
    jall = rows["loader-lmdb-jall"]
    assert jall["warmup_steps"] > 2 and jall["gpu_seconds"] == pytest.approx(
        jall["cpu_seconds"] + 3 + (4 * 16 + 2 + 2 + 160) * 256 / 2900, abs=0.02)
    assert report["summary"]["total_gpu_seconds"] <= 900
    with tarfile.open(out / "gpu-check.tar.gz") as tar:
        names = tar.getnames()
        lease = json.load(tar.extractfile("gpu-check/report.json"))
    assert lease["not_run"] == [] and lease["dry_run"] is True and lease["call"]["call"] == 3
    assert "gpu-check/rows.jsonl" in names and "gpu-check/logs/loader-lmdb-jall.out" in names


def lease_call(tmp_path, monkeypatch, carried: dict, *argv):
    """One ``--lease --dry-run`` call in this process, carrying a ``CALL`` file ``carried``
    into a repository-like folder; (exit status, stdout, the archive's rows)."""
    repo = tmp_path / "repo"
    folder = repo / ".gpu-bundle" / "calls" / str(carried["call"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / calls.CALL_FILE).write_text(json.dumps(carried))
    monkeypatch.setattr("tools.gpu_check.lease.run.REPO", str(repo))
    monkeypatch.setenv("OUT", str(tmp_path / "OUT"))
    code, out, err = gpu_check_cli(["--lease", "--dry-run", "--state", str(tmp_path / "s"),
                                    *argv])
    with tarfile.open(tmp_path / "OUT" / "gpu-check.tar.gz") as tar:
        rows = [json.loads(x) for x in tar.extractfile("gpu-check/rows.jsonl")]
    return code, out + err, {r["name"]: r for r in rows}


def test_a_lost_machine_is_reported_and_the_lease_stops(tmp_path, monkeypatch):
    """Call 3 on a fresh machine: the state of calls 1 and 2 is gone. Its archive says so in
    a row, probes the machine, and the lead is told to give the machine back."""
    carried = {"call": 3, "calls": 5, "bundle": "b1", "bytes": [1 << 20] * 5}
    code, out, rows = lease_call(tmp_path, monkeypatch, carried)
    lost = rows["machine-lost-call3"]
    assert code == 1 and lost["status"] == "failed"
    assert lost["reason"].startswith("machine lost (a fresh machine): call 3 found no state "
                                     "of calls 1, 2 here")
    assert rows["environment"]["status"] == "passed"  # what still runs
    assert out.strip().splitlines()[-1].endswith("give_back now")


def test_a_later_call_without_time_for_dali_gives_the_lease_up(sample_images, tmp_path, monkeypatch):
    """Call 2 with 180 s left: DALI's install and rows cannot fit. And a row that raises is a
    failed row, the archive written all the same."""
    make_bundle(sample_images, tmp_path / "repo" / ".gpu-bundle" / "calls" / "2", classes=2)
    monkeypatch.setattr(lease_rows, "decode_hardware", lambda ctx: 1 / 0)
    carried = {"call": 2, "calls": 3, "bundle": "b2", "bytes": [1 << 20] * 3}
    state = tmp_path / "s"
    state.mkdir()
    (state / "lease.json").write_text(json.dumps([{"call": 1, "bundle": "b2", "started": 0}]))
    code, out, rows = lease_call(tmp_path, monkeypatch, carried, "--lease-left", "180",
                                 "--rows", "gpu-decode-hardware", "dali-gpu-decode")
    assert code == 1 and (state / "bundle" / "sample" / "train").is_dir()  # stashed
    assert rows["gpu-decode-hardware"]["status"] == "failed"
    assert rows["gpu-decode-hardware"]["reason"] == "ZeroDivisionError: division by zero"
    assert rows["dali"]["status"] == "skipped"
    assert rows["dali"]["reason"].startswith("lease time: ")
    assert "dali-gpu-decode" not in rows
    assert "DONE (lease time: " in out.strip().splitlines()[-1]


def test_lease_state_inside_out_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    code, _, err = gpu_check_cli(["--lease", "--dry-run", "--state", str(tmp_path / "s")])
    assert code == 2 and err.count("\n") == 1 and "is inside $OUT" in err


def test_a_rehearsal_without_git_is_one_line(tmp_path, monkeypatch):
    """The files a call sends are git's list: without git the rehearsal says so in one line."""
    os.makedirs(tmp_path / "bundle" / "calls" / "1")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code, _, err = gpu_check_cli(["--rehearse", "--bundle", str(tmp_path / "bundle"),
                                  "--state", str(tmp_path / "state")])
    assert code == 2 and err.count("\n") == 1 and "git ls-files" in err, err
