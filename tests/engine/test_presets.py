"""Every preset in configs/ says what it is for and how to run it, and the LMDB presets differ
from their JPEG-folder twins only in the loader (so the two runs compare data loading)."""
from __future__ import annotations

import os

import pytest
import yaml

import main
from engine.settings import resolve_backend
from tests.helpers.paths import REPO

CONFIGS = os.path.join(REPO, "configs")
PRESETS = sorted(f for f in os.listdir(CONFIGS) if f.endswith(".yaml"))


@pytest.mark.parametrize("name", PRESETS)
def test_preset_header_names_its_purpose_and_command(name):
    with open(os.path.join(CONFIGS, name)) as f:
        lines = f.read().splitlines()
    header = []
    for line in lines:
        if not line.startswith("#"):
            break
        header.append(line)
    assert header, f"configs/{name}: no comment at the top"
    assert any(f"python main.py -c configs/{name}" in line for line in header), \
        f"configs/{name}: the header does not show the command that runs it"


@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_lmdb_preset_is_the_folder_preset_with_another_loader(arch):
    def load(name):
        with open(os.path.join(CONFIGS, name)) as f:
            return yaml.safe_load(f)

    folder, lmdb = load(f"{arch}.yaml"), load(f"{arch}-lmdb.yaml")
    assert folder.pop("loader") == "folder" and lmdb.pop("loader") == "lmdb"
    assert folder == lmdb
    args = main.parse_args(["-c", os.path.join(CONFIGS, f"{arch}-lmdb.yaml"), "/data"])
    assert (args.arch, resolve_backend(args)[0]) == (arch, "lmdb")
    args = main.parse_args(["-c", os.path.join(CONFIGS, f"{arch}.yaml"), "/data"])
    assert (args.arch, resolve_backend(args)[0]) == (arch, "folder")
