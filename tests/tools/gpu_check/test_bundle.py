"""``make gpu-bundle`` (:mod:`tools.gpu_check.bundle.build`): the sample from ``--data`` or
generated, the wheels it asks pip for (CPython 3.12, DALI for the CUDA major), its steps with
``--step-size``, and its one-line errors. pip itself is replaced by a stand-in here:
downloading needs the network."""
from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace

import pytest
from PIL import Image

from decode.gpu import nvjpeg_pip_package
from tools.gpu_check.bundle import build as gpu_bundle
from tests.helpers.gpu_fakes import in_process


@pytest.fixture
def fake_pip(monkeypatch):
    """``subprocess.run`` of gpu_bundle: records the pip command and 'downloads' a numpy and
    an lmdb wheel into its ``-d`` folder (other commands, git's file list, run as they are)."""
    commands = []
    real = subprocess.run

    def run(cmd, **kwargs):
        if "pip" not in cmd:
            return real(cmd, **kwargs)
        commands.append(cmd)
        folder = cmd[cmd.index("-d") + 1]
        for name in ("numpy-2.0-cp312-cp312-x.whl", "lmdb-3.0.0-cp312-cp312-x.whl"):
            with open(os.path.join(folder, name), "wb") as f:
                f.write(b"PK")
        return SimpleNamespace(returncode=0)

    monkeypatch.setattr(gpu_bundle.subprocess, "run", run)
    return commands


def bundle(argv):
    return in_process(gpu_bundle.main_cli, argv)


def test_images_from_data_one_per_class_first(tmp_path, fake_pip):
    """100 files, one per class first: 3 classes of 40 give 34, 33 and 33."""
    data = tmp_path / "d" / "train"
    for k in range(3):
        (data / f"n{k}").mkdir(parents=True)
        for i in range(40):
            Image.new("RGB", (8, 8)).save(data / f"n{k}" / f"{i:02d}.JPEG")
    code, out, _ = bundle(["--data", str(tmp_path / "d"), "--out", str(tmp_path / "b"),
                           "--step-size", "64M"])
    assert code == 0
    train = tmp_path / "b" / "sample" / "train"
    assert [len(os.listdir(train / c)) for c in sorted(os.listdir(train))] == [34, 33, 33]
    assert sorted(os.listdir(train / "n2"))[-1] == "32.JPEG"
    assert os.readlink(tmp_path / "b" / "sample" / "val") == "train"  # relative: travels
    assert f"images: 100 files in 3 classes from {tmp_path}/d/train" in out
    assert sorted(os.listdir(tmp_path / "b" / "wheels")) == ["lmdb-3.0.0-cp312-cp312-x.whl"]
    cmd, dali = fake_pip  # what rows 1-4 need, then DALI and what only it pulls in
    assert cmd[1:4] == ["-m", "pip", "download"] and "--only-binary=:all:" in cmd
    assert cmd[cmd.index("--python-version") + 1] == "3.12" and "--no-deps" not in cmd
    assert not any("dali" in x for x in cmd) and any(x.startswith("nvidia-dali") for x in dali)
    assert dali[dali.index("-d") + 1].endswith("wheels-dali")
    # one step holds it all (lmdb, fetched twice, kept once), printed with its bytes
    assert sorted(os.listdir(tmp_path / "b" / "steps")) == ["1"]
    assert not os.listdir(tmp_path / "b" / "wheels-dali")
    rel = os.path.relpath(tmp_path / "b", gpu_bundle.REPO)
    assert f"step 1: copy {rel}/steps/1 (" in out
    assert "then: python3 -m tools.gpu_check --step 1 [--budget T]" in out


def test_images_are_generated_without_data(tmp_path, fake_pip):
    code, out, _ = bundle(["--out", str(tmp_path / "b")])
    assert code == 0 and "100 generated JPEGs" in out and "pass DATA=DIR" in out
    train = tmp_path / "b" / "sample" / "train"
    files = [os.path.join(d, f) for d, _, names in os.walk(train) for f in names]
    assert len(files) == 100 and len(os.listdir(train)) == 10
    with Image.open(files[0]) as img:
        assert img.format == "JPEG" and min(img.size) >= 320  # ImageNet-like, not thumbnails


def test_dali_wheel_follows_the_cuda_major():
    local = gpu_bundle.local_cuda_major()
    specs = gpu_bundle.wheel_specs(local, dali=True)
    assert any(s.startswith(f"nvidia-dali-cuda{local}0") for s in specs)
    assert {s.split("==")[0] for s in specs} >= {"lmdb", "pytest", f"nvidia-nvimgcodec-cu{local}",
                                             nvjpeg_pip_package(local)}
    other = "12" if local != "12" else "13"
    specs = gpu_bundle.wheel_specs(other, dali=True)
    assert f"nvidia-nvimgcodec-cu{other}" in specs  # pip picks the version for that CUDA
    assert nvjpeg_pip_package(other) in specs  # nvImageCodec's optional extra: always there
    assert any(s.startswith(f"nvidia-dali-cuda{other}0") for s in specs)
    assert not any("dali" in s for s in gpu_bundle.wheel_specs(local, dali=False))


@pytest.mark.parametrize("argv,message", [
    (["--data", "/nonexistent"], "--data /nonexistent: no such directory"),
    (["--cuda", "9"], "--cuda 9: expected a CUDA major"),
    (["--step-size", "big"], "--step-size big: expected a size such as 64M"),
])
def test_bad_input_is_one_line(tmp_path, fake_pip, argv, message):
    code, out, err = bundle([*argv, "--out", str(tmp_path / "b")])
    assert code == 2 and err.count("\n") == 1 and message in err and not fake_pip


def test_data_without_images_is_one_line(tmp_path, fake_pip):
    (tmp_path / "d" / "train" / "n0").mkdir(parents=True)
    code, _, err = bundle(["--data", str(tmp_path / "d"), "--out", str(tmp_path / "b")])
    assert code == 2 and err.count("\n") == 1 and "no images in" in err


def test_a_step_size_step_1_cannot_fit_is_one_line(tmp_path, fake_pip):
    code, _, err = bundle(["--out", str(tmp_path / "b"), "--step-size", "1M"])
    assert code == 2 and err.count("\n") == 1
    assert "step 1 needs" in err and "a larger --step-size" in err
