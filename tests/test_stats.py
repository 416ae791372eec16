"""Statistics against hand-computed values (t quantiles from printed tables)."""

import math

import pytest

from sptlib.protocol import stats


def test_t_critical_matches_tables():
    # Two-sided 95% values from a printed t table.
    assert stats.t_critical(1) == pytest.approx(12.7062, abs=1e-4)
    assert stats.t_critical(2) == pytest.approx(4.3027, abs=1e-4)
    assert stats.t_critical(4) == pytest.approx(2.7764, abs=1e-4)
    assert stats.t_critical(1e9) == pytest.approx(1.95996, abs=1e-4)
    assert stats.t_critical(4, confidence=0.99) == pytest.approx(4.6041, abs=1e-4)


def test_mean_ci_hand_computed():
    # [1..5]: mean 3, s = sqrt(2.5), se = sqrt(0.5), t_4 = 2.776445 -> 1.963243.
    iv = stats.mean_ci([1, 2, 3, 4, 5])
    assert iv.mean == pytest.approx(3.0)
    assert iv.std == pytest.approx(math.sqrt(2.5))
    assert iv.half_width == pytest.approx(1.963243, abs=1e-5)
    assert (iv.low, iv.high) == pytest.approx((1.036757, 4.963243), abs=1e-5)
    # Accuracies of three seeds: s = 0.02, se = 0.011547, t_2 = 4.302653 -> 0.049683.
    iv = stats.mean_ci([0.80, 0.82, 0.84])
    assert iv.mean == pytest.approx(0.82)
    assert iv.half_width == pytest.approx(0.049683, abs=1e-6)
    assert iv.format(scale=100) == "82.0 ± 5.0"


def test_mean_ci_degenerate():
    one = stats.mean_ci([0.7])
    assert one.mean == 0.7 and math.isnan(one.half_width) and one.n == 1
    assert one.format(scale=100) == "70.0"
    empty = stats.mean_ci([])
    assert empty.n == 0 and empty.format() == "–"
    # NaN / None entries (failed runs) are dropped, not averaged.
    assert stats.mean_ci([0.5, float("nan"), None, 0.7]).mean == pytest.approx(0.6)
    assert stats.mean_ci([2.0, 2.0, 2.0]).half_width == 0.0


def test_welch_difference_hand_computed():
    # Equal n, equal variance: df = 2(n-1) = 4, se = sqrt(1/3 + 1/3) -> 2.776445 * 0.816497.
    d = stats.diff_ci([4, 5, 6], [1, 2, 3])
    assert d.mean == pytest.approx(3.0)
    assert d.half_width == pytest.approx(2.266958, abs=1e-5)
    # Unequal variances: var 1 (n 3) vs 20/3 (n 4): df = 4 / (1/18 + 25/27) = 4.075472.
    assert stats.welch_df(1.0, 3, 20.0 / 3.0, 4) == pytest.approx(4.075472, abs=1e-5)
    d = stats.diff_ci([2, 4, 6, 8], [1, 2, 3])
    assert d.mean == pytest.approx(3.0)
    assert d.std == pytest.approx(math.sqrt(2.0))  # standard error of the difference
    assert 2.75 * math.sqrt(2) < d.half_width < 2.7765 * math.sqrt(2)
    assert math.isnan(stats.diff_ci([1.0], [2.0, 3.0]).half_width)
