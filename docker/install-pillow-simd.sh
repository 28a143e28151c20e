#!/bin/sh
# usage: install-pillow-simd.sh VENV_PYTHON [--hold CONSTRAINT_FILE]
#   -- replace Pillow with Pillow-SIMD, fall back to Pillow
# Used by `make install` and docker/Dockerfile: run after every other pip install, since pip does
# not count Pillow-SIMD as Pillow and would put Pillow back over it.
# Builds from source; on any failure reinstalls plain Pillow and says so in one line. Build log:
# $TMPDIR/pillow-simd-build.log.
# PILLOW_SIMD_AVX2: auto (the default: AVX2 where this machine has it, right for a .venv used
# here), 1 (AVX2: the result fails on a CPU without it), 0 (Pillow-SIMD's own default, SSE4.1/4.2,
# which every x86-64 CPU since 2008 has: docker/Dockerfile's default, since an image runs on
# other machines than the one that built it).
# --hold (docker/Dockerfile): records Pillow-SIMD as the Pillow its version is (a dist-info
# named pillow with no files of its own, so `pip check` finds the Pillow that torchvision and
# tensorboard require and a later `pip install` needing Pillow leaves PIL alone), and pins that
# version in CONSTRAINT_FILE (NGC's /etc/pip/constraint.txt, named by PIP_CONSTRAINT), so that an
# install needing a newer Pillow stops with pip's constraint error instead of replacing PIL.
PY=${1:?usage: $0 /path/to/venv/bin/python [--hold CONSTRAINT_FILE]}
HOLD=0
if [ "${2:-}" = --hold ]; then HOLD=1; CONSTRAINT=${3:-}; fi
SIMD_SPEC=${SIMD_SPEC:-pillow-simd==12.1.1.post0}
AVX2=${PILLOW_SIMD_AVX2:-auto}
LOG=${TMPDIR:-/tmp}/pillow-simd-build.log
PIP="$PY -m pip"
case "$AVX2" in auto|0|1) ;; *) echo "PILLOW_SIMD_AVX2=$AVX2: expected auto, 0 or 1"; exit 2;; esac
has_hdrs() { printf '#include <stdio.h>\n#include <jpeglib.h>\n#include <zlib.h>\n' | ${CC:-cc} -E -x c - >/dev/null 2>&1; }
verify() { "$PY" -c 'import io, importlib.metadata as m, PIL, PIL.features as f
from PIL import Image
m.distribution("Pillow-SIMD")
assert f.check("jpg") and f.check("zlib"), "no jpeg/zlib"
b = io.BytesIO(); Image.new("RGB", (64, 48), (9, 99, 199)).save(b, "JPEG"); b.seek(0)
assert Image.open(b).convert("RGB").resize((32, 24), Image.BILINEAR).size == (32, 24)
print("pillow-simd", PIL.__version__, "libjpeg_turbo=%s" % f.check_feature("libjpeg_turbo"))'; }
# Pillow's distribution as pip sees it: "real", "held" (our record from --hold) or "none"
pillow_dist() { "$PY" -c 'import importlib.metadata as m
try:
    d = m.distribution("Pillow")
except m.PackageNotFoundError:
    print("none")
else:
    print("held" if (d.metadata["Summary"] or "").startswith("held by install-pillow-simd") else "real")'; }
hold() {
  "$PY" - "$CONSTRAINT" <<'EOF' || exit 1
import importlib.metadata as m, os, re, sys
simd = m.distribution("Pillow-SIMD")
version, site = simd.version, str(simd.locate_file(""))
for d in os.listdir(site):  # an earlier hold's record, never a real Pillow's
    meta = os.path.join(site, d, "METADATA")
    if re.fullmatch(r"(?i)pillow-[^-]+\.dist-info", d) and os.path.exists(meta) \
            and "Summary: held by install-pillow-simd" in open(meta).read():
        for f in os.listdir(os.path.join(site, d)):
            os.remove(os.path.join(site, d, f))
        os.rmdir(os.path.join(site, d))
info = os.path.join(site, f"pillow-{version}.dist-info")
os.makedirs(info)
files = {"METADATA": f"Metadata-Version: 2.1\nName: pillow\nVersion: {version}\nSummary: held by "
                     f"install-pillow-simd.sh: PIL is Pillow-SIMD {version}, installed as "
                     "pillow-simd; this record has no files of its own\n",
         "INSTALLER": "install-pillow-simd.sh\n"}
for name, text in files.items():
    with open(os.path.join(info, name), "w") as f:
        f.write(text)
rel = os.path.basename(info)
with open(os.path.join(info, "RECORD"), "w") as f:
    f.writelines(f"{rel}/{name},,\n" for name in [*files, "RECORD"])
constraint = sys.argv[1]
if constraint:
    lines = open(constraint).read().splitlines() if os.path.exists(constraint) else []
    keep = [l for l in lines if not re.match(r"(?i)\s*pillow\s*(==|>|<|~|!|$)", l)]
    with open(constraint, "w") as f:
        f.write("\n".join(keep + [f"pillow=={version}"]) + "\n")
print(f"pillow-simd: held as pillow {version} (pip check sees it)"
      + (f"; pinned in {constraint}" if constraint else "; no constraint file to pin it in"))
EOF
}
if "$PY" -c 'import importlib.metadata as m; m.distribution("Pillow-SIMD")' 2>/dev/null \
   && [ "$(pillow_dist)" != real ] && verify 2>/dev/null; then
  [ "$HOLD" = 1 ] && hold
  exit 0                                     # already done (idempotent)
fi
OLD=pillow
[ "$(pillow_dist)" = real ] && OLD=$("$PY" -c 'import importlib.metadata as m; print("pillow==" + m.version("Pillow"))')
ok=0
if ! has_hdrs && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    libjpeg-dev zlib1g-dev >/dev/null
fi
if has_hdrs; then
  if [ "$AVX2" = 1 ] || { [ "$AVX2" = auto ] && grep -q avx2 /proc/cpuinfo 2>/dev/null; }; then
    CC="${CC:-cc} -mavx2" && export CC
  fi
  $PIP uninstall -y -q pillow pillow-simd 2>/dev/null
  $PIP install --no-cache-dir --no-binary pillow-simd "$SIMD_SPEC" >"$LOG" 2>&1 && verify && ok=1
fi
if [ "$ok" != 1 ]; then
  echo "pillow-simd: build/verify failed or headers missing; falling back to plain Pillow ($OLD); see $LOG"
  $PIP uninstall -y -q pillow-simd pillow >/dev/null 2>&1
  $PIP install -q "$OLD" || exit 1
  exit 0
fi
[ "$HOLD" = 1 ] && hold
exit 0
