"""All-or-nothing statistics (sptlib.protocol.bimodal): interval coverage by seeded simulation at
n = 3, 5, 10 runs, Kaplan-Meier against hand values, the bimodal rule, refused inputs."""

import math

import numpy as np
import pytest

from sptlib.protocol import bimodal, stats

PS = np.linspace(0.05, 0.95, 19)  # true success rates of the simulated cells


def _wald(k, n, z=1.959964):
    p = k / n
    h = z * math.sqrt(p * (1 - p) / n)
    return bimodal.Rate(k, n, p - h, p + h)


def _coverage(interval, n, rng, draws=2000):
    """Per true rate in PS: the fraction of simulated k ~ Binomial(n, p) whose interval holds p."""
    out = []
    for p in PS:
        ks = rng.binomial(n, p, draws)
        table = {k: interval(k, n) for k in range(n + 1)}
        out.append(np.mean([table[k].low <= p <= table[k].high for k in ks]))
    return np.array(out)


@pytest.mark.parametrize("n", [3, 5, 10])
def test_wilson_coverage_near_nominal_where_wald_fails(n):
    rng = np.random.default_rng(n)
    cov = _coverage(bimodal.wilson, n, rng)
    # Wilson: average coverage near 95% over the rates, never far below (Brown, Cai & DasGupta
    # 2001: its dips are narrow); Wald collapses to a point at k = 0 or n.
    assert 0.93 <= cov.mean() <= 0.995 and cov.min() >= 0.75, cov
    wald = _coverage(_wald, n, rng)
    assert wald.mean() < 0.90 and wald.min() < 0.75


@pytest.mark.parametrize("n", [3, 5, 10])
def test_newcombe_difference_coverage(n):
    rng = np.random.default_rng(100 + n)
    pairs = [(0.1, 0.9), (0.5, 0.5), (0.2, 0.6), (0.8, 0.3), (0.95, 0.05), (0.6, 0.7)]
    covs = []
    for p1, p2 in pairs:
        k1, k2 = rng.binomial(n, p1, 2000), rng.binomial(n, p2, 2000)
        hit = [(d := bimodal.newcombe(a, n, b, n)).low <= p1 - p2 <= d.high
               for a, b in zip(k1, k2)]
        covs.append(np.mean(hit))
    assert np.mean(covs) >= 0.93 and min(covs) >= 0.85, covs


@pytest.mark.parametrize("n", [3, 5, 10])
def test_learned_accuracy_t_interval_coverage(n):
    # The accuracy of the runs that learned is unimodal (near 100 %): there the t-interval is
    # the right tool, and keeps its coverage on a bimodal mixture once the failures are removed.
    rng = np.random.default_rng(200 + n)
    hits = 0
    trials = 1500
    for _ in range(trials):
        learned = rng.random(n * 3) < 0.6
        acc = np.where(learned, rng.normal(0.97, 0.01, n * 3), rng.normal(0.07, 0.01, n * 3))
        cell = [{"test_accuracy": a} for a in acc[:max(n, 2)]]
        s = bimodal.summarize(cell, threshold=90.0, chance=6.25)
        if s.learned_accuracy.n >= 2:
            hits += abs(s.learned_accuracy.mean - 0.97) <= s.learned_accuracy.half_width
        else:
            trials -= 1
    assert 0.92 <= hits / trials <= 0.98


def test_wilson_and_newcombe_hand_values():
    r = bimodal.wilson(2, 3)
    # Wilson 95% for 2/3: centre (2/3 + 1.92/3) / (1 + 3.84/3), known 0.2077-0.9385.
    assert r.low == pytest.approx(0.2077, abs=1e-3) and r.high == pytest.approx(0.9385, abs=1e-3)
    assert bimodal.wilson(0, 5).low == 0.0 and bimodal.wilson(5, 5).high == 1.0
    # Newcombe's worked example (1998, Table II, 56/70 - 48/80): 0.0524 to 0.3339.
    d = bimodal.newcombe(56, 70, 48, 80)
    assert d.low == pytest.approx(0.0524, abs=5e-4) and d.high == pytest.approx(0.3339, abs=5e-4)
    with pytest.raises(ValueError, match="k=4"):
        bimodal.wilson(4, 3)


def test_kaplan_meier_with_censoring_by_hand():
    # Times 100 (learned), 200 (censored), 300 (learned), 400 (censored at the budget):
    # S(100) = 3/4; at 300 two runs remain at risk: S = 3/4 * 1/2.
    curve = bimodal.kaplan_meier([100, 200, 300, 400], [True, False, True, False])
    assert curve == [(0.0, 1.0), (100.0, 0.75), (300.0, 0.375)]
    assert bimodal.km_median(curve) == 300.0
    # No censoring: one minus the empirical distribution function.
    times = [5, 1, 3, 3]
    c = bimodal.kaplan_meier(times, [True] * 4)
    assert c == [(0.0, 1.0), (1.0, 0.75), (3.0, 0.25), (5.0, 0.0)]
    assert bimodal.km_median(bimodal.kaplan_meier([10, 20], [False, False])) is None


def test_summary_of_the_recorded_bimodal_cell():
    # Mamba-2 on recall (docs/reproducing.md): 100.0, 6.3, 100.0 -> t-interval 68.8 ± 134.4.
    recs = [{"test_accuracy": a, "curve": {"step": [200, 400, 600], "accuracy": c}}
            for a, c in [(1.0, [0.1, 0.95, 1.0]), (0.063, [0.06, 0.06, 0.07]),
                         (1.0, [0.92, 1.0, 1.0])]]
    assert stats.mean_ci([r["test_accuracy"] for r in recs]).half_width > 1.0
    s = bimodal.summarize(recs, threshold=90.0, chance=6.25)
    assert s.bimodal and (s.success.k, s.success.n) == (2, 3)
    assert s.learned_accuracy.mean == 1.0 and s.censored == 1
    np.testing.assert_allclose(s.km, [(0.0, 1.0), (200.0, 2 / 3), (400.0, 1 / 3)])
    assert s.km_median == 400.0
    assert s.success.format() == "2/3 (67%, 21–94%)"


@pytest.mark.parametrize("values,bimodal_", [
    ([100.0, 6.3, 100.0], True), ([99.0, 98.0, 97.0], False), ([50.0, 100.0, 6.0], False),
    ([6.0, 7.0], False), ([95.0], False), ([12.0, 91.0], True)])
def test_bimodal_rule(values, bimodal_):
    assert bimodal.is_bimodal(values, 90.0, 6.25) is bimodal_


@pytest.mark.parametrize("bad", [0, 100, -5, 150])
def test_threshold_outside_open_interval_refused(bad):
    with pytest.raises(ValueError, match=r"success threshold .* \(0, 100\)"):
        bimodal.check_threshold(bad)
    with pytest.raises(ValueError, match="success threshold"):
        bimodal.summarize([{"test_accuracy": 1.0}], threshold=bad)


def test_fewer_than_two_runs_print_their_values():
    assert bimodal.no_interval([0.688]) == "n=1: no interval can be formed (values: 68.8)"
    assert bimodal.no_interval([]) == "n=0: no interval can be formed (values: none)"
