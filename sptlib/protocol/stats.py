"""Summary statistics over seeds: means with Student-t 95% confidence intervals.

The paper reports single numbers; with 2-5 seeds per cell the spread matters, so every number in a
comparison table is `mean ± half-width` of a two-sided t interval. Differences (the SPT gain, the
gap between two models) use Welch's interval, which does not assume equal variances and does not
pair seeds: seed k of two different runs shares nothing but the integer.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
from scipy import stats as _st


@dataclasses.dataclass(frozen=True)
class Interval:
    """A mean and the half-width of its confidence interval.

    `half_width` is NaN when it cannot be estimated (fewer than two values).
    """

    mean: float
    half_width: float
    n: int
    # Sample standard deviation (ddof=1) of a mean; the standard error of a difference (diff_ci).
    # NaN when n < 2.
    std: float

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def format(self, scale: float = 1.0, digits: int = 1) -> str:
        """`'82.3 ± 1.4'` (values multiplied by `scale`); `'82.3'` when n = 1; `'–'` when empty."""
        if self.n == 0 or math.isnan(self.mean):
            return "–"
        m = self.mean * scale
        if math.isnan(self.half_width):
            return f"{m:.{digits}f}"
        return f"{m:.{digits}f} ± {self.half_width * scale:.{digits}f}"


def t_critical(df: float, confidence: float = 0.95) -> float:
    """Two-sided critical value of Student's t with `df` degrees of freedom."""
    return float(_st.t.ppf(0.5 + confidence / 2.0, df))


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Mean of `values` and the half-width t_{n-1} · s / sqrt(n) of its confidence interval."""
    x = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=np.float64)
    n = int(x.size)
    if n == 0:
        return Interval(math.nan, math.nan, 0, math.nan)
    mean = float(x.mean())
    if n < 2:
        return Interval(mean, math.nan, n, math.nan)
    std = float(x.std(ddof=1))
    return Interval(mean, t_critical(n - 1, confidence) * std / math.sqrt(n), n, std)


def welch_df(var_a: float, n_a: int, var_b: float, n_b: int) -> float:
    """Welch–Satterthwaite degrees of freedom of a difference of two means."""
    va, vb = var_a / n_a, var_b / n_b
    denom = va * va / (n_a - 1) + vb * vb / (n_b - 1)
    if denom == 0.0:
        # Both samples constant: the difference is known exactly; any df gives half-width 0.
        return float(n_a + n_b - 2)
    return (va + vb) ** 2 / denom


def diff_ci(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Interval:
    """mean(a) − mean(b) with Welch's t interval (NaN half-width when either has < 2 values)."""
    ia, ib = mean_ci(a, confidence), mean_ci(b, confidence)
    n = min(ia.n, ib.n)
    if ia.n == 0 or ib.n == 0:
        return Interval(math.nan, math.nan, 0, math.nan)
    mean = ia.mean - ib.mean
    if ia.n < 2 or ib.n < 2:
        return Interval(mean, math.nan, n, math.nan)
    var_a, var_b = ia.std ** 2, ib.std ** 2
    se = math.sqrt(var_a / ia.n + var_b / ib.n)
    df = welch_df(var_a, ia.n, var_b, ib.n)
    return Interval(mean, t_critical(df, confidence) * se, n, se)
