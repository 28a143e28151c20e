"""The documentation stays navigable: every relative link in README.md and docs/*.md resolves
(the file exists; a ``#anchor`` names a heading of its target, by GitHub's slug rules), every
``make TARGET`` named there is a Makefile target, and the README stays a short user's
guide."""
from __future__ import annotations

import glob
import os
import re
from urllib.parse import unquote

import pytest

from tests.helpers.paths import REPO

README_MAX_LINES = 300
PAGES = sorted([os.path.join(REPO, "README.md")]
               + glob.glob(os.path.join(REPO, "docs", "*.md")))

FENCE = re.compile(r"^(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target), target without spaces, optional "title"
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
MAKE_TARGET = re.compile(r"\bmake\s+((?:[A-Z_]+=\S*\s+)*)([a-z][a-z0-9-]*)\b")


def rel(path: str) -> str:
    return os.path.relpath(path, REPO)


def lines_with_fences(path: str):
    """``(number, line, fenced)`` for each line but the fences themselves."""
    fenced = False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if FENCE.match(line.lstrip()):
                fenced = not fenced
            else:
                yield number, line, fenced


def prose_lines(path: str):
    """``(number, line)`` of the lines outside fenced code blocks."""
    return ((number, line) for number, line, fenced in lines_with_fences(path) if not fenced)


def code_lines(path: str):
    """``(number, line)`` of the lines inside fenced code blocks, and inline code spans."""
    for number, line, fenced in lines_with_fences(path):
        if fenced:
            yield number, line
        else:
            for match in INLINE_CODE.finditer(line):
                yield number, match.group(2)


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: the rendered text (code spans, emphasis and link
    markup removed), lower-cased, every character that is not a letter, digit, space, ``-`` or
    ``_`` dropped, spaces turned into ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    # code spans keep their text as is; elsewhere emphasis markers go (not snake_case's "_")
    parts = re.split(r"(`+[^`]*`+)", text)
    text = "".join(part.strip("`") if part.startswith("`")
                   else re.sub(r"\*+|(?<!\w)_+|_+(?!\w)", "", part) for part in parts)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
    """Every heading anchor of a markdown file, duplicates numbered ``-1``, ``-2``, ... as
    GitHub does."""
    seen: dict[str, int] = {}
    result = set()
    for _, line in prose_lines(path):
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def relative_links(path: str):
    """``(line number, target)`` of every link in ``path`` that is not a URL (``scheme:``)."""
    for number, line in prose_lines(path):
        text = INLINE_CODE.sub("", line)
        targets = [m.group(1) for m in LINK.finditer(text)]
        definition = REFERENCE_DEF.match(text)
        if definition:
            targets.append(definition.group(1))
        for target in targets:
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue  # https:, mailto:, ...
            yield number, target


def makefile_targets() -> set[str]:
    """The Makefile's rule names (``name:`` at the start of a line, not ``:=`` assignments)."""
    targets = set()
    with open(os.path.join(REPO, "Makefile"), encoding="utf-8") as f:
        for line in f:
            match = re.match(r"^([A-Za-z0-9_.-][A-Za-z0-9_. -]*?):(?!=)", line)
            if match:
                targets.update(match.group(1).split())
    return targets


def test_the_pages_exist():
    names = [rel(p) for p in PAGES]
    assert "README.md" in names and len(names) > 1, names


def test_relative_links_resolve():
    """One failure listing every broken link of every page: a missing file once, with where it
    is linked from; a missing anchor once per link."""
    missing: dict[str, list[str]] = {}
    problems = []
    for page in PAGES:
        for number, target in relative_links(page):
            path, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(page), unquote(path))) \
                if path else page
            where = f"{rel(page)}:{number}"
            if not os.path.exists(resolved):
                missing.setdefault(rel(resolved), []).append(where)
            elif anchor and (not resolved.endswith(".md") or os.path.isdir(resolved)):
                problems.append(f"{where}: {target}: an anchor into a file that is not markdown")
            elif anchor and unquote(anchor).lower() not in anchors(resolved):
                problems.append(f"{where}: {target}: no heading with anchor #{anchor} in "
                                f"{rel(resolved)}")
    problems += [f"{name} does not exist (linked from {', '.join(sources)})"
                 for name, sources in sorted(missing.items())]
    assert not problems, "broken links:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_make_targets_named_exist(page):
    targets = makefile_targets()
    unknown = [f"{rel(page)}:{number}: make {match.group(2)}"
               for number, text in code_lines(page)
               for match in MAKE_TARGET.finditer(text)
               if match.group(2) not in targets]
    assert not unknown, "not Makefile targets:\n" + "\n".join(unknown)


def test_readme_is_a_short_guide():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_the_checks_themselves():
    """The slug rules, link and target parsing on known cases (GitHub's own anchors)."""
    assert github_slug("DALI loader (`loaders/dali.py`)") == "dali-loader-loadersdalipy"
    assert github_slug("LMDB larger than RAM: block order") == "lmdb-larger-than-ram-block-order"
    assert github_slug("1. ImageNet in class folders") == "1-imagenet-in-class-folders"
    assert github_slug("What `make docker-run` runs") == "what-make-docker-run-runs"
    assert github_slug("`--lmdb_order` and *emphasis*") == "--lmdb_order-and-emphasis"
    assert github_slug("`__init__.py` and _this_") == "__init__py-and-this"
    assert {"help", "gpu-check", "convert-imagenet"} <= makefile_targets()
    assert "PYTHON" not in makefile_targets() and "STAMP" not in makefile_targets()
    found = [m.group(2) for m in MAKE_TARGET.finditer(
        "make convert-imagenet IMAGENET=/x OUT=/y; make DATA=/d bench; make install")]
    assert found == ["convert-imagenet", "bench", "install"]
