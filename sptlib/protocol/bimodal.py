"""Statistics for all-or-nothing outcomes: success rates, accuracy when learned, steps to learn.

Synthetic probes (MQAR, the MAD tasks) are learnt at once or not at all: three seeds at 100, 6 and
100 % give a Student-t interval wider than 0-100 % that says nothing. Here a run *learns* when
its test accuracy reaches a stated threshold (percent, in (0, 100)), and a cell is summarised by

- the success rate k / n with its Wilson score interval (Wilson 1927; near nominal coverage at
  n = 3-10 where the Wald interval collapses to a point at k = 0 or n);
- the accuracy of the runs that learned (mean with the t-interval, `stats.mean_ci`);
- steps to learn as a Kaplan-Meier survival curve: a run's time is the first evaluated step whose
  validation accuracy reaches the threshold, a run that never did is censored at its last
  evaluated step (its budget), so "not within the budget" is never read as "never";
- differences in success rate between two cells with Newcombe's hybrid score interval (Newcombe
  1998, method 10: the two Wilson intervals combined).

When a cell is bimodal (`is_bimodal`: at least two runs, every run either within `CHANCE_BAND`
points of chance (or below) or at or above the threshold, and runs on both sides), its mean and
t-interval are meaningless and the report shows these statistics instead; they are always
computed. Where no chance level is known, 0 % stands in for it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Sequence

from scipy import stats as _st

from sptlib.errors import ConfigError
from sptlib.protocol import stats

DEFAULT_THRESHOLD = 90.0  # percent: a run whose test accuracy reaches it has learnt the task
CHANCE_BAND = 10.0        # points above chance still counted as "not learned" by the bimodal rule


def check_threshold(threshold: float) -> float:
    """`threshold` (percent) if it is in the open interval (0, 100); ConfigError otherwise."""
    t = float(threshold)
    if not 0.0 < t < 100.0:
        raise ConfigError(f"success threshold {threshold!r} must be a percentage in (0, 100) "
                          "(a run learns when its test accuracy reaches it)")
    return t


@functools.lru_cache(maxsize=None)
def _z(confidence: float) -> float:
    return float(_st.norm.ppf(0.5 + confidence / 2.0))


@dataclasses.dataclass(frozen=True)
class Rate:
    """k successes of n with the interval [low, high] of the rate (fractions)."""

    k: int
    n: int
    low: float
    high: float

    @property
    def rate(self) -> float:
        return self.k / self.n if self.n else math.nan

    def format(self) -> str:
        """'2/3 (67%, 21–94%)'; '–' when n = 0."""
        if not self.n:
            return "–"
        return (f"{self.k}/{self.n} ({100 * self.rate:.0f}%, "
                f"{100 * self.low:.0f}–{100 * self.high:.0f}%)")


def wilson(k: int, n: int, confidence: float = 0.95) -> Rate:
    """The Wilson score interval of a binomial rate k / n."""
    if n <= 0:
        return Rate(0, 0, math.nan, math.nan)
    if not 0 <= k <= n:
        raise ValueError(f"wilson: k={k} must be in [0, n={n}]")
    z = _z(confidence)
    p = k / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # k = 0 and k = n: the bounds are exactly 0 and 1 (rounding would leave 1e-17 off).
    return Rate(k, n, 0.0 if k == 0 else max(0.0, centre - half),
                1.0 if k == n else min(1.0, centre + half))


@dataclasses.dataclass(frozen=True)
class Difference:
    """rate(a) − rate(b) and its interval (fractions)."""

    diff: float
    low: float
    high: float

    def format(self) -> str:
        if math.isnan(self.diff):
            return "–"
        return f"{100 * self.diff:+.0f} points ({100 * self.low:+.0f} to {100 * self.high:+.0f})"


def newcombe(k1: int, n1: int, k2: int, n2: int, confidence: float = 0.95) -> Difference:
    """Newcombe's hybrid score interval of k1/n1 − k2/n2 (method 10 of Newcombe 1998)."""
    if n1 <= 0 or n2 <= 0:
        return Difference(math.nan, math.nan, math.nan)
    a, b = wilson(k1, n1, confidence), wilson(k2, n2, confidence)
    p1, p2 = a.rate, b.rate
    d = p1 - p2
    low = d - math.sqrt((p1 - a.low) ** 2 + (b.high - p2) ** 2)
    high = d + math.sqrt((a.high - p1) ** 2 + (p2 - b.low) ** 2)
    return Difference(d, max(-1.0, low), min(1.0, high))


def kaplan_meier(times: Sequence[float], events: Sequence[bool]) -> list[tuple[float, float]]:
    """The Kaplan-Meier estimate of P(not learned after t): [(t, S(t))] at each event time, from
    (0, 1.0). `events[i]` False: run i was censored at `times[i]` (never learned by then)."""
    if len(times) != len(events):
        raise ValueError(f"kaplan_meier: {len(times)} times but {len(events)} events")
    data = sorted(zip(times, events), key=lambda te: (te[0], not te[1]))
    at_risk, s, curve = len(data), 1.0, [(0.0, 1.0)]
    i = 0
    while i < len(data):
        t = data[i][0]
        learned = sum(1 for tt, e in data[i:] if tt == t and e)
        leaving = sum(1 for tt, _ in data[i:] if tt == t)
        if learned:
            s *= 1.0 - learned / at_risk
            curve.append((float(t), s))
        at_risk -= leaving
        i += leaving
    return curve


def km_median(curve) -> float | None:
    """The first time at which the survival curve reaches 0.5 or less (None: not reached)."""
    for t, s in curve:
        if s <= 0.5 + 1e-12:
            return t
    return None


def steps_to_learn(record, threshold: float) -> tuple[float | None, bool]:
    """(time, learned) of one comparison record: the first step of its validation curve
    (`curve`: {"step", "accuracy"} of the last stage) at or above `threshold` percent; never:
    (last evaluated step, False) — censored; no curve: (None, False)."""
    curve = record.get("curve") or {}
    steps, accs = curve.get("step") or [], curve.get("accuracy") or []
    for s, a in zip(steps, accs):
        if a is not None and 100.0 * a >= threshold:
            return float(s), True
    return (float(steps[-1]), False) if steps else (None, False)


def is_bimodal(values_pct: Sequence[float], threshold: float, chance: float | None) -> bool:
    """The rule in the module docstring: >= 2 runs, each within CHANCE_BAND of chance (or below)
    or at/above `threshold`, both groups present. Values in percent."""
    v = [x for x in values_pct if x is not None and not math.isnan(x)]
    low = (chance or 0.0) + CHANCE_BAND
    lo, hi = [x for x in v if x <= low], [x for x in v if x >= threshold]
    return len(v) >= 2 and bool(lo) and bool(hi) and len(lo) + len(hi) == len(v)


@dataclasses.dataclass(frozen=True)
class Cell:
    """The all-or-nothing summary of one cell's runs."""

    success: Rate
    learned_accuracy: stats.Interval  # fractions, over the runs that learned
    km: list                          # [(step, survival)]
    km_median: float | None
    censored: int                     # runs that never reached the threshold on validation
    bimodal: bool
    values: tuple                     # test accuracies (fractions)


def summarize(records, threshold: float = DEFAULT_THRESHOLD, chance: float | None = None,
              confidence: float = 0.95) -> Cell:
    """`Cell` of the finished `records` of one cell (test accuracies in [0, 1])."""
    check_threshold(threshold)
    vals = [float(r["test_accuracy"]) for r in records if r.get("test_accuracy") is not None]
    learned = [v for v in vals if 100.0 * v >= threshold]
    times = [steps_to_learn(r, threshold) for r in records]
    times = [(t, e) for t, e in times if t is not None]
    curve = kaplan_meier([t for t, _ in times], [e for _, e in times]) if times else []
    return Cell(wilson(len(learned), len(vals), confidence),
                stats.mean_ci(learned, confidence), curve, km_median(curve),
                sum(1 for _, e in times if not e),
                is_bimodal([100.0 * v for v in vals], threshold, chance), tuple(vals))


def no_interval(values, scale: float = 100.0) -> str:
    """'n=1: no interval can be formed (values: 68.8)' for a cell with fewer than two runs."""
    shown = ", ".join(f"{scale * v:.1f}" for v in values) or "none"
    return f"n={len(values)}: no interval can be formed (values: {shown})"
