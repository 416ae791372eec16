"""Learning-curve tables and plots of a comparison: the denoising curve, accuracy against steps
and against training-set size.

Appended to `comparison.md` by `sptlib.protocol.report` when a comparison has runs to show them:
- **Denoising plateau** (runs with a pretraining stage): the pretraining stage's validation loss
  at its first and last evaluation, and the first step at which it had made `PLATEAU` (90%) of
  its drop from the first evaluation to its lowest value.
- **Accuracy against steps** (`scratch-equal-compute` runs, which are the longest scratch runs):
  validation accuracy of the classification stage at fixed step counts, mean over seeds.
- **Accuracy against training-set size** (more than one data fraction): test accuracy per model
  and regime, one column per fraction.
"""

from __future__ import annotations

import collections
import os

import numpy as np

from sptlib.protocol import stats
from sptlib.protocol.records import finished as _ok, group
from sptlib.train import results as results_lib

PLATEAU = 0.9  # fraction of the total drop of the denoising loss that counts as the plateau
STEPS_SHOWN = (100, 300, 600, 1000, 2000, 5000, 10000)


def pretrain_history(record) -> list[dict]:
    """The validation history (`[{step, loss, ...}]`) of a run's first (pretraining) stage, read
    from `<run>/<stage>/results.json`; [] for a run without a pretraining stage."""
    stages = list(record.get("stages") or {})
    if len(stages) < 2 or not record.get("workdir"):
        return []
    res = results_lib.read_stage(os.path.join(record["workdir"], stages[0]))
    hist = res.history if res else []
    return [h for h in hist if h.get("step") is not None and h.get("loss") is not None]


def plateau_step(steps, losses, fraction: float = PLATEAU) -> int | None:
    """First step at which `losses` has made `fraction` of its drop from the first value to its
    minimum; None where it never dropped."""
    if not steps:
        return None
    first, low = float(losses[0]), float(min(losses))
    if not first > low:
        return None
    # The minimum itself qualifies, so there always is one.
    need = fraction * (first - low)
    return next(int(s) for s, v in zip(steps, losses) if first - float(v) >= need)


def _key(r):
    return (r.get("data_fraction", 1.0), r["model"], r["regime"])


def denoising_rows(records) -> list[str]:
    by = collections.defaultdict(list)
    for r in _ok(records):
        h = pretrain_history(r)
        if h:
            by[_key(r)].append(h)
    rows = []
    for (frac, m, g), hs in sorted(by.items(), key=lambda kv: (-kv[0][0], kv[0][1], kv[0][2])):
        first = [h[0]["loss"] for h in hs]
        last = [h[-1]["loss"] for h in hs]
        plateaus = [plateau_step([x["step"] for x in h], [x["loss"] for x in h]) for h in hs]
        known = [p for p in plateaus if p is not None]
        rows.append(f"| {frac:g} | {m} | {g} | {len(hs)} | {np.mean(first):.4f} "
                    f"(step {hs[0][0]['step']}) | {np.mean(last):.4f} (step {hs[0][-1]['step']}) "
                    f"| {'–' if not known else ', '.join(str(p) for p in known)} |")
    return rows


def steps_rows(records, regime: str = "scratch-equal-compute") -> tuple[list[int], list[str]]:
    by = collections.defaultdict(list)
    for r in _ok(records):
        if r["regime"] == regime and r.get("curve"):
            by[_key(r)].append(dict(zip(r["curve"]["step"], r["curve"]["accuracy"])))
    if not by:
        return [], []
    longest = max(max(c) for cs in by.values() for c in cs)
    shown = [s for s in STEPS_SHOWN if s < longest] + [longest]
    rows = []
    for (frac, m, _), cs in sorted(by.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        cells = []
        for s in shown:
            vals = [c[s] for c in cs if s in c]
            cells.append(f"{100 * np.mean(vals):.1f}" if vals else "–")
        rows.append(f"| {frac:g} | {m} | {len(cs)} | " + " | ".join(cells) + " |")
    return shown, rows


def size_rows(records, confidence: float = 0.95) -> tuple[list[float], list[str]]:
    by = group(records)
    fractions = sorted({k[0] for k in by})
    if len(fractions) < 2:
        return fractions, []
    rows = []
    for m, g in dict.fromkeys((k[1], k[2]) for k in sorted(by, key=lambda k: (k[1], k[2]))):
        cells = []
        for f in fractions:
            iv = stats.mean_ci(by.get((f, m, g), []), confidence)
            cells.append(f"{iv.format(100.0)} ({iv.n})" if iv.n else "–")
        rows.append(f"| {m} | {g} | " + " | ".join(cells) + " |")
    return fractions, rows


def markdown(records) -> str:
    """The learning-curve sections for `comparison.md` ('' when there is nothing to show)."""
    out = []
    rows = denoising_rows(records)
    if rows:
        out += ["## Denoising curve (pretraining stage, validation loss)", "",
                f"Plateau: the first evaluation at which the loss had made {PLATEAU:.0%} of its "
                "drop from the first evaluation to its lowest value (one entry per seed).", "",
                "| data fraction | model | regime | seeds | first | last | plateau step |",
                "|---|---|---|---|---|---|---|", *rows, ""]
    shown, rows = steps_rows(records)
    if rows:
        out += ["## Validation accuracy (%) against classification steps, scratch "
                "(the scratch-equal-compute runs, mean over seeds)", "",
                "| data fraction | model | seeds | " + " | ".join(str(s) for s in shown) + " |",
                "|---" * (len(shown) + 3) + "|", *rows, ""]
    fractions, rows = size_rows(records)
    if rows:
        out += ["## Test accuracy (%) against training-set size (data fraction)", "",
                "| model | regime | " + " | ".join(f"{f:g}" for f in fractions) + " |",
                "|---" * (len(fractions) + 2) + "|", *rows, ""]
    return "\n".join(out)


def write_plots(records, workdir: str, save) -> dict:
    """`denoising.png` (validation loss against pretraining steps, one colour per model: each
    seed a thin line, their mean bold) where there are pretraining
    stages; returns {name: path}. `save(fig, path)` writes a figure."""
    runs = [(r, pretrain_history(r)) for r in _ok(records)]
    runs = [(r, h) for r, h in runs if h]
    if not runs:
        return {}
    from sptlib.protocol import plotting  # deferred: matplotlib is slow to import
    plt = plotting.pyplot()
    fractions = sorted({r.get("data_fraction", 1.0) for r, _ in runs}, reverse=True)
    fig, axes = plt.subplots(1, len(fractions), figsize=(6 * len(fractions), 4), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    models = list(dict.fromkeys(r["model"] for r, _ in runs))
    for ax, frac in zip(axes[0], fractions):
        for mi, m in enumerate(models):
            mine = [(r, h) for r, h in runs if r.get("data_fraction", 1.0) == frac
                    and r["model"] == m]
            if not mine:
                continue
            color = colors[mi % len(colors)]
            for _, h in mine:
                ax.plot([x["step"] for x in h], [x["loss"] for x in h], color=color,
                        alpha=0.35, linewidth=0.8)
            steps = sorted(set.intersection(*({x["step"] for x in h} for _, h in mine)))
            if steps:
                ys = [[{x["step"]: x["loss"] for x in h}[s] for s in steps] for _, h in mine]
                ax.plot(steps, np.mean(ys, axis=0), color=color, linewidth=2,
                        label=f"{m}: mean of {len(mine)} seeds (thin: each seed)")
        total = max(int(r.get("pretrain_steps") or 0) for r, _ in runs)
        ax.set_title(f"Self-pretraining: denoising loss on validation data\n"
                     f"{plotting.data_label(frac)}, {total} steps", fontsize=10)
        ax.set_xlabel("pretraining steps")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("validation loss of the pretraining objective")
    fig.tight_layout()
    path = os.path.join(workdir, "denoising.png")
    save(fig, path)
    return {"denoising": path}
