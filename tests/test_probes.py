"""The synthetic probes (sptlib.data.probes): structure, answers, determinism, held-out streams."""

import numpy as np
import pytest

from sptlib import vocab
from sptlib.data import probes


def test_associative_recall_answers_come_from_the_pairs():
    opts = dict(num_pairs=16, length=128, key_vocab=64, value_vocab=64)
    d = probes.associative_recall(20, seed=3, **opts)
    info = probes.info("associative_recall", **opts)
    assert info == {"vocab_size": probes.FIRST_ID + 128, "num_classes": 64, "max_length": 128,
                    "scored": 16}
    assert d["inputs"].shape == d["targets"].shape == d["mask"].shape == (20, 128)
    assert d["mask"].all() and d["inputs"].min() >= vocab.NUM_SPECIAL
    assert d["inputs"].max() < info["vocab_size"]
    for x, t in zip(d["inputs"], d["targets"]):
        keys, values = x[0:32:2] - probes.FIRST_ID, x[1:32:2] - probes.FIRST_ID - 64
        assert len(set(keys)) == 16 and keys.max() < 64 and values.min() >= 0
        pairs = dict(zip(keys, values))
        scored = np.flatnonzero(t >= 0)
        assert len(scored) == 16 and scored.min() >= 32  # every key queried once, after the pairs
        assert sorted(x[scored] - probes.FIRST_ID) == sorted(keys)
        for pos in scored:
            assert t[pos] == pairs[x[pos] - probes.FIRST_ID]
        rest = np.setdiff1d(np.arange(32, 128), scored)
        assert (x[rest] == probes.BLANK_ID).all()


def test_selective_copying_targets_are_the_tokens_in_order():
    d = probes.selective_copying(20, length=256, num_tokens=16, data_vocab=16, seed=1)
    assert probes.info("selective_copying", length=256, num_tokens=16, data_vocab=16)[
        "num_classes"] == 16
    for x, t in zip(d["inputs"], d["targets"]):
        ctx = x[:240]
        data = ctx[ctx != probes.BLANK_ID] - probes.FIRST_ID
        assert len(data) == 16
        assert (x[240:] == probes.MARKER_ID).all()
        np.testing.assert_array_equal(t[240:], data)
        assert (t[:240] == -1).all()
    # the tokens sit at different positions in different sequences
    assert len({tuple(np.flatnonzero(x[:240] != probes.BLANK_ID)) for x in d["inputs"]}) == 20


@pytest.mark.parametrize("name", probes.PROBES)
def test_deterministic_prefix_stable_and_held_out_apart(name):
    a = probes.generate(name, 12, seed=5)
    b = probes.generate(name, 30, seed=5)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k][:12])  # a set's first examples: size-independent
    c = probes.generate(name, 12, seed=6)
    h = probes.generate(name, 12, seed=5, held_out=True)
    assert not (a["inputs"] == c["inputs"]).all(axis=1).any()
    assert not (a["inputs"] == h["inputs"]).all(axis=1).any()


def test_sizes_are_checked():
    with pytest.raises(ValueError, match="fit"):
        probes.associative_recall(1, num_pairs=16, length=40)
    with pytest.raises(ValueError, match="key_vocab"):
        probes.associative_recall(1, num_pairs=16, key_vocab=8)
    with pytest.raises(ValueError, match="fit"):
        probes.selective_copying(1, length=20, num_tokens=16)
    with pytest.raises(ValueError, match="unknown probe"):
        probes.generate("copying", 1)
