"""DALI's wheel cut into parts for an offline bundle's steps (:mod:`tools.gpu_check.bundle.steps`,
``make gpu-bundle STEP_SIZE=64M``): parts reassemble byte for byte, a missing or damaged part is one
line naming it, and DALI installed from parts of its real wheel decodes on its CPU backend."""
import importlib.metadata
import os
import subprocess
import sys
import zipfile

import pytest

from tests.helpers.gpu_fakes import fake_wheel
from tools.gpu_check.bundle.steps import MANIFEST, join_parts, share_namespace, split


def test_parts_reassemble_byte_for_byte(tmp_path):
    wheel = fake_wheel(str(tmp_path), "bigpackage")
    with zipfile.ZipFile(wheel, "a") as zf:  # a few kB that do not compress
        zf.writestr("bigpackage/blob.bin", os.urandom(5000), zipfile.ZIP_STORED)
    parts = split(wheel, str(tmp_path / "parts"), part_bytes=1000)
    size = os.path.getsize(wheel)
    assert len(parts) == -(-size // 1000) and all(os.path.getsize(p) <= 1000 for p in parts)
    manifest = (tmp_path / "parts" / MANIFEST).read_text().split()[1::2]
    assert set(manifest) == {os.path.basename(p) for p in parts} | {os.path.basename(wheel)}
    (joined,), (record,) = join_parts(str(tmp_path / "parts"), str(tmp_path / "joined"))
    assert open(joined, "rb").read() == open(wheel, "rb").read()
    assert record == {"name": "parts", "status": "passed", "joined": [os.path.basename(wheel)]}


def test_a_missing_or_damaged_part_is_one_line_naming_it(tmp_path):
    wheel = fake_wheel(str(tmp_path), "smallpackage")
    parts = split(wheel, str(tmp_path / "parts"), part_bytes=300)
    data = bytearray(open(parts[1], "rb").read())
    data[0] ^= 0xFF
    open(parts[1], "wb").write(bytes(data))
    wheels, (record,) = join_parts(str(tmp_path / "parts"), str(tmp_path / "joined"))
    assert wheels == [] and record["status"] == "failed"
    assert record["reason"].startswith(f"{parts[1]}: damaged"), record
    os.remove(parts[1])
    wheels, (record,) = join_parts(str(tmp_path / "parts"), str(tmp_path / "joined"))
    assert wheels == [] and record["reason"].startswith(f"{parts[1]}: missing"), record
    assert join_parts(str(tmp_path / "nothing"), str(tmp_path / "j")) == ([], [])


def _repack(dist_name: str, folder: str) -> str:
    """The installed distribution ``dist_name`` as a wheel again (its RECORD's files, stored)."""
    dist = importlib.metadata.distribution(dist_name)
    info = next(f for f in dist.files if f.name == "WHEEL")
    tag = next(line.split(": ")[1].strip() for line in dist.locate_file(info).read_text()
               .splitlines() if line.startswith("Tag: "))
    name = dist.metadata["Name"].replace("-", "_")
    path = os.path.join(folder, f"{name}-{dist.version}-{tag}.whl")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for file in dist.files:
            if file.parts[0] != ".." and os.path.isfile(dist.locate_file(file)):
                zf.write(dist.locate_file(file), str(file))
    return path


def _installed_from_parts(tmp_path, wheels: list[str], code: str) -> str:
    """Split the first of ``wheels`` into parts of at most 60 MiB (at least two), reassemble them
    (checked against the manifest), install the result beside the other wheels with pip into a
    folder of its own (no byte-compiling, as gpu_check installs), share the ``nvidia``
    namespace as gpu_check does, and run ``code`` with that folder first on ``PYTHONPATH``:
    its last line of output."""
    parts = split(wheels[0], str(tmp_path / "parts"), 60 << 20)
    assert len(parts) >= 2 and all(os.path.getsize(p) <= 60 * 2**20 for p in parts)
    whole = open(wheels[0], "rb").read()
    os.remove(wheels[0])
    (joined,), _ = join_parts(str(tmp_path / "parts"), str(tmp_path / "joined"))
    assert open(joined, "rb").read() == whole
    del whole
    assert os.path.isfile(os.path.join(str(tmp_path / "parts"), MANIFEST))
    for part in parts:
        os.remove(part)
    site = str(tmp_path / "site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--disable-pip-version-check", "--target", site, joined,
                    *wheels[1:]], check=True)
    share_namespace(site, "nvidia")
    env = {**os.environ, "PYTHONPATH": site}
    done = subprocess.run([sys.executable, "-c", code.replace("SITE", repr(site))],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def _distribution(prefix: str) -> str:
    return next(d.metadata["Name"] for d in importlib.metadata.distributions()
                if (d.metadata["Name"] or "").startswith(prefix))


# A 64x48 JPEG of one colour, as bytes in ``data`` (numpy uint8).
_JPEG = ("import io, numpy as np; from PIL import Image; buf = io.BytesIO(); "
         "Image.new('RGB', (64, 48), (10, 200, 30)).save(buf, 'JPEG'); "
         "data = np.frombuffer(buf.getvalue(), np.uint8)\n")


def test_nvimgcodec_installed_from_parts_decodes_on_its_cpu_backend(tmp_path):
    """The same path as DALI's below, on a real wheel of a quarter its size: nvImageCodec's
    (repacked from this environment's install: 67 MB of files, stored, so two parts), split,
    reassembled byte for byte, installed with pip into a folder of its own and imported from
    there: it decodes a JPEG on its CPU backend. DALI's full-size install is the opt-in
    ``heavy`` test (``make test-heavy``, which CI runs)."""
    pytest.importorskip("nvidia.nvimgcodec")
    wheel = _repack(_distribution("nvidia-nvimgcodec"), str(tmp_path))
    code = (_JPEG + "import nvidia.nvimgcodec as n; assert n.__file__.startswith(SITE)\n"
            "decoder = n.Decoder(device_id=n.NVIMGCODEC_DEVICE_CPU_ONLY, "
            "backends=[n.Backend(n.BackendKind.CPU_ONLY)])\n"
            "print(np.asarray(decoder.decode(data).cpu()).shape)")
    assert _installed_from_parts(tmp_path, [wheel], code) == "(48, 64, 3)"


@pytest.mark.heavy
def test_dali_installed_from_parts_decodes_on_its_cpu_backend(tmp_path):
    """DALI's real wheel (repacked from this environment's install: 476 MB of files) in parts
    of at most 60 MiB, reassembled, checked, installed with pip into a folder of its own beside
    nvImageCodec's wheel (which the bundle carries whole: DALI decodes through it) and imported
    from there: it decodes a JPEG on its CPU backend."""
    pytest.importorskip("nvidia.dali")
    wheel = _repack(_distribution("nvidia-dali-cuda"), str(tmp_path))
    codec = _repack(_distribution("nvidia-nvimgcodec"), str(tmp_path))
    code = (_JPEG + "import nvidia.dali as d; from nvidia.dali import fn, pipeline_def; "
            "import nvidia.nvimgcodec as n; "
            "assert d.__file__.startswith(SITE) and n.__file__.startswith(SITE)\n"
            "@pipeline_def(batch_size=1, num_threads=1, device_id=None)\n"
            "def pipe():\n"
            "    return fn.decoders.image(fn.external_source(source=lambda: [data], batch=True))\n"
            "p = pipe(); p.build(); (out,) = p.run(); print(np.asarray(out[0]).shape)")
    assert _installed_from_parts(tmp_path, [wheel, codec], code) == "(48, 64, 3)"
