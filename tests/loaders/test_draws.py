"""loaders.draws: the streams every random draw comes from stay the ones runs and checkpoints
were made with (NumPy's SeedSequence of the seed as a 64-bit word and the keys)."""
import numpy as np
import pytest

from loaders.draws import keyed_rng, seed_sequence


@pytest.mark.parametrize("seed", [0, 1, -1, 2**63, -(2**40), 2**64 - 1])
@pytest.mark.parametrize("keys", [(0,), (3, 1), (2, 0, 7), (1, 2, 3, 4, 0x45524153)])
def test_the_streams_are_numpys_seed_sequence_of_the_keys(seed, keys):
    word = seed % 2**64
    assert np.array_equal(keyed_rng(seed, *keys).random(8),
                          np.random.default_rng([word, *keys]).random(8))
    assert np.array_equal(seed_sequence(seed, *keys).generate_state(2, np.uint64),
                          np.random.SeedSequence([word, *keys]).generate_state(2, np.uint64))


def test_no_two_key_tuples_share_a_stream():
    # seed * K + epoch schemes collide: (1, 0) and (0, K) would draw alike
    tuples = [(s, e, r) for s in range(3) for e in range(3) for r in range(3)]
    firsts = {float(keyed_rng(s, e, r).random()) for s, e, r in tuples}
    assert len(firsts) == len(tuples)
