"""The one decoder module (decode/libraries.py): each library usable here decodes the sample's
JPEGs to the same pixels, keeps pixels as stored (no EXIF orientation), refuses bad bytes in one
line, and falls back when TorchCodec is missing; and benchmarks/decoders/compared.py runs."""
import glob
import io
import os
import subprocess
import sys
import warnings

import pytest
import torch
from PIL import Image

import decode
from benchmarks.decoders import compared
from decode import jpeg, libraries
from loaders.transforms import TrainTransform
from tests.helpers.badcorpus import damaged_variants
from tests.helpers.loading import max_abs_diff
from tests.helpers.paths import REPO

BACKENDS = libraries.backends()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def backend(request):
    """Switch this process to backend ``request.param`` for one test."""
    previous = libraries.use(request.param)
    yield request.param
    libraries.use(previous)


def encode(image: Image.Image, fmt: str = "JPEG", **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def pil_pixels(data: bytes) -> torch.Tensor:
    """The stored pixels as PIL decodes them (no EXIF orientation): uint8 (3, H, W)."""
    with Image.open(io.BytesIO(data)) as img:
        rgb = img.convert("RGB")
    return torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8).view(
        rgb.height, rgb.width, 3).permute(2, 0, 1)


def assert_close(a: torch.Tensor, b: torch.Tensor, levels: int = 1):
    assert a.shape == b.shape and a.dtype == b.dtype == torch.uint8
    assert max_abs_diff(a, b) <= levels


def test_torchcodec_is_the_default_where_installed():
    name = libraries.decoder_name()
    assert "\n" not in name
    if "torchcodec" in BACKENDS and not os.environ.get(libraries.ENV_VAR):
        assert name.startswith("TorchCodec ")
    assert "torchvision" in BACKENDS and "PIL" in BACKENDS  # requirements.txt brings both


@pytest.fixture(scope="module")
def sample_jpegs(sample_images):
    """The sample's JPEGs (the real sample's 250, else the stand-in's 64) and torchvision's
    decodes of them (the loaders' decoder before TorchCodec), uint8 (3, H, W)."""
    blobs = []
    for path in sorted(glob.glob(f"{sample_images}/train/*/*.JPEG")):
        with open(path, "rb") as f:
            blobs.append(f.read())
    previous = libraries.use("torchvision")
    try:
        return blobs, [libraries.decode_jpeg(b) for b in blobs]
    finally:
        libraries.use(previous)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_sample_decodes_like_torchvision_within_one_level(sample_jpegs, backend):
    """Every library's pixels are within 1 intensity level of torchvision's libjpeg-turbo
    (IDCT rounding may differ between libjpeg-turbo builds)."""
    blobs, reference = sample_jpegs
    assert len(blobs) in (250, 64)  # the real sample, or the stand-in
    for data, ref in zip(blobs, reference):
        assert_close(libraries.decode_jpeg(data), ref)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_not_applied(backend, orientation):
    """Pixels as stored, as PIL, DALI (adjust_orientation=False) and the window decoder give
    them; TorchCodec would rotate these 64 x 48 images without the APP1 / eXIf cut."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    image = Image.effect_noise((64, 48), 64).convert("RGB")
    for fmt in ("JPEG", "PNG"):
        data = encode(image, fmt, exif=exif.tobytes())
        decoded = (libraries.decode_jpeg if fmt == "JPEG" else libraries.decode_image)(data)
        assert_close(decoded, pil_pixels(data), levels=0 if fmt == "PNG" else 1)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_other_formats_and_modes_come_out_rgb_uint8(backend):
    noise = Image.effect_noise((40, 30), 64)
    cases = {"gray": encode(noise.convert("L")), "progressive": encode(
        noise.convert("RGB"), progressive=True), "cmyk": encode(Image.new("CMYK", (40, 30)))}
    for name, data in cases.items():
        assert libraries.decode_jpeg(data).shape == (3, 30, 40), name
    assert_close(libraries.decode_jpeg(cases["gray"]), pil_pixels(cases["gray"]))
    frames = [Image.new("P", (40, 30), i) for i in range(3)]
    images = {"png rgba": encode(noise.convert("RGBA"), "PNG"),
              "png 16-bit": encode(noise.convert("I;16"), "PNG"),
              "animated gif": encode(frames[0], "GIF", save_all=True, append_images=frames[1:])}
    for name, data in images.items():
        out = libraries.decode_image(data)
        assert out.shape == (3, 30, 40) and out.dtype == torch.uint8, name


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_bad_bytes_are_one_line_runtime_errors(backend):
    good = encode(Image.effect_noise((64, 64), 64).convert("RGB"))
    for data in (good[:len(good) // 2], good[:200], b"<html>not an image</html>", b""):
        for decoder in (libraries.decode_jpeg, libraries.decode_image):
            with pytest.raises(RuntimeError) as info:
                decoder(data)
            message = str(info.value)
            assert message and "\n" not in message and ".cpp:" not in message


def test_torchvision_fallback_does_not_warn():
    """torchvision 0.29 deprecates its decoders; the fallback silences that warning only."""
    previous = libraries.use("torchvision")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            image = libraries.decode_jpeg(encode(Image.new("RGB", (16, 16))))
    finally:
        libraries.use(previous)
    assert [str(w.message) for w in caught] == []
    assert image.shape == (3, 16, 16) and image.dtype == torch.uint8


def test_without_torchcodec_torchvision_is_chosen_and_the_log_says_why(monkeypatch):
    def missing():
        raise ImportError("No module named 'torchcodec'")

    monkeypatch.setitem(libraries._FACTORIES, "torchcodec", missing)
    monkeypatch.setattr(libraries, "_backend", None)
    monkeypatch.setattr(libraries, "_skipped", {})
    assert libraries.decoder_name() == (
        f"torchvision {libraries._version('torchvision')} "
        "(torchcodec: No module named 'torchcodec')")
    assert libraries.decode_jpeg(encode(Image.new("RGB", (8, 8)))).shape == (3, 8, 8)


def run_python(code: str, **env) -> str:
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=120, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.slow
def test_environment_variables_choose_the_decoders():
    code = ("import decode as d; print(d.decoder_name()); "
            "print(d.crop_decoder_status())")
    name, status = run_python(code, IMAGENET_FAST_DECODER="torchvision",
                              IMAGENET_FAST_FULL_DECODE="1").splitlines()
    assert name.startswith("torchvision ")
    assert status == "crop windows: whole JPEGs decoded (IMAGENET_FAST_FULL_DECODE=1)"
    name = run_python(code, IMAGENET_FAST_DECODER="nonsense").splitlines()[0]
    assert "nonsense: unknown IMAGENET_FAST_DECODER" in name
    with pytest.raises(ValueError):
        libraries.use("nonsense")


def test_crop_decoder_status_is_one_line():
    status = decode.crop_decoder_status()
    assert "\n" not in status and status.startswith("crop windows: ")
    if jpeg.window.available():
        assert "nvImageCodec" in status
        assert status.endswith("(crop + scale in one decode, decode/jpeg/_jpegcrop.so)"
                               if jpeg.region.available() else
                               "(PIL draft; crop + scale: off (decode/jpeg/_jpegcrop.so not built "
                               "(make install builds it)))")


def test_without_nvimgcodec_training_decodes_whole_images(monkeypatch, sample_images):
    """A wheel-only install without nvImageCodec: one status line, same training crops."""
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)  # import fails
    jpeg.window.set_enabled(True)
    try:
        assert not jpeg.window.available()
        assert decode.crop_decoder_status().startswith(
            "crop windows: whole JPEGs decoded (nvImageCodec not usable (")
        data = open(sorted(glob.glob(f"{sample_images}/train/*/*.JPEG"))[0], "rb").read()
        assert decode.window_size(data) is None
        assert TrainTransform(64)(data).shape == (3, 64, 64)
    finally:
        monkeypatch.undo()
        jpeg.window.set_enabled(True)


def test_decoders_compared_prints_both_tables(tiny, capsys):
    assert compared.main_cli(["--data", tiny.root, "--rounds", "1", "--repeats", "1",
                                      "--jpegcrop-so", os.path.join(tiny.root, "missing.so")]) == 0
    out = capsys.readouterr().out
    assert "Whole images" in out and "Crop windows" in out
    for row in ("torchvision", "whole decode + crop", "_jpegcrop.c (former)", "PyTurboJPEG",
                "_jpegcrop.so at 1/1"):
        assert row in out
    luma = next(line for line in out.splitlines() if " luma " in line)
    assert float(luma.split()[-6]) > 0  # decode_jpeg_luma's median CPU ms per image
    if jpeg.window.available():
        line = next(line for line in out.splitlines() if "nvImageCodec CPU" in line)
        assert float(line.split()[-7]) > 0  # its median CPU ms per image
    if jpeg.region.available():  # the same pixels as a whole decode's crop
        line = next(line for line in out.splitlines() if "_jpegcrop.so at 1/1" in line)
        assert line.split()[-4:-1] == ["0", "|", "0.0000"], line


def test_decoders_compared_bad_data_is_one_line(tmp_path, capsys):
    assert compared.main_cli(["--data", str(tmp_path)]) == 1
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_loader_transforms_match_across_decoders(sample_jpegs, backend):
    """The training and validation transforms the loaders run (whole-image path for training:
    crop windows off) give the same pixels, within 1 level, with every library."""
    from loaders.transforms import ValTransform

    blobs, _ = sample_jpegs
    jpeg.window.set_enabled(False)
    try:
        outputs = []
        for use in ("torchvision", backend):
            libraries.use(use)
            torch.manual_seed(0)
            outputs.append([(TrainTransform(96)(b), ValTransform(128, 112)(b)) for b in blobs[:60]])
    finally:
        jpeg.window.set_enabled(True)
    for (train_a, val_a), (train_b, val_b) in zip(*outputs):
        assert_close(train_a, train_b)
        assert_close(val_a, val_b)


def outcome(decode, data: bytes) -> str:
    """``"ok"``, or the one-line error of ``decode(data)``."""
    try:
        decode(data)
        return "ok"
    except RuntimeError as exc:
        return str(exc)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_luma_decode_refuses_exactly_what_the_rgb_decode_refuses(sample_jpegs, backend):
    """The converter's check decodes luma only (decode_jpeg_luma); on damaged JPEGs it
    refuses the same files, with the same message, as the loaders' RGB decode_jpeg."""
    blobs, _ = sample_jpegs
    refused = 0
    for data in blobs[:80] + damaged_variants(blobs[:80]):
        rgb, luma = outcome(libraries.decode_jpeg, data), outcome(libraries.decode_jpeg_luma, data)
        assert rgb == luma
        refused += rgb != "ok"
    assert refused >= 150  # of 560 variants: the error paths are exercised


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_luma_decode_is_the_y_plane(sample_jpegs, backend):
    """uint8 (1, H, W), within 1 level of torchvision's, and the luma (ITU-R BT.601) of the
    RGB decode up to rounding (its chroma upsampling and clamping never touch Y)."""
    blobs, reference = sample_jpegs
    previous = libraries.use("torchvision")
    try:
        expected = [libraries.decode_jpeg_luma(b) for b in blobs[:40]]
    finally:
        libraries.use(previous)
    weights = torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)
    for data, ref, rgb in zip(blobs[:40], expected, reference[:40]):
        luma = libraries.decode_jpeg_luma(data)
        assert_close(luma, ref)
        y_of_rgb = (rgb.float() * weights).sum(0, keepdim=True)
        assert (luma.float() - y_of_rgb).abs().mean() < 1.0
