#!/bin/sh
# Install FFCV 1.0.2 into a side virtual environment (default .ffcv/, git-ignored), never the
# project's .venv: `make bench-ffcv` runs this, then benchmarks/ffcv/compare.py times FFCV's loader
# with that environment's Python beside ours.
#
#   sh benchmarks/ffcv/setup.sh [FOLDER] [SHARED_PYTHON]
#
# FFCV 1.0.2 builds a C extension against libturbojpeg and OpenCV found through pkg-config
# (its setup.py), so Debian's libturbojpeg0-dev, libopencv-dev and pkg-config are installed
# where missing (root only). Its own requirement list names opencv-python and an unpinned
# numba/numpy, so it is installed with --no-deps after pinned versions that build on Python 3.11:
# numpy 2.2 (opencv-python-headless 4.12 takes < 2.3), numba, opencv-python-headless and FFCV's small pure
# Python requirements (not pytorch-pfn-extras: it pulls a second torch, and only FFCV's
# NormalizeImage on a GPU imports it). torch is not downloaded again (a CUDA wheel of several GiB): a .pth file
# appends the project venv's site-packages, so `import torch` finds the project's copy while
# everything installed here takes precedence.
set -eu
FOLDER=${1:-.ffcv}
SHARED_PY=${2:-.venv/bin/python}
STAMP="$FOLDER/.installed-1.0.2"
[ -f "$STAMP" ] && exit 0
missing=""
for pkg in libturbojpeg0-dev libopencv-dev pkg-config; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"
done
if [ -n "$missing" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "benchmarks/ffcv/setup.sh: FFCV 1.0.2 needs Debian packages:$missing; run as root or" \
         "'sudo apt-get install$missing' first" >&2
    exit 1
  fi
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing
fi
test -x "$FOLDER/bin/python" || python3 -m venv "$FOLDER"
PIP="$FOLDER/bin/python -m pip install -q --disable-pip-version-check"
$PIP "numpy==2.2.6" "numba==0.62.1" "opencv-python-headless==4.12.0.88" terminaltables==3.1.10 \
  fastargs==1.2.0 assertpy==1.1 psutil tqdm setuptools wheel
SHARED_SITE=$("$SHARED_PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
OWN_SITE=$("$FOLDER/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$SHARED_SITE" > "$OWN_SITE/zz-project-venv.pth"
$PIP --no-deps --no-build-isolation "ffcv==1.0.2"
"$FOLDER/bin/python" -c "import ffcv, ffcv.libffcv, torch; print('ffcv', ffcv.__version__, 'torch', torch.__version__)"
touch "$STAMP"
