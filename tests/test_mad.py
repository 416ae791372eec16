"""The MAD suite, MQAR and induction heads (sptlib.data.mad): every answer present and unique, no
pair overwritten, splits apart, sizes refused in one line. The checkers are plain loops over one
sequence at a time (the generators are vectorised), and each is shown to catch a broken sequence."""

import numpy as np
import pytest

from sptlib.data import get_task, data_config, mad, probes, task_info

F = mad.FIRST_ID


def _recall_violations(x, t, K, V):
    """Problems of one in-context-recall sequence: a scored key with no earlier occurrence, an
    answer that is not the value its earlier occurrences carried, a key whose value changed
    (overwritten), a repeated key left unscored."""
    out, seen = [], {}
    for p in range(0, len(x), 2):
        k, v = int(x[p]), int(x[p + 1])
        if not (F <= k < F + K):  # noise pair
            if t[p] >= 0:
                out.append(f"noise scored at {p}")
            continue
        if k in seen and seen[k] != v:
            out.append(f"key {k} overwritten at {p}")
        if k in seen and t[p] != seen[k] - F - K:
            out.append(f"answer at {p}: {t[p]} != {seen[k] - F - K}")
        if k not in seen and t[p] >= 0:
            out.append(f"first occurrence scored at {p}")
        seen.setdefault(k, v)
    if (t[1::2] >= 0).any():
        out.append("a value position scored")
    return out


@pytest.mark.parametrize("name,opts", [
    ("mad_in_context_recall", dict(length=128, vocab_size=16)),
    ("mad_in_context_recall", dict(length=64, vocab_size=128)),
    ("mad_noisy_recall", dict(length=128, vocab_size=32, noise_vocab=16, frac_noise=0.6))])
def test_recall_answers_present_unique_never_overwritten(name, opts):
    d = probes.generate(name, 150, seed=2, **opts)
    K = (opts["vocab_size"] - opts.get("noise_vocab", 0)) // 2
    V = opts["vocab_size"] - opts.get("noise_vocab", 0) - K
    info = probes.info(name, **opts)
    assert d["inputs"].max() < info["vocab_size"] and info["num_classes"] == V
    for x, t in zip(d["inputs"], d["targets"]):
        assert _recall_violations(x, t, K, V) == []
        assert (t >= 0).any()  # the last pair always repeats a key
    if opts.get("frac_noise"):
        noise = d["inputs"][:, 0::2] >= F + K + V
        assert abs(noise.mean() - opts["frac_noise"]) < 0.05


def test_recall_checker_catches_an_overwritten_pair():
    d = probes.generate("mad_in_context_recall", 1, seed=0, length=32, vocab_size=16)
    x, t = d["inputs"][0].copy(), d["targets"][0]
    p = int(np.flatnonzero(t >= 0)[-1])
    x[p + 1] = F + 8 + (x[p + 1] - F - 8 + 1) % 8  # the repeated key now carries another value
    assert any("overwritten" in v for v in _recall_violations(x, t, 8, 8))


def _fuzzy_pairs(x, K):
    """(key motif, value motif, start) of one fuzzy sequence, split where the vocabulary changes."""
    toks = [int(v) for v in x if v != mad.BLANK_ID]
    start = len(x) - len(toks)
    pairs, i = [], 0
    while i < len(toks):
        j = i
        while j < len(toks) and toks[j] < F + K:
            j += 1
        k = j
        while k < len(toks) and toks[k] >= F + K:
            k += 1
        pairs.append((tuple(toks[i:j]), tuple(toks[j:k]), start + i))
        i = k
    return pairs


def test_fuzzy_recall_motifs_fixed_and_every_value_token_answered():
    opts = dict(length=128, vocab_size=16, motif_size=3)
    d = probes.generate("mad_fuzzy_recall", 80, seed=1, **opts)
    K = 8
    sizes = set()
    for x, t in zip(d["inputs"], d["targets"]):
        want = np.full(len(x), -1)
        seen = {}
        pairs = _fuzzy_pairs(x, K)
        for key, val, start in pairs:
            assert 1 <= len(key) <= 3 and 1 <= len(val) <= 3 and len(set(key)) == len(key)
            sizes.add((len(key), len(val)))
            assert seen.setdefault(key, val) == val  # never overwritten
            if key in seen and (key, val, start) != next(p for p in pairs if p[0] == key):
                first = start + len(key) - 1
                want[first:first + len(val)] = np.array(val) - F - K
        np.testing.assert_array_equal(t, want)
        assert (t >= 0).any()
    assert len(sizes) == 9  # every key and value motif size occurs


def test_mqar_pairs_distinct_each_key_queried_once_power_law():
    opts = dict(length=128, num_pairs=16, vocab_size=64, power_a=0.01)
    d = probes.generate("mqar", 200, seed=4, **opts)
    gaps = []
    for x, t in zip(d["inputs"], d["targets"]):
        keys, values = x[0:32:2], x[1:32:2]
        assert len(set(keys)) == 16 and len(set(values)) == 16  # nothing overwritten
        assert keys.max() < F + 32 <= values.min()
        pairs = dict(zip(keys, values))
        q = np.flatnonzero(t >= 0)
        assert sorted(x[q]) == sorted(keys) and q.min() >= 32 and ((q - 32) % 2 == 0).all()
        for pos in q:
            assert t[pos] == pairs[x[pos]] - F - 32
        rest = np.setdiff1d(np.arange(32, 128), q)
        assert (x[rest] == mad.BLANK_ID).all()  # no filler can pose as a query
        gaps += list((q - 32) // 2)
    # Inclusion frequency of each gap against numpy's successive sampling without replacement
    # with the same probabilities (zoology's np.random.choice(..., replace=False, p=p)).
    space = 48
    p = np.arange(1, space + 1) ** (0.01 - 1.0)
    p /= p.sum()
    rng = np.random.default_rng(0)
    ref = np.bincount(np.concatenate([rng.choice(space, 16, replace=False, p=p)
                                      for _ in range(2000)]), minlength=space) / 2000
    many = probes.generate("mqar", 2000, seed=4, **opts)["targets"]
    got = np.bincount((np.nonzero(many >= 0)[1] - 32) // 2, minlength=space) / 2000
    assert np.abs(got - ref).max() < 0.05 and got[0] > 0.9 and got[-1] < 0.3
    uniform = probes.generate("mqar", 2000, seed=4, **dict(opts, power_a=1.0))["targets"]
    ug = np.bincount((np.nonzero(uniform >= 0)[1] - 32) // 2, minlength=space) / 2000
    assert np.abs(ug - 16 / 48).max() < 0.05


def test_memorization_one_map_for_every_sequence_and_split():
    opts = dict(length=32, vocab_size=64, kv_map_seed=7)
    table = mad.memorization_map(64, 7)
    assert len(set(table)) == 32
    for split in (False, probes.VALIDATION_TAG, True):
        d = probes.generate("mad_memorization", 50, seed=0, held_out=split, **opts)
        keys = d["inputs"][:, 0::2] - F
        assert (d["inputs"][:, 1::2] == mad.MARKER_ID).all()
        np.testing.assert_array_equal(d["targets"][:, 1::2], table[keys])
        assert (d["targets"][:, 0::2] == -1).all()


def test_compression_selective_copying_and_induction_heads_answers():
    d = probes.generate("mad_compression", 20, seed=0, length=32, vocab_size=16)
    np.testing.assert_array_equal(d["targets"][:, 16:], d["inputs"][:, :16] - F)
    assert (d["inputs"][:, 16] == mad.MARKER_ID).all() and (d["targets"][:, :16] == -1).all()
    s = probes.generate("mad_selective_copying", 5, seed=0, length=64, num_tokens=8, vocab_size=8)
    ref = probes.selective_copying(5, length=64, num_tokens=8, data_vocab=8, seed=0)
    np.testing.assert_array_equal(s["inputs"], ref["inputs"])
    h = probes.generate("induction_heads", 100, seed=3, length=32, vocab_size=8)
    for x, t in zip(h["inputs"], h["targets"]):
        at = np.flatnonzero(x == mad.MARKER_ID)
        assert len(at) == 2 and at[1] == 31 and at[0] < 30  # the answer is unique
        assert t[31] == x[at[0] + 1] - F and (t[:31] == -1).all()


@pytest.mark.parametrize("name", mad.PROBES)
def test_splits_never_overlap_and_prefix_stable(name):
    sets = {tag: probes.generate(name, 150, seed=5, held_out=tag)
            for tag in (False, probes.VALIDATION_TAG, True)}
    rows = {tag: {x.tobytes() for x in d["inputs"]} for tag, d in sets.items()}
    tags = list(rows)
    for i, a in enumerate(tags):
        for b in tags[i + 1:]:
            assert not rows[a] & rows[b], (name, a, b)
    small = probes.generate(name, 70, seed=5)  # crosses a block boundary
    for k in small:
        np.testing.assert_array_equal(small[k], sets[False][k][:70])
    assert not (probes.generate(name, 20, seed=6)["inputs"]
                == small["inputs"][:20]).all(axis=1).any()


@pytest.mark.parametrize("name,opts,match", [
    ("mqar", dict(length=64, num_pairs=17), r"num_pairs 17 does not fit length 64.*at most 16"),
    ("mqar", dict(length=256, num_pairs=40, vocab_size=64), r"vocab_size 64 .*>= 80"),
    ("mqar", dict(power_a=0.0), "power_a"),
    ("mad_in_context_recall", dict(vocab_size=17, noise_vocab=16), "vocab_size 17"),
    ("mad_noisy_recall", dict(frac_noise=1.0), "frac_noise"),
    ("mad_noisy_recall", dict(noise_vocab=0, frac_noise=0.2), "noise_vocab"),
    ("mad_fuzzy_recall", dict(vocab_size=4, motif_size=3), "motif_size 3"),
    ("mad_fuzzy_recall", dict(length=12, motif_size=3), "length 12"),
    ("mad_compression", dict(length=33), "length 33"),
    ("mad_memorization", dict(length=31), "length 31"),
    ("mad_selective_copying", dict(length=20, num_tokens=16), "fit"),
    ("induction_heads", dict(length=3), "length 3")])
def test_bad_settings_are_one_line_naming_the_setting(name, opts, match):
    with pytest.raises(ValueError, match=match) as e:
        probes.info(name, **opts)
    assert "\n" not in str(e.value) and str(e.value).startswith(name)


def test_tasks_build_from_config_and_mad_score():
    c = data_config()
    c.task = "mqar"
    c.max_length = 64
    c.probes.update(dict(num_pairs=8, vocab_size=32, power_a=0.5, num_train=20, num_val=8,
                         num_test=8, seed=1))
    task = get_task(c)
    assert task.info == task_info(c) and task.info["per_position"]
    assert task.info["num_classes"] == 16 and task.info["vocab_size"] == F + 32
    src = task.source("test")
    ref = probes.generate("mqar", 8, seed=1, held_out=True, length=64, num_pairs=8,
                          vocab_size=32, power_a=0.5)
    np.testing.assert_array_equal(src[3]["inputs"], ref["inputs"][3])
    c.probes.num_pairs = 20
    with pytest.raises(ValueError, match="num_pairs 20"):
        task_info(c)
    assert len(mad.mad_settings("mad_in_context_recall")) == 1 + 3 + 3 + 4
    score, per = mad.mad_score({"a": [1.0, 0.5], "b": [0.25]})
    assert per == {"a": 0.75, "b": 0.25} and score == 0.5
    with pytest.raises(ValueError, match="no task"):
        mad.mad_score({"a": []})
