"""What every comparison plot says the same way: the budget and data of a group of runs, the
chance level, and the mean ± t-interval over seeds (the table's statistic), clipped to the
metric's range.
"""

from __future__ import annotations

import json
import os

import numpy as np
from absl import logging

from sptlib.protocol import stats


def pyplot():
    import matplotlib  # deferred: plotting is optional and slow to import
    matplotlib.use("Agg")  # no display; files only
    import matplotlib.pyplot as plt
    return plt


def save_png(fig, path):
    """PNG of `fig` at `path` (local or gs://; a planted symlink is replaced, not followed)."""
    import io

    from sptlib.train import results as results_lib  # deferred: only the PNG writers need it
    plt = pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    results_lib.write_bytes(path, buf.getvalue())


def data_label(fraction: float) -> str:
    """'all training data' or '10% of the training data'."""
    return "all training data" if fraction == 1.0 else f"{fraction:.3g} of the training data"


def budget(record) -> str:
    """The training budget of a run: '600 pretraining + 200 finetuning steps' or '200 steps'."""
    stages = record.get("stages") or {}
    steps = [int(s.get("steps") or 0) for s in stages.values()]
    if not steps:
        return "? steps"
    pre = int(record.get("pretrain_steps") or 0)
    return f"{pre} pretraining + {steps[-1]} finetuning steps" if pre else f"{steps[-1]} steps"


def chance_accuracy(records) -> float | None:
    """Chance accuracy (%) of the runs' task, 100 / classes, from a run's saved `config.data`
    (`sptlib.data.defaults.task_info`: no data read); None when it cannot be told."""
    for r in records:
        stages = list(r.get("stages") or {})
        if not stages or not r.get("workdir"):
            continue
        path = os.path.join(r["workdir"], stages[-1], "config.json")
        try:
            import ml_collections
            from sptlib.data import defaults  # deferred: only plots with a chance line need it
            with open(path) as f:
                data = ml_collections.ConfigDict(json.load(f)["data"])
            classes = int(defaults.task_info(data)["num_classes"])
        except (OSError, KeyError, ValueError, TypeError, AttributeError) as e:
            logging.info("no chance level for the plots from %s: %s", path, e)
            continue
        return 100.0 / classes if classes > 0 else None
    return None


def draw_chance(ax, chance: float | None):
    if chance is not None:
        ax.axhline(chance, color="0.4", linestyle=(0, (4, 3)), linewidth=1,
                   label=f"chance ({chance:.3g}%)", zorder=1)


def clipped_yerr(means, half_widths, low=0.0, high=100.0) -> np.ndarray:
    """`yerr` ([2, n]: below, above) of the intervals mean ± half-width clipped to [low, high]:
    an accuracy's whisker never passes 0% or 100%. NaN half-widths (n < 2) draw none."""
    m = np.asarray(means, dtype=float)
    h = np.nan_to_num(np.asarray(half_widths, dtype=float), nan=0.0)
    return np.vstack([np.minimum(h, m - low), np.minimum(h, high - m)]).clip(min=0.0)


def mean_band(ys, confidence: float = 0.95, low=-np.inf, high=np.inf):
    """Per column of `ys` ([seeds, points]): mean, and the t-interval's lower and upper edges
    clipped to [low, high] (no band with one seed: both edges are the mean)."""
    ivs = [stats.mean_ci(col, confidence) for col in np.asarray(ys, dtype=float).T]
    mean = np.array([iv.mean for iv in ivs])
    half = np.array([iv.half_width if iv.n > 1 else 0.0 for iv in ivs])
    return mean, np.clip(mean - half, low, high), np.clip(mean + half, low, high)
