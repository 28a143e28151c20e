"""Without DALI installed, ``--dali`` ends with one line naming the pip package, and nothing
else (``--help``, the other backends) needs DALI; the package named, and the one a wrong DALI
wheel is replaced by, follows torch's CUDA major. Runs whether or not DALI is installed."""
import subprocess
import sys

import pytest
import torch

import main
from loaders import DataError
from loaders.pipelines.dali import check_dali_wheel, dali_pip_package
from tests.helpers.paths import REPO


def test_dali_missing_gives_one_line_error(tiny, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # makes `import nvidia.dali` fail
    assert main.cli(["--dali", tiny.root, "--epochs", "1", "-j", "0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"pip install {dali_pip_package(torch.version.cuda)}" in err[0]


@pytest.mark.parametrize("cuda,wheel", [("12.8", "nvidia-dali-cuda120"),
                                        ("12.4", "nvidia-dali-cuda120"),
                                        ("13.0", "nvidia-dali-cuda130"),
                                        (None, "nvidia-dali-cuda130")])
def test_pip_package_follows_torch_cuda_major(cuda, wheel):
    assert dali_pip_package(cuda) == wheel


def test_dali_wheel_for_another_cuda_major_is_one_data_error():
    with pytest.raises(DataError, match=r"nvidia-dali-cuda120 is built for another CUDA major "
                       r"than torch's 13\.0: pip uninstall -y nvidia-dali-cuda120 "
                       r"nvidia-dali-cuda130 && pip install nvidia-dali-cuda130$"):
        check_dali_wheel("13.0", ["torch", "nvidia-dali-cuda120", "nvidia-nvjpeg-cu12"])
    with pytest.raises(DataError, match="pip install nvidia-dali-cuda120$"):
        check_dali_wheel("12.8", ["nvidia_dali_nightly_cuda130"])  # names as some tools spell them
    # Matching majors, CUDA's own cu12 libraries, or a torch without CUDA: nothing to say.
    check_dali_wheel("13.0", ["nvidia-dali-cuda130", "nvidia-nvimgcodec-cu12"])
    check_dali_wheel("12.1", ["nvidia-dali-weekly-cuda120"])
    check_dali_wheel(None, ["nvidia-dali-cuda120"])


def test_help_and_backend_module_import_without_dali():
    block = ("import sys; sys.modules['nvidia.dali'] = None; import loaders.pipelines.dali, main; "
             "main.get_args_parser().format_help(); assert 'nvidia.dali' not in "
             "[m for m in sys.modules if sys.modules[m] is not None]")
    result = subprocess.run([sys.executable, "-c", block], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
