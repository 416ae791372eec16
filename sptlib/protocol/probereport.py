"""The probe sections of `comparison.md`: all-or-nothing outcomes, length slices, the frontier.

Input: `comparison.json` records (`sptlib.protocol.records.make_record`). Sections (each only
where its data is):

- success rates (`sptlib.protocol.bimodal`): per model x regime the runs that learned (test
  accuracy >= the threshold) with a Wilson interval, the accuracy of those runs, steps to learn
  (Kaplan-Meier median; runs that never learned are censored at their budget), which statistic
  the cell's shape calls for (the bimodal rule of `bimodal.is_bimodal`); then Newcombe intervals
  of success-rate differences: SPT against each baseline per model, and under each regime the
  gap between the best model and each other, with whether SPT shrinks it;
- length extrapolation per slice (records' `length_slices`, `lengthgen.slice_results`);
- the fairness frontier: accuracy against parameters, training FLOPs (every stage's steps x
  its traced step's FLOPs) and recurrent state bytes (the records' `state_bytes`, where present),
  models on the Pareto front (no other cell is at least as cheap and more accurate) marked.

Plots: `frontier.png` (one panel per cost, every cell a point with its t-interval whisker and
its seeds as dots, the Pareto front drawn) and `steps_to_learn.png` (Kaplan-Meier curves).
"""

from __future__ import annotations

import collections
import json
import os

import numpy as np

from sptlib.configs.paper import REGIMES
from sptlib.protocol import bimodal, plotting, stats
from sptlib.protocol.records import finished

COSTS = (("params", "parameters"), ("flops", "training FLOPs"),
         ("state_bytes", "recurrent state (bytes)"))
# (prior regime, baseline) pairs whose success-rate difference is reported.
PRIOR_PAIRS = (("spt-causal", "scratch"), ("spt-causal", "scratch-equal-compute"),
               ("spt-masked", "scratch"), ("spt-masked", "scratch-equal-compute"))


def _ordered(values, order=()):
    seen = list(dict.fromkeys(values))
    return [v for v in order if v in seen] + [v for v in seen if v not in order]


def success_threshold(records) -> float:
    """`config.compare.success_threshold` of the runs' saved configs, else DEFAULT_THRESHOLD."""
    for r in records:
        for name in list(r.get("stages") or {})[-1:]:
            path = os.path.join(r.get("workdir") or "", name, "config.json")
            try:
                with open(path) as f:
                    t = json.load(f).get("compare", {}).get("success_threshold")
            except (OSError, ValueError, AttributeError):
                continue
            if t is not None:
                return bimodal.check_threshold(t)
    return bimodal.DEFAULT_THRESHOLD


def _cells(records, frac=1.0):
    out = collections.defaultdict(list)
    for r in finished(records):
        if r.get("data_fraction", 1.0) == frac:
            out[(r["model"], r["regime"])].append(r)
    return out


def is_probe(records) -> bool:
    from sptlib.data import probes  # deferred: the data package is only needed here
    return any(r.get("task") in probes.PROBES for r in records)


def cost(rs, key) -> float | None:
    """Mean `key` cost of the runs `rs`: params (last stage), flops (all stages' steps x FLOPs
    per step), state_bytes (the record's); None when a run lacks it."""
    vals = []
    for r in rs:
        st = r.get("stages") or {}
        if key == "params":
            v = (list(st.values())[-1].get("num_params") if st else None)
        elif key == "flops":
            parts = [(s.get("steps") or 0) * s["flops_per_step"] for s in st.values()
                     if s.get("flops_per_step")]
            v = sum(parts) if parts and len(parts) == len(st) else None
        else:
            v = r.get(key)
        if v is None:
            return None
        vals.append(float(v))
    return float(np.mean(vals)) if vals else None


def pareto(points) -> set:
    """Indices of the points (cost, accuracy) no other point dominates (cost <= and accuracy >,
    or cost < and accuracy >=)."""
    keep = set()
    for i, (c, a) in enumerate(points):
        if not any((c2 <= c and a2 > a) or (c2 < c and a2 >= a)
                   for j, (c2, a2) in enumerate(points) if j != i):
            keep.add(i)
    return keep


def markdown(records, threshold: float | None = None, chance: float | None = None,
             confidence: float = 0.95) -> str:
    """The probe sections (module docstring); '' when the records have none of them."""
    ok = finished(records)
    if not ok:
        return ""
    threshold = bimodal.check_threshold(threshold if threshold is not None
                                        else success_threshold(records))
    cells = _cells(records)
    models = _ordered(r["model"] for r in ok)
    regimes = _ordered((r["regime"] for r in ok), REGIMES)
    summ = {k: bimodal.summarize(v, threshold, chance, confidence) for k, v in cells.items()}
    lines = []
    if is_probe(records) or any(s.bimodal for s in summ.values()):
        lines += _success_section(summ, models, regimes, threshold, chance, confidence)
    lines += _slices_section(cells, models, regimes, confidence)
    lines += _frontier_section(cells, models, regimes, confidence)
    return "\n".join(lines)


def _success_section(summ, models, regimes, threshold, chance, confidence):
    band = f"{(chance or 0.0) + bimodal.CHANCE_BAND:.3g}"
    lines = [f"## All-or-nothing outcomes (a run learns at test accuracy >= {threshold:g}%)", "",
             f"Success: runs that learned, with the {confidence:.0%} Wilson interval. Accuracy "
             "when learned: mean ± t-interval over those runs. Steps to learn: Kaplan-Meier "
             "median of the first validation step at or above the threshold (runs that never "
             "reached it are censored at their last evaluation). A cell is *bimodal* when every "
             f"run is either at or below {band}% (chance + {bimodal.CHANCE_BAND:g} points) or "
             f"at or above {threshold:g}%, with runs on both sides: its mean ± t-interval "
             "(‡ in the tables above) says nothing, the success rate is its statistic.", "",
             "| model | regime | success | accuracy when learned (%) | steps to learn "
             "(median) | censored | test accuracies (%) | statistic |",
             "|---|---|---|---|---|---|---|---|"]
    for m in models:
        for g in regimes:
            s = summ.get((m, g))
            if s is None:
                continue
            med = "–" if s.km_median is None else f"{s.km_median:g}"
            if s.km_median is None and s.censored:
                med = "not reached"
            vals = ", ".join(f"{100 * v:.1f}" for v in s.values)
            kind = ("success rate (bimodal)" if s.bimodal else
                    bimodal.no_interval(s.values) if len(s.values) < 2 else "t-interval")
            lines.append(f"| {m} | {g} | {s.success.format()} | "
                         f"{s.learned_accuracy.format(100)} | {med} | {s.censored} | {vals} | "
                         f"{kind} |")
    lines.append("")
    rows = []
    for m in models:
        for a, b in PRIOR_PAIRS:
            if (m, a) in summ and (m, b) in summ:
                sa, sb = summ[(m, a)].success, summ[(m, b)].success
                d = bimodal.newcombe(sa.k, sa.n, sb.k, sb.n, confidence)
                rows.append(f"| {m} | {a} − {b} | {d.format()} |")
    gaps = {}
    for g in regimes:
        here = {m: summ[(m, g)].success for m in models if (m, g) in summ}
        if len(here) < 2:
            continue
        best = max(here, key=lambda m: (here[m].rate, m == "transformer"))
        for m, s in here.items():
            if m != best:
                d = bimodal.newcombe(here[best].k, here[best].n, s.k, s.n, confidence)
                gaps[(g, best, m)] = d
                rows.append(f"| {g} | {best} − {m} (gap) | {d.format()} |")
    if rows:
        lines += [f"### Success-rate differences (Newcombe {confidence:.0%} interval)", "",
                  "| model / regime | difference | success rate difference |", "|---|---|---|"]
        lines += rows + [""]
    # Does SPT shrink the gap? The same pair of models under scratch and under SPT.
    shrink = []
    for (g, best, m), d in gaps.items():
        if g.startswith("spt"):
            for base in ("scratch", "scratch-equal-compute"):
                sb, sm = summ.get((best, base)), summ.get((m, base))
                if sb and sm:
                    d0 = bimodal.newcombe(sb.success.k, sb.success.n, sm.success.k, sm.success.n,
                                          confidence)
                    shrink.append(f"| {best} − {m} | {base}: {d0.format()} | {g}: {d.format()} |")
    if shrink:
        lines += ["### Does SPT shrink the gap between models? (success rates)", "",
                  "| models | gap without SPT | gap with SPT |", "|---|---|---|"] + shrink + [""]
    return lines


def _slices_section(cells, models, regimes, confidence):
    keys = []
    for rs in cells.values():
        for r in rs:
            keys += list(r.get("length_slices") or {})
    keys = list(dict.fromkeys(keys))
    if not keys:
        return []

    def order(k):
        s, _, f = k.rpartition(" @")
        return (s, float(f.rstrip("x")))
    keys.sort(key=order)
    lines = ["## Length extrapolation per slice (test accuracy %, trained at 1x)", "",
             "| model | regime | " + " | ".join(keys) + " |", "|---" * (len(keys) + 2) + "|"]
    for m in models:
        for g in regimes:
            rs = cells.get((m, g))
            if not rs:
                continue
            row = [stats.mean_ci([(r.get("length_slices") or {}).get(k) for r in rs
                                  if (r.get("length_slices") or {}).get(k) is not None],
                                 confidence).format(100) for k in keys]
            lines.append(f"| {m} | {g} | " + " | ".join(row) + " |")
    return lines + [""]


def frontier_points(cells, confidence=0.95):
    """[(model, regime, {cost: value}, Interval of test accuracy, [accuracies])]."""
    out = []
    for (m, g), rs in cells.items():
        accs = [r["test_accuracy"] for r in rs]
        out.append((m, g, {k: cost(rs, k) for k, _ in COSTS}, stats.mean_ci(accs, confidence),
                    accs))
    return out


def _frontier_section(cells, models, regimes, confidence):
    pts = frontier_points(cells, confidence)
    if not pts:
        return []
    fronts = {}
    for key, _ in COSTS:
        idx = [i for i, p in enumerate(pts) if p[2][key] is not None]
        if idx:
            on = pareto([(pts[i][2][key], pts[i][3].mean) for i in idx])
            fronts[key] = {idx[j] for j in on}
    lines = ["## Fairness frontier (accuracy against cost)", "",
             "Pareto: the costs on which no other cell is at least as cheap and more accurate "
             "(frontier.png draws them)."]
    if "state_bytes" not in fronts:
        lines.append("No record has `state_bytes` (the mixers' recurrent-state accounting): the "
                     "state panel is left out.")
    lines += ["", "| model | regime | params | train FLOPs | state bytes | test accuracy (%) | "
              "Pareto on |", "|---|---|---|---|---|---|---|"]
    order = {(m, g): (models.index(m), regimes.index(g)) for m in models for g in regimes}
    for i in sorted(range(len(pts)), key=lambda i: order.get(pts[i][:2], (99, 99))):
        m, g, c, iv, _ = pts[i]
        on = ", ".join(lbl for key, lbl in (("params", "params"), ("flops", "FLOPs"),
                                             ("state_bytes", "state"))
                       if i in fronts.get(key, ())) or "–"

        def num(v, fmt):
            return "–" if v is None else format(v, fmt)
        lines.append(f"| {m} | {g} | {num(c['params'], ',.0f')} | {num(c['flops'], '.2e')} | "
                     f"{num(c['state_bytes'], ',.0f')} | {iv.format(100)} ({iv.n}) | {on} |")
    return lines + [""]


def plot_frontier(records, path, confidence=0.95) -> str | None:
    """frontier.png: a panel per cost with data (state bytes only where recorded)."""
    cells = _cells(records)
    pts = frontier_points(cells, confidence)
    panels = [(k, lbl) for k, lbl in COSTS if any(p[2][k] is not None for p in pts)]
    if not pts or not panels:
        return None
    plt = plotting.pyplot()
    models = _ordered(p[0] for p in pts)
    regimes = _ordered((p[1] for p in pts), REGIMES)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = "os^vDP"
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) + 1.5, 4.4),
                             sharey=True, squeeze=False)
    for ax, (key, label) in zip(axes[0], panels):
        idx = [i for i, p in enumerate(pts) if p[2][key] is not None]
        for i in idx:
            m, g, c, iv, accs = pts[i]
            x, y = c[key], 100 * iv.mean
            half = 100 * iv.half_width if iv.n > 1 else 0.0
            ax.errorbar([x], [y], yerr=plotting.clipped_yerr([y], [half]), capsize=3,
                        fmt=markers[regimes.index(g) % len(markers)],
                        color=colors[models.index(m) % len(colors)], label=f"{m} / {g}")
            ax.scatter([x] * len(accs), [100 * a for a in accs], s=6, color="black", zorder=3)
        front = sorted((pts[i][2][key], 100 * pts[i][3].mean) for i in idx
                       if i in {idx[j] for j in pareto([(pts[i][2][key], pts[i][3].mean)
                                                         for i in idx])})
        if front:
            ax.step([f[0] for f in front], [f[1] for f in front], where="post", color="0.3",
                    linestyle="--", linewidth=1, label="Pareto front")
        ax.set_xscale("log")
        # Ticks at the cells' own costs: a log axis within one decade has no major label, and
        # its minor labels overprint each other.
        xs = []
        for x in sorted({pts[i][2][key] for i in idx}):
            if not xs or x > 1.08 * xs[-1]:  # near-equal costs share one label
                xs.append(x)
        ax.set_xticks(xs, [f"{x:.3g}" for x in xs], rotation=40, fontsize=7, ha="right")
        ax.set_xticks([], minor=True)
        ax.set_xlabel(label)
        ax.set_ylim(0, 102)
        ax.grid(alpha=0.3)
        plotting.draw_chance(ax, plotting.chance_accuracy(finished(records)))
    axes[0][0].set_ylabel("test accuracy (%)")
    handles = {}
    for ax in axes[0]:
        for h, lbl in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lbl, h)
    axes[0][-1].legend(list(handles.values()), list(handles), fontsize=6,
                       loc="upper left", bbox_to_anchor=(1.01, 1.0))
    missing = "" if len(panels) == len(COSTS) else " (no state_bytes recorded: no state panel)"
    fig.suptitle(f"Accuracy against cost: mean ± {confidence:.0%} t-interval (clipped), seeds "
                 f"as dots, Pareto front dashed{missing}", fontsize=9)
    fig.tight_layout()
    return path if _save(fig, path) else None


def plot_steps_to_learn(records, path, threshold=None) -> str | None:
    """steps_to_learn.png: Kaplan-Meier P(not learned yet) against step, a panel per regime
    (probe grids and grids with a bimodal cell only)."""
    cells = _cells(records)
    threshold = threshold if threshold is not None else success_threshold(records)
    chance = plotting.chance_accuracy(finished(records))
    curves = {k: bimodal.summarize(v, threshold, chance) for k, v in cells.items()}
    # Only where the success section is shown (probes, or a bimodal cell), as in `markdown`.
    if not (is_probe(records) or any(s.bimodal for s in curves.values())):
        return None
    curves = {k: s for k, s in curves.items() if len(s.km) > 1 or s.censored}
    if not curves:
        return None
    plt = plotting.pyplot()
    models = _ordered(k[0] for k in cells)
    regimes = _ordered((k[1] for k in cells), REGIMES)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(regimes), figsize=(4.0 * len(regimes) + 1, 3.8),
                             sharey=True, squeeze=False)
    for ax, g in zip(axes[0], regimes):
        for m in models:
            s = curves.get((m, g))
            if s is None:
                continue
            budget = max([(r.get("curve") or {}).get("step", [0])[-1] or 0
                          for r in cells[(m, g)]] or [0])
            xs = [t for t, _ in s.km] + [budget]
            ys = [v for _, v in s.km] + [s.km[-1][1]]
            ax.step(xs, ys, where="post", color=colors[models.index(m) % len(colors)],
                    label=f"{m} ({s.success.k}/{s.success.n})")
        ax.set_title(g, fontsize=9)
        ax.set_xlabel("steps (last stage)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("fraction of runs not yet learned")
    fig.suptitle(f"Steps to learn (validation accuracy >= {threshold:g}%): Kaplan-Meier, "
                 "censored at the budget", fontsize=9)
    fig.tight_layout()
    return path if _save(fig, path) else None


def _save(fig, path):
    plotting.save_png(fig, path)
    return True


def cell_marks(records, threshold=None, chance=None) -> dict:
    """{(data_fraction, model, regime): threshold} of the bimodal cells (the main table's ‡)."""
    if not finished(records):
        return {}
    threshold = threshold if threshold is not None else success_threshold(records)
    out = {}
    for (frac, m, g), vals in _group_pct(records).items():
        if bimodal.is_bimodal(vals, threshold, chance):
            out[(frac, m, g)] = threshold
    return out


def _group_pct(records):
    out = collections.defaultdict(list)
    for r in finished(records):
        out[(r.get("data_fraction", 1.0), r["model"], r["regime"])].append(
            100.0 * float(r["test_accuracy"]))
    return out
