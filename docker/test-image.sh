#!/usr/bin/env bash
# make test-docker: build docker/Dockerfile, unmodified, on a stand-in for NGC's PyTorch image and
# run the project in the result, with no registry, no Docker engine and no GPU (docs/docker.md).
#   1. debootstrap: Debian 13 minbase -> rootfs.tar (docker/standin/Dockerfile says why 13)
#   2. stand-in:    docker/standin/Dockerfile (FROM scratch + ADD rootfs.tar) tagged
#                   nvcr.io/nvidia/pytorch:standin, in a storage of its own under WORK
#   3. image:       docker/Dockerfile with --build-arg NGC_TAG=standin, docker format; then in OCI
#                   format, where it must stop at its first RUN (SHELL ignored)
#   4. in the image: the self-check, main.py --help, a short run from an LMDB that the image's
#                   folder2lmdb.py writes, a folder run with 2 workers, Pillow-SIMD held
# Each step prints its seconds. WORK, a new folder under TMPDIR, and everything in it, images
# included, is removed at the end unless KEEP=1.
# Needs root, buildah (podman's build engine, with the same build flags) and debootstrap; as root on Debian/Ubuntu the two programs are
# installed from Debian's packages where missing. STORAGE_DRIVER=vfs forces the slow, large but
# always-working storage driver (default: overlay where this kernel mounts it, else vfs).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/sbin:/sbin"
PACKAGES="buildah debootstrap"
SUITE=trixie
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE=nvcr.io/nvidia/pytorch:standin
IMAGE=localhost/imagenet-fast:standin-test
KEEP=${KEEP:-0}
T0=$(date +%s)

say() { echo "make test-docker: $*"; }
pin() { grep -E "^$1==" requirements.txt; }

# -- tools ------------------------------------------------------------------------------------
missing=""
command -v buildah >/dev/null || missing="buildah"
command -v debootstrap >/dev/null || missing="$missing debootstrap"
if [ -n "$missing" ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    say "needs buildah and debootstrap, run as root: apt-get install $PACKAGES (podman users: buildah is its build engine)"; exit 1
  fi
  say "installing $(echo $missing) from Debian's packages"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends $missing >/dev/null
fi
if [ "$(id -u)" != 0 ]; then
  say "needs root (debootstrap and the build's chroot isolation): sudo make test-docker"; exit 1
fi
ENGINE=buildah

WORK=$(mktemp -d "${TMPDIR:-/tmp}/imagenet-fast-docker.XXXXXX")
# A storage of our own (never the machine's /var/lib/containers), removed at the end.
store() { "$ENGINE" --root "$WORK/storage" --runroot "$WORK/run" --storage-driver "$DRIVER" "$@"; }
CONTAINER=""
cleanup() {
  local rc=$?
  set +e
  if [ "$KEEP" = 1 ]; then
    say "kept $WORK (KEEP=1; images $BASE and $IMAGE in its storage)"
  else
    [ -n "$CONTAINER" ] && store rm "$CONTAINER" >/dev/null 2>&1
    [ -n "${DRIVER:-}" ] && store rmi -a -f >/dev/null 2>&1
    # what is still mounted under WORK is ours (a failed debootstrap's /proc, the storage's own)
    findmnt -rn -o TARGET | grep -F "$WORK/" | sort -r | xargs -r umount -l 2>/dev/null
    rm -rf --one-file-system "$WORK" || say "could not remove $WORK"
  fi
  [ "$rc" = 0 ] && say "passed in $(( $(date +%s) - T0 )) s" || say "FAILED (exit $rc)"
}
trap cleanup EXIT

STEP_T=0
step() { STEP_NAME=$1; STEP_T=$(date +%s); say "$1 ..."; }
done_step() { say "$STEP_NAME: $(( $(date +%s) - STEP_T )) s"; }

# overlay where this kernel mounts it for us (no copy per layer), else vfs (a copy per layer)
DRIVER=${STORAGE_DRIVER:-}
if [ -z "$DRIVER" ]; then
  DRIVER=overlay probe=""
  if ! probe=$(store from scratch 2>/dev/null) || ! store mount "$probe" >/dev/null 2>&1; then
    DRIVER=vfs
  fi
  if [ -n "$probe" ]; then
    DRIVER=overlay store rm "$probe" >/dev/null 2>&1 || true
  fi
  [ "$DRIVER" = vfs ] && rm -rf "$WORK/storage" "$WORK/run"  # a storage remembers its driver
fi
say "$ENGINE $("$ENGINE" --version | awk '{print $3}'), storage driver $DRIVER, in $WORK"

# HTTPS from inside the build (apt over http needs nothing): the host's CA bundle, as the host
# trusts it, over the image's for the build's RUN steps only; never written into an image.
CA=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
MOUNTS=()
[ -f "$CA" ] && MOUNTS=(-v "$CA:/etc/ssl/certs/ca-certificates.crt:ro")
build() { store bud --isolation chroot --format docker --pull=never "${MOUNTS[@]}" "$@"; }

# -- 1. debootstrap -----------------------------------------------------------------------------
step "debootstrap $SUITE minbase"
mkdir -p "$WORK/standin"
if ! debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$WORK/rootfs" "$MIRROR" \
     >"$WORK/debootstrap.log" 2>&1; then
  tail -5 "$WORK/debootstrap.log"; say "debootstrap failed (log above)"; exit 1
fi
tar -C "$WORK/rootfs" -cf "$WORK/standin/rootfs.tar" .
rm -rf "$WORK/rootfs"
done_step

# -- 2. the stand-in base -----------------------------------------------------------------------
step "stand-in base $BASE"
cp docker/standin/Dockerfile "$WORK/standin/"
build --build-arg NVIMGCODEC="$(pin nvidia-nvimgcodec-cu13)" \
  --build-arg TENSORBOARD="$(pin tensorboard)" -t "$BASE" "$WORK/standin" >"$WORK/standin.log" 2>&1 \
  || { tail -20 "$WORK/standin.log"; say "stand-in build failed (log above)"; exit 1; }
grep '^stand-in:' "$WORK/standin.log"
rm -f "$WORK/standin/rootfs.tar"
done_step

# -- 3. docker/Dockerfile, unmodified ----------------------------------------------------------
step "docker/Dockerfile on the stand-in"
build --build-arg NGC_TAG=standin -f docker/Dockerfile -t "$IMAGE" . >"$WORK/image.log" 2>&1 \
  || { tail -30 "$WORK/image.log"; say "docker/Dockerfile failed on the stand-in (log above)"; exit 1; }
grep -E '^(STEP|self-check:|pillow-simd)' "$WORK/image.log" | grep -v '^STEP' || true
grep -c '^STEP' "$WORK/image.log" | xargs -I{} echo "make test-docker: {} build steps passed"
done_step

step "docker/Dockerfile in OCI format stops at its first RUN"
if store bud --isolation chroot --format oci --pull=never --build-arg NGC_TAG=standin \
     -f docker/Dockerfile -t localhost/imagenet-fast:oci-test . >"$WORK/oci.log" 2>&1; then
  say "an OCI-format build (SHELL ignored, no pipefail) passed"; exit 1
fi
# the RUN's own output line (the STEP line that echoes the command starts otherwise)
grep -m1 '^docker/Dockerfile: SHELL was ignored (an OCI-format build): build with --format docker$' \
  "$WORK/oci.log" || { tail -10 "$WORK/oci.log"; say "the OCI-format build failed otherwise"; exit 1; }
done_step

# -- 4. in the image ----------------------------------------------------------------------------
CONTAINER=$(store from --pull=never "$IMAGE")
in_image() { store run --isolation chroot "$CONTAINER" -- "$@"; }
SMALL=(-a resnet18 --no-accel --epochs 1 -b 8 --lr 0.01 --train-crop-size 64
       --val-resize-size 73 --val-crop-size 64 --print-freq 100 --seed 0)

step "self-check"
in_image python3 docker/self_check.py
done_step

step "main.py --help"
in_image bash -c 'python3 main.py --help | head -1'
done_step

step "LMDB written by folder2lmdb.py, then a short run from it"
in_image bash -c 'python3 -m tools.datagen /tmp/data --classes 4 --train-per-class 16 \
  --val-per-class 4 >/dev/null \
  && python3 folder2lmdb.py --dataset /tmp/data/train -o /tmp/lmdb/train \
  && python3 folder2lmdb.py --dataset /tmp/data/val -o /tmp/lmdb/val'
in_image python3 main.py --lmdb /tmp/lmdb "${SMALL[@]}" -j 0 --output-dir /tmp/run-lmdb
in_image test -s /tmp/run-lmdb/metrics.jsonl
done_step

step "folder run with 2 DataLoader workers"
in_image python3 main.py /tmp/data "${SMALL[@]}" -j 2 --output-dir /tmp/run-folder
in_image test -s /tmp/run-folder/metrics.jsonl
done_step

step "Pillow-SIMD held against a later pip install"
in_image bash -c 'out=$(python3 -m pip install --no-index --dry-run pillow 2>&1) \
  && grep -q "already satisfied" <<<"$out" \
  && python3 -c "import decode; lib = decode.image_library(); print(\"image library:\", lib); \
assert lib.startswith(\"Pillow-SIMD\"), lib"' \
  || { say "pip would install Pillow over Pillow-SIMD"; exit 1; }
done_step
