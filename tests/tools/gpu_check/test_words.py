"""The product's files speak of a GPU host, a time budget, an offline bundle and its steps, not
of a rented machine's limits. What is scanned: every file git lists outside tests/ (code,
docs, the Makefile, the README, the Dockerfile, configs).

Everywhere: the whole words "lease", "borrowed", "lender", "give back", "budget left" in any
spelling (``give_back``, ``budget_left_s``; "the rows a budget left out" is the check's own
English). "calls" and "carry" are ordinary English
elsewhere ("the loop carries the sums", "DALI 2.4 calls a callback", "the first call"), so
there only their rented-machine phrases count: "call 1", "five calls", "calls back to back",
"device calls", ``carry [...]``, ``--carry``, "carried in parts". In the GPU check's own files
(``tools/gpu_check/``, ``docs/gpu-check.md``, and the Makefile's and README's lines about the
GPU check) the whole words call(s) and carry (carries, carried) are out too.
"""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.helpers.paths import REPO

SUFFIXES = (".py", ".md", ".sh", ".txt", ".toml", ".cfg", ".ini", ".yaml", ".yml", ".c", ".h")
NAMES = ("Makefile", "Dockerfile")
ANYWHERE = re.compile(
    r"\b(lease[sd]?|leasing|borrow(ed|ing)?|lender)\b|\bgiv(e|es|ing)[ _]back\b"
    r"|\bbudget[ _]left(?! out)|\b(call|calls) \d|(?<![\d.])\b(one|two|three|four|five|six|seven|"
    r"eight|nine|ten|\d+) calls\b|\bcalls back to back\b|\bdevice calls?\b|\bcarry \["
    r"|--carry\b|\bcarried in parts\b", re.I)
OWN = re.compile(r"\b(calls?|carr(y|ies|ied|ying))\b", re.I)


def product_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [p for p in listed.splitlines() if not p.startswith("tests/")
            and (p.endswith(SUFFIXES) or os.path.basename(p) in NAMES)
            and os.path.isfile(os.path.join(REPO, p))]


def own(path: str, line: str) -> bool:
    """Whether ``line`` of ``path`` is the GPU check's own text."""
    if path.startswith("tools/gpu_check/") or path == "docs/gpu-check.md":
        return True
    return path in ("Makefile", "README.md") and re.search(r"gpu[-_ ]check|gpu-bundle|"
                                                          r"gpu-dry-run", line, re.I) is not None


def words_in(path: str, text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        hit = ANYWHERE.search(line) or (own(path, line) and OWN.search(line))
        if hit:
            found.append(f"{path}:{number}: {hit.group(0)!r} in {line.strip()[:120]}")
    return found


def test_the_products_files_have_no_rented_machine_words():
    if not os.path.isdir(os.path.join(REPO, ".git")) and not os.path.isfile(
            os.path.join(REPO, ".git")):
        pytest.skip("not a git checkout: no list of the product's files")
    found = []
    for path in product_files():
        with open(os.path.join(REPO, path), encoding="utf-8", errors="replace") as f:
            found += words_in(path, f.read())
    assert not found, "\n".join(found)


@pytest.mark.parametrize("path,line,hit", [
    ("docs/x.md", "the lease plan", True), ("docs/x.md", "a borrowed GPU", True),
    ("docs/x.md", "then give_back", True), ("engine/x.py", "budget_left_s of the reply", True),
    ("docs/x.md", "call 1 alone", True), ("docs/x.md", "the five calls", True),
    ("docs/x.md", "calls back to back", True), ("docs/x.md", 'carry [".gpu-bundle"]', True),
    ("Makefile", "gpu-check: ## DALI carried in parts", True),
    ("tools/gpu_check/x.py", "what it calls", True),
    ("README.md", "make gpu-check: calls it", True),
    ("engine/loop.py", "global rank 0 carries them", False),
    ("loaders/feed.py", "DALI 2.4 calls a non-parallel source", False),
    ("decode/libraries.py", "The backend, chosen on first call", False),
    ("README.md", "Presets in configs/ carry the recipes", False),
    ("docs/x.md", "the time budget: 15 minutes, what fits", False),
    ("docs/x.md", "what the time budget left out", False),
    ("docs/x.md", "a release of torch", False),
])
def test_the_scan_catches_the_rented_sense_only(path, line, hit):
    assert bool(words_in(path, line)) is hit
