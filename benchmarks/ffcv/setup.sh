#!/bin/sh
# Install FFCV 1.0.2 into a side virtual environment (default .ffcv/, git-ignored), never the
# project's .venv, for `make bench-ffcv`:  sh benchmarks/ffcv/setup.sh [FOLDER] [SHARED_PYTHON]
#
# FFCV's C extension builds against libturbojpeg and OpenCV found through pkg-config, so those
# Debian packages are installed where missing (root only). FFCV goes in with --no-deps after
# pinned versions that build on Python 3.11 (its own list names opencv-python and an unpinned
# numba/numpy; opencv-python-headless 4.12 takes numpy < 2.3; pytorch-pfn-extras is left out, as
# it pulls a second torch and only FFCV's GPU NormalizeImage imports it). A .pth file appends
# the project venv's site-packages, so torch is found there, not downloaded again.
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
