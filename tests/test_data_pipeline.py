"""Grain pipeline: determinism, per-epoch reshuffling, state save/restore, sharding, eval padding,
nested data fractions. Each example's label is its id, so batches reveal exactly what was read."""

import numpy as np
import pytest

from sptlib.data import pipeline, sources


def id_source(n, max_length=8):
    seqs = [np.full(1 + i % max_length, 2 + i % 5) for i in range(n)]
    return sources.TokenSource(seqs, np.arange(n), max_length)


def ids(batches):
    return [int(x) for b in batches for x, m in zip(b["label"], b["example_mask"]) if m]


def take(it, k):
    return [next(it) for _ in range(k)]


def test_same_seed_same_order_and_fresh_epochs():
    src = id_source(20)
    mk = lambda seed: pipeline.make_iterator(src, batch_size=5, seed=seed, shuffle=True)  # noqa
    a, b, c = ids(take(mk(1), 12)), ids(take(mk(1), 12)), ids(take(mk(2), 12))
    assert a == b and a != c
    epochs = [a[i:i + 20] for i in range(0, 60, 20)]
    assert all(sorted(e) == list(range(20)) for e in epochs)  # each epoch a permutation
    assert epochs[0] != epochs[1] != epochs[2]  # a fresh order every epoch
    assert epochs[0] != list(range(20))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_state_restore_gives_identical_batches(num_workers):
    src = id_source(23)
    mk = lambda: pipeline.make_iterator(src, batch_size=4, seed=7, shuffle=True,  # noqa
                                        num_workers=num_workers)
    it = mk()
    take(it, 9)  # crosses the epoch boundary (23 examples)
    state = it.get_state()
    expected = take(it, 6)
    it2 = mk()
    it2.set_state(state)
    got = take(it2, 6)
    for e, g in zip(expected, got):
        for k in e:
            np.testing.assert_array_equal(e[k], g[k])


def test_shards_disjoint_and_covering_with_equal_eval_steps():
    src = id_source(23)
    per_shard = []
    for s in range(3):
        bs = list(pipeline.make_iterator(src, batch_size=4, seed=0, shuffle=False, shard_index=s,
                                         shard_count=3, num_epochs=1, drop_remainder=False))
        assert len(bs) == 2  # ceil(ceil(23 / 3) / 4): the same number of steps on every shard
        assert all(b["inputs"].shape == (4, 8) for b in bs)
        per_shard.append(ids(bs))
    flat = sum(per_shard, [])
    assert sorted(flat) == list(range(23)) and len(set(flat)) == 23
    # Training shards (shuffled) are disjoint too.
    seen = [set(ids(take(pipeline.make_iterator(src, batch_size=3, seed=1, shuffle=True,
                                                 shard_index=s, shard_count=2), 4)))
            for s in range(2)]
    assert not seen[0] & seen[1]


def test_eval_padding_fillers():
    src = id_source(10, max_length=6)
    bs = list(pipeline.make_iterator(src, batch_size=4, seed=0, shuffle=False, num_epochs=1,
                                     drop_remainder=False))
    assert [b["example_mask"].tolist() for b in bs][-1] == [True, True, False, False]
    last = bs[-1]
    assert not last["mask"][2:].any() and (last["inputs"][2:] == 0).all()
    assert ids(bs) == list(range(10))
    # drop_remainder=True drops the partial batch instead.
    bs = list(pipeline.make_iterator(src, batch_size=4, seed=0, shuffle=False, num_epochs=1))
    assert len(bs) == 2 and all(b["example_mask"].all() for b in bs)


def test_nested_fractions():
    full = set(pipeline.nested_subset(1000, 1.0, 0).tolist())
    f5 = set(pipeline.nested_subset(1000, 0.05, 0).tolist())
    f1 = set(pipeline.nested_subset(1000, 0.01, 0).tolist())
    assert len(f1) == 10 and len(f5) == 50 and len(full) == 1000
    assert f1 < f5 < full
    assert f5 != set(range(50))  # a random subset, not a prefix
    assert set(pipeline.nested_subset(1000, 0.05, 1).tolist()) != f5
    with pytest.raises(ValueError):
        pipeline.nested_subset(10, 0.0, 0)


def test_truncation_counted_and_applied():
    src = sources.TokenSource([np.arange(2, 12), np.arange(2, 5)], [0, 1], max_length=6)
    assert src.num_truncated == 1
    np.testing.assert_array_equal(src[0]["inputs"], np.arange(2, 8))
    assert src[1]["mask"].tolist() == [True] * 3 + [False] * 3
