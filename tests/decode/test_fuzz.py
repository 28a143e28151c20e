"""Fuzzing the decoders: mutated JPEGs and PNGs (``tests/helpers/fuzz.py``: truncations, bit
flips in the header and the scan, zeroed blocks, frame-size edits, marker garbage; from
generated images always, from the real sample where present) through the acceptance rule and
every decoder of the cascade, in a child process: each case decodes or is refused cleanly,
no signal, no hang, and no case takes more memory than its frame's pixels allow.

``IMAGENET_FUZZ_SEED`` and ``IMAGENET_FUZZ_CASES`` rerun another corpus (a failure names the
case's file, kept in the test's ``tmp_path``, and the seed); the ``heavy`` marker runs 3,000
cases (``make test-heavy``)."""
import os
from collections import Counter

import pytest

from tests.helpers.fuzz import make_corpus, run_child
from tests.helpers.paths import SAMPLE

SEED = int(os.environ.get("IMAGENET_FUZZ_SEED", "0"))
CASES = int(os.environ.get("IMAGENET_FUZZ_CASES", "300"))
# A case may take this much memory above its start: a decoder's working set (libraries, the
# batch decoder's buffers) plus a few copies of the frame's RGB pixels.
BASE_MIB, BYTES_PER_PIXEL = 160, 16


def _fuzz(folder: str, count: int, seed: int) -> None:
    sample = SAMPLE if os.path.isdir(os.path.join(SAMPLE, "train")) else None
    paths = make_corpus(folder, count, seed, sample)
    result = run_child(folder, paths)
    where = f"(seed {seed}, {count} cases, corpus in {folder})"
    assert not result.problems, f"{len(result.problems)} failures {where}:\n" + "\n".join(
        result.problems[:20])
    assert sorted(result.outcomes) == list(range(count)), where
    heavy = [f"{paths[i]}: {peak:.0f} MiB for {pixels:,} pixels"
             for i, (peak, pixels) in result.peaks.items()
             if peak > BASE_MIB + BYTES_PER_PIXEL * pixels / 2**20]
    assert not heavy, f"over the memory bound {where}:\n" + "\n".join(heavy[:20])
    counts = Counter(result.outcomes.values())
    assert counts["refused"] and counts["decoded"], counts  # both ways are exercised
    print(f"fuzz seed {seed}: {count} cases in {result.seconds:.1f} s: {dict(counts)}, "
          f"largest peak {max(p for p, _ in result.peaks.values()):.0f} MiB")


@pytest.mark.slow
def test_every_decoder_decodes_or_refuses_each_mutated_image(tmp_path):
    _fuzz(str(tmp_path / "corpus"), CASES, SEED)


@pytest.mark.heavy
def test_long_fuzz_run(tmp_path):
    _fuzz(str(tmp_path / "corpus"), 3000, SEED + 1)
