"""`make help` lists every target the README promises, and `make -n docker-run` builds the
docker command line (dry run: nothing is executed, no Docker needed)."""
from __future__ import annotations

import re
import shutil

import pytest

from tests.helpers.runs import make

REQUIRED = ["install", "demo", "test", "test-slurm", "bench", "convert-imagenet", "train",
            "tensorboard", "docker-build", "docker-run", "clean"]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make not installed")


def test_help_lists_every_required_target_aligned():
    result = make("help")
    assert result.returncode == 0, result.stderr
    rows = re.findall(r"^  make (\S+)( +)(\S.*)$", result.stdout, re.M)
    listed = [name for name, _, _ in rows]
    assert set(REQUIRED) <= set(listed), f"missing from make help: {set(REQUIRED) - set(listed)}"
    assert len({len(name) + len(gap) for name, gap, _ in rows}) == 1, "descriptions not aligned"


def test_docker_run_mounts_the_data_read_only_on_all_gpus():
    result = make("-n", "docker-run", "DATA=/x", "IMAGE=img", "OUTPUT=/tmp/out",
                  "ARGS=-c configs/resnet50-lmdb.yaml /data --output-dir /output/r50")
    assert result.returncode == 0, result.stderr
    run = next(line for line in result.stdout.replace("\\\n", " ").splitlines()
               if line.startswith("docker run"))
    assert "--gpus all --ipc=host" in run
    assert "-v /x:/data:ro" in run and "-v /tmp/out:/output" in run
    assert run.split().count("img") == 1
    assert run.endswith("img python3 main.py -c configs/resnet50-lmdb.yaml /data "
                        "--output-dir /output/r50")


def test_docker_run_cmd_and_default():
    custom = make("-n", "docker-run", "DATA=/x", "IMAGE=img", "CMD=bash")
    assert re.search(r"img bash\s*$", custom.stdout), custom.stdout
    default = make("-n", "docker-run", "DATA=/x", "IMAGE=img")
    assert re.search(r":/output img\s*$", default.stdout), default.stdout


def test_docker_run_without_data_is_a_usage_error():
    result = make("docker-run")
    assert result.returncode != 0 and "usage: make docker-run DATA=" in result.stdout


def test_docker_build_uses_the_dockerfile_and_optional_ngc_tag():
    plain = make("-n", "docker-build", "IMAGE=img").stdout.strip()
    assert plain == "docker build -f docker/Dockerfile -t img  ."
    tagged = make("-n", "docker-build", "IMAGE=img", "NGC_TAG=25.01-py3").stdout.strip()
    assert "--build-arg NGC_TAG=25.01-py3 ." in tagged


def test_convert_imagenet_passes_a_raw_budget_to_both_splits():
    result = make("-n", "convert-imagenet", "IMAGENET=/d", "OUT=/o", "MAX_SIDE=512",
                  "QUALITY=90", "RAW_BUDGET=2.7x")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if "folder2lmdb.py" in line]
    assert len(lines) == 2 and all("--max-side 512 --quality 90 --raw-budget 2.7x" in line
                                   for line in lines)
    plain = make("-n", "convert-imagenet", "IMAGENET=/d", "OUT=/o")
    assert "--raw-budget" not in plain.stdout
