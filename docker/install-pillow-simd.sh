#!/bin/sh
# usage: install-pillow-simd.sh VENV_PYTHON   -- replace Pillow with Pillow-SIMD, fall back to Pillow
# Used by `make install` (and meant for docker/Dockerfile): run after every other pip install,
# since pip does not count Pillow-SIMD as Pillow and would put Pillow back over it.
# Builds from source with AVX2 where the CPU has it; on any failure reinstalls plain Pillow
# and says so in one line. Build log: $TMPDIR/pillow-simd-build.log.
PY=${1:?usage: $0 /path/to/venv/bin/python}
SIMD_SPEC=${SIMD_SPEC:-pillow-simd==12.1.1.post0}
LOG=${TMPDIR:-/tmp}/pillow-simd-build.log
PIP="$PY -m pip"
has_hdrs() { printf '#include <stdio.h>\n#include <jpeglib.h>\n#include <zlib.h>\n' | ${CC:-cc} -E -x c - >/dev/null 2>&1; }
verify() { "$PY" -c 'import io, importlib.metadata as m, PIL, PIL.features as f
from PIL import Image
m.distribution("Pillow-SIMD")
assert f.check("jpg") and f.check("zlib"), "no jpeg/zlib"
b = io.BytesIO(); Image.new("RGB", (64, 48), (9, 99, 199)).save(b, "JPEG"); b.seek(0)
assert Image.open(b).convert("RGB").resize((32, 24), Image.BILINEAR).size == (32, 24)
print("pillow-simd", PIL.__version__, "libjpeg_turbo=%s" % f.check_feature("libjpeg_turbo"))'; }
if "$PY" -c 'import importlib.metadata as m; m.distribution("Pillow-SIMD")' 2>/dev/null \
   && ! "$PY" -c 'import importlib.metadata as m; m.distribution("Pillow")' 2>/dev/null && verify 2>/dev/null; then
  exit 0                                     # already done (idempotent)
fi
OLD=$("$PY" -c 'import importlib.metadata as m; print("pillow==" + m.version("Pillow"))' 2>/dev/null || echo pillow)
ok=0
if ! has_hdrs && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    libjpeg-dev zlib1g-dev >/dev/null
fi
if has_hdrs; then
  grep -q avx2 /proc/cpuinfo 2>/dev/null && CC="${CC:-cc} -mavx2" && export CC
  $PIP uninstall -y -q pillow pillow-simd 2>/dev/null
  $PIP install --no-cache-dir --no-binary pillow-simd "$SIMD_SPEC" >"$LOG" 2>&1 && verify && ok=1
fi
if [ "$ok" != 1 ]; then
  echo "pillow-simd: build/verify failed or headers missing; falling back to plain Pillow ($OLD); see $LOG"
  $PIP uninstall -y -q pillow-simd pillow >/dev/null 2>&1
  $PIP install -q "$OLD" || exit 1
fi
