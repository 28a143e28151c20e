"""The image's self-check: docker/Dockerfile's last build step, and `make test-docker`'s first
step in the built image. Exits 0 with a few lines of versions, or 1 with one line naming what is
missing, so that a base image without a piece the loaders need fails its build instead of
training slower.

Checked: the Python packages the project imports (torch, torchvision, lmdb, msgpack, yaml, tqdm,
tensorboard, pytest); decode/jpeg/_jpegcrop.so (crop + scale in one decode) decoding a JPEG;
nvImageCodec (the crop-window decoder, which NGC's DALI brings) decoding a JPEG's window, unless
ACCEPT_WHOLE_JPEG=1 (the build argument of that name) accepts whole-JPEG decoding; and that
``pip check`` does not report Pillow missing (Pillow-SIMD stands in for it; see
docker/install-pillow-simd.sh --hold).

usage: python3 docker/self_check.py            (run from the project folder)
"""
from __future__ import annotations

import importlib
import io
import os
import subprocess
import sys

MODULES = ("torch", "torchvision", "lmdb", "msgpack", "yaml", "tqdm", "tensorboard", "pytest")


def fail(line: str) -> None:
    print(f"self-check: FAILED: {line}", file=sys.stderr)
    sys.exit(1)


def sample_jpeg() -> bytes:
    """A 64x48 RGB JPEG made here (no data file needed)."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (64, 48), (9, 99, 199)).save(out, "JPEG", quality=90)
    return out.getvalue()


def check_modules() -> None:
    missing = []
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - ImportError, or a native library that fails
            missing.append(f"{name} ({type(exc).__name__}: {exc})")
    if missing:
        fail("cannot import " + "; ".join(missing))


def check_decoders(accept_whole_jpeg: bool) -> str:
    """The crop-window line to print; fails where a decoder is missing or decodes nothing."""
    from decode import jpeg

    data = sample_jpeg()
    if not jpeg.region.available():
        fail(f"decode/jpeg/_jpegcrop.so is not usable: {jpeg.region.status()}")
    if jpeg.region.decode_region(data, 2, 0, 0, 8, 8) is None:
        fail("decode/jpeg/_jpegcrop.so did not decode a 64x48 JPEG at 1/2 scale")
    if not jpeg.window.available():
        if accept_whole_jpeg:
            return f"{jpeg.window.status()}: accepted by ACCEPT_WHOLE_JPEG=1"
        fail(f"the crop-window decoder is missing, {jpeg.window.status()[len('crop windows: '):]}: "
             "NGC's DALI brings nvImageCodec (module nvidia.nvimgcodec); install "
             "nvidia-nvimgcodec-cu13 (CUDA 13) or -cu12 in the base, or build with "
             "--build-arg ACCEPT_WHOLE_JPEG=1 to train on whole-JPEG decoding (slower)")
    window = jpeg.window.decode_window(data, 8, 8, 16, 24)
    if window is None or tuple(window.shape) != (3, 16, 24):
        fail(f"{jpeg.window.status()} did not decode a 16x24 window of a 64x48 JPEG")
    return jpeg.window.status()


def pillow_complaints() -> list[str]:
    """``pip check`` lines that say Pillow is missing or of the wrong version."""
    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True,
                            text=True, timeout=300)
    return [line for line in (result.stdout + result.stderr).splitlines()
            if "pillow" in line.lower()]


def main() -> None:
    accept_whole_jpeg = os.environ.get("ACCEPT_WHOLE_JPEG", "0") == "1"
    check_modules()
    import torch
    import torchvision

    import decode

    crop_line = check_decoders(accept_whole_jpeg)
    complaints = pillow_complaints()
    if complaints:
        fail("pip check: " + "; ".join(complaints) + " (docker/install-pillow-simd.sh --hold "
             "records Pillow-SIMD as the Pillow that torchvision and tensorboard require)")
    print(f"self-check: torch {torch.__version__} | torchvision {torchvision.__version__} | "
          f"image library: {decode.image_library()}")
    print(f"self-check: {crop_line}; {decode.jpeg.region.status()}")
    print("self-check: passed")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
