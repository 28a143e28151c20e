"""Without DALI installed, ``--dali`` ends with one line naming the pip package, and nothing
else (``--help``, the other backends) needs DALI. Runs whether or not DALI is installed."""
import subprocess
import sys

import main
from tests.conftest import REPO


def test_dali_missing_gives_one_line_error(tiny, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # makes `import nvidia.dali` fail
    assert main.cli(["--dali", tiny.root, "--epochs", "1", "-j", "0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install nvidia-dali-cuda120" in err[0]


def test_help_and_backend_module_import_without_dali():
    block = ("import sys; sys.modules['nvidia.dali'] = None; import loaders.dali, main; "
             "main.get_args_parser().format_help(); assert 'nvidia.dali' not in "
             "[m for m in sys.modules if sys.modules[m] is not None]")
    subprocess.run([sys.executable, "-c", block], cwd=REPO, check=True, timeout=120)
