"""The comparison report: `comparison.md` (means ± 95% CI, SPT gains, gaps) and PNG plots.

Input is the list of per-run records `sptlib.protocol.compare` writes to `comparison.json`; each record has
at least `model`, `regime`, `seed`, `data_fraction`, `status`, `test_accuracy`, `val_accuracy`
(fractions in [0, 1]), `stages` (per stage: steps, wall_time_s) and optionally `curve`
(validation accuracy of the classification stage: `{"step": [...], "accuracy": [...]}`) and
`pretrain_steps`. Accuracies are printed in percent. Records with an `lr` (the lr axis of
`sptlib.protocol.sweeps`) are reduced to the lr chosen on validation per cell before anything is shown, and
a section lists each lr's validation accuracy and the choice.
"""

from __future__ import annotations

import collections
import itertools
import math
import os
from typing import Iterable, Sequence

import numpy as np

from sptlib.protocol import (learning_curves, lmreport, plotting, probereport, stats, stops,
                             sweeps)
from sptlib.configs.paper import REGIMES
from sptlib.protocol.records import finished as _ok, group  # noqa: F401 (group: public here too)
from sptlib.train import results as results_lib

# (SPT or other prior's regime, baseline regime) pairs whose difference is reported as a gain.
GAINS = (("spt-masked", "scratch"), ("spt-causal", "scratch"),
         ("spt-masked", "scratch-equal-compute"), ("spt-causal", "scratch-equal-compute"),
         ("mlpinit", "scratch"), ("mlpinit", "scratch-equal-compute"), ("spt-masked", "mlpinit"))


def _ordered(values: Iterable[str], order: Sequence[str] = ()) -> list[str]:
    seen = list(dict.fromkeys(values))
    return [v for v in order if v in seen] + [v for v in seen if v not in order]


def markdown(records, title: str = "Comparison", confidence: float = 0.95) -> str:
    """Renders the report as Markdown (see the module docstring for the record format)."""
    pct = 100.0
    lines = [f"# {title}", ""]
    ok = _ok(records)
    failed = [r for r in records if r.get("status") != "finished"]
    lines.append(f"{len(ok)} finished runs" + (f", {len(failed)} not finished" if failed else "")
                 + f". Test accuracy (%) of the best-validation checkpoint: mean ± half-width of "
                 f"the {confidence:.0%} Student-t interval over seeds (n seeds in brackets). "
                 "Differences use Welch's interval.")
    lines.append("")
    test = group(records, "test_accuracy")
    val = group(records, "val_accuracy")
    fractions = sorted({k[0] for k in test} | {r.get("data_fraction", 1.0) for r in records},
                       reverse=True)
    models = _ordered((r["model"] for r in records))
    regimes = _ordered((r["regime"] for r in records), REGIMES)
    # All-or-nothing cells (sptlib.protocol.bimodal): their t-interval is withheld (‡).
    marks = probereport.cell_marks(records, chance=plotting.chance_accuracy(ok))
    for frac in fractions:
        if len(fractions) > 1 or frac != 1.0:
            lines += [f"## Training data fraction {frac:g}", ""]
        h = "##" if len(fractions) == 1 and frac == 1.0 else "###"

        # Main table.
        lines += [f"{h} Test accuracy", "", "| model | " + " | ".join(regimes) + " |",
                  "|---" * (len(regimes) + 1) + "|"]
        for m in models:
            cells = []
            for g in regimes:
                iv = stats.mean_ci(test.get((frac, m, g), []), confidence)
                if (frac, m, g) in marks:
                    vals = test[(frac, m, g)]
                    k = sum(1 for v in vals if 100 * v >= marks[(frac, m, g)])
                    cells.append(f"‡ {k}/{iv.n} learned (mean {iv.mean * pct:.1f})")
                else:
                    cells.append(f"{iv.format(pct)} ({iv.n})" if iv.n else "–")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")
        if any(k[0] == frac for k in marks):
            lines += ["‡ bimodal cell: the runs either learned or stayed at chance, so a mean ± "
                      "t-interval would say nothing; its success rate and Wilson interval are in "
                      "\"All-or-nothing outcomes\" below.", ""]
        lines += [f"{h} Validation accuracy (best checkpoint)", "",
                  "| model | " + " | ".join(regimes) + " |", "|---" * (len(regimes) + 1) + "|"]
        for m in models:
            cells = [stats.mean_ci(val.get((frac, m, g), []), confidence).format(pct)
                     for g in regimes]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")

        # SPT gains.
        gain_rows = []
        for m in models:
            for a, b in GAINS:
                xa, xb = test.get((frac, m, a), []), test.get((frac, m, b), [])
                if xa and xb:
                    d = stats.diff_ci(xa, xb, confidence)
                    gain_rows.append(f"| {m} | {a} − {b} | {_signed(d, pct)} |")
        if gain_rows:
            lines += [f"{h} Gain of SPT / mlpinit (points)", "", "| model | difference | gain |",
                      "|---|---|---|"] + gain_rows + [""]

        # Gaps between models under each regime: against the best model of that regime.
        gap_rows = []
        for g in regimes:
            cell = {m: test.get((frac, m, g), []) for m in models if test.get((frac, m, g))}
            if len(cell) < 2:
                continue
            best = max(cell, key=lambda m: np.mean(cell[m]))
            for m in cell:
                if m != best:
                    d = stats.diff_ci(cell[best], cell[m], confidence)
                    gap_rows.append(f"| {g} | {best} − {m} | {_signed(d, pct)} |")
            if len(cell) > 2:
                spread = max(np.mean(v) for v in cell.values()) - min(
                    np.mean(v) for v in cell.values())
                gap_rows.append(f"| {g} | best − worst | {spread * pct:+.1f} |")
        if gap_rows:
            lines += [f"{h} Gap between models under each regime (points)", "",
                      "| regime | models | gap |", "|---|---|---|"] + gap_rows + [""]

        # Compute: steps, parameters, recurrent state per sequence (attention: its KV cache at
        # the task's length), training FLOPs (steps x the traced step's FLOPs) and wall time.
        lines += [f"{h} Compute per run (mean over seeds)", "",
                  "| model | regime | stages (steps) | parameters | state / sequence | "
                  "train FLOPs | wall time |",
                  "|---|---|---|---|---|---|---|"]
        for m in models:
            for g in regimes:
                rs = [r for r in ok if r["model"] == m and r["regime"] == g
                      and r.get("data_fraction", 1.0) == frac]
                if not rs:
                    continue
                stage_names = list(rs[0].get("stages", {}))
                st = ", ".join(
                    f"{s} {int(np.mean([r['stages'][s].get('steps') or 0 for r in rs]))}"
                    for s in stage_names)
                wall = np.mean([r.get("wall_time_s") or 0.0 for r in rs])
                lines.append(f"| {m} | {g} | {st} | {_params(rs)} | {_state(rs[0])} | "
                             f"{_flops(rs)} | {_duration(wall)} |")
        lines.append("")

        # Length generalisation.
        lg = collections.defaultdict(list)
        for r in ok:
            if r.get("data_fraction", 1.0) != frac:
                continue
            for factor, acc in (r.get("length_generalization") or {}).items():
                lg[(r["model"], r["regime"], factor)].append(acc)
        if lg:
            factors = sorted({k[2] for k in lg}, key=lambda f: float(str(f).rstrip("x")))
            lines += [f"{h} Length generalisation (test accuracy at longer inputs)", "",
                      "| model | regime | 1x | " + " | ".join(factors) + " |",
                      "|---" * (len(factors) + 3) + "|"]
            for m in models:
                for g in regimes:
                    if not any((m, g, f) in lg for f in factors):
                        continue
                    base = stats.mean_ci(test.get((frac, m, g), []), confidence).format(pct)
                    cells = [stats.mean_ci(lg.get((m, g, f), []), confidence).format(pct)
                             for f in factors]
                    lines.append(f"| {m} | {g} | {base} | " + " | ".join(cells) + " |")
            lines.append("")
    if failed:
        lines += ["## Runs not finished", ""]
        for r in failed:
            frac = r.get("data_fraction", 1.0)
            where = f" / data fraction {frac:g}" if frac != 1.0 else ""
            lines.append(f"- {r['model']} / {r['regime']}{where} / seed {r['seed']}: "
                         f"{r.get('status')} {r.get('error', '')}".rstrip())
        lines.append("")
    return "\n".join(lines)


def _signed(d: stats.Interval, scale: float) -> str:
    if math.isnan(d.half_width):
        return f"{d.mean * scale:+.1f}"
    return f"{d.mean * scale:+.1f} ± {d.half_width * scale:.1f}"


def _params(rs) -> str:
    """Parameters of the last (classification) stage's model ('–' if unknown)."""
    last = list(rs[0].get("stages", {}))[-1:]
    n = rs[0]["stages"][last[0]].get("num_params") if last else None
    return f"{n / 1e6:.3g}M" if n else "–"


def _state(rec) -> str:
    """Recurrent state per sequence: real numbers and float32 bytes ('–' if unknown)."""
    elements, nbytes = rec.get("state_elements"), rec.get("state_bytes")
    if elements is None or nbytes is None:
        return "–"
    for unit, size in (("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if nbytes >= size:
            return f"{elements:,} ({nbytes / size:.1f} {unit})"
    return f"{elements:,} ({nbytes} B)"


def _flops(rs) -> str:
    """Mean training FLOPs of runs `rs`, per stage where there are several ('–' if unknown)."""
    per_stage = {}
    for name in rs[0].get("stages", {}):
        vals = [(r["stages"][name].get("steps") or 0) * r["stages"][name]["flops_per_step"]
                for r in rs if r["stages"][name].get("flops_per_step")]
        if len(vals) != len(rs):
            return "–"
        per_stage[name] = float(np.mean(vals))
    if len(per_stage) == 1:
        return f"{sum(per_stage.values()):.2e}"
    text = ", ".join(f"{n} {v:.2e}" for n, v in per_stage.items())
    return f"{text} (total {sum(per_stage.values()):.2e})"


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


# ------------------------------------------------------------------------------------------------
# Plots.
# ------------------------------------------------------------------------------------------------

def _pyplot():
    return plotting.pyplot()


def _budgets(runs, regimes) -> dict:
    """{regime: its budget ('200 steps', '600 pretraining + 200 finetuning steps')}."""
    return {g: plotting.budget(next(r for r in runs if r["regime"] == g)) for g in regimes
            if any(r["regime"] == g for r in runs)}


def plot_bars(records, path: str, confidence: float = 0.95, data_fraction: float = 1.0) -> str:
    """Bar chart of mean test accuracy per model × regime, whiskers the table's t-interval
    (clipped to [0, 100]), every seed a dot, chance level dashed."""
    plt = _pyplot()
    test = group(records, "test_accuracy")
    runs = [r for r in _ok(records) if r.get("data_fraction", 1.0) == data_fraction]
    models = _ordered(r["model"] for r in records)
    regimes = _ordered((r["regime"] for r in records), REGIMES)
    budgets = _budgets(runs, regimes)
    width = 0.8 / max(len(regimes), 1)
    fig, ax = plt.subplots(figsize=(max(6.5, 1.4 * len(models) * max(len(regimes), 1) * 0.6),
                                    5.2))
    x = np.arange(len(models))
    seeds = sorted({r["seed"] for r in runs})
    for i, g in enumerate(regimes):
        ivs = [stats.mean_ci(test.get((data_fraction, m, g), []), confidence) for m in models]
        means = [100 * iv.mean if iv.n else 0.0 for iv in ivs]
        halves = [100 * iv.half_width if iv.n > 1 else 0.0 for iv in ivs]
        pos = x + (i - (len(regimes) - 1) / 2) * width
        ax.bar(pos, means, width, yerr=plotting.clipped_yerr(means, halves), capsize=3,
               label=f"{g} ({budgets.get(g, '?')})")
        for j, m in enumerate(models):
            # Individual seeds as dots, so n = 2 intervals are not read as precise.
            vals = test.get((data_fraction, m, g), [])
            ax.scatter([pos[j]] * len(vals), [100 * v for v in vals], s=8, color="black",
                       zorder=3)
    plotting.draw_chance(ax, plotting.chance_accuracy(runs))
    ax.set_xticks(x, models)
    ax.set_ylim(0, 102)  # a whisker clipped at 100% stays visible above the frame
    ax.set_ylabel("test accuracy (%)")
    data = plotting.data_label(data_fraction)
    ax.set_title(f"Test accuracy at the best validation checkpoint, {data}\nbar: mean of "
                 f"{len(seeds)} seeds (dots), whisker: {confidence:.0%} t-interval", fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    _save(fig, path)
    return path


def plot_curves(records, path: str, data_fraction: float = 1.0,
                confidence: float = 0.95) -> str | None:
    """Validation accuracy of the classification stage against its steps, one panel per regime
    (its budget in the title; regimes on one axis hid each other), one colour per model: mean
    over seeds with the table's t-interval as band, chance level dashed."""
    plt = _pyplot()
    runs = [r for r in _ok(records) if r.get("curve") and r.get("data_fraction", 1.0)
            == data_fraction]
    if not runs:
        return None
    models = _ordered(r["model"] for r in runs)
    regimes = _ordered((r["regime"] for r in runs), REGIMES)
    budgets = _budgets(runs, regimes)
    chance = plotting.chance_accuracy(runs)
    fig, axes = plt.subplots(1, len(regimes), figsize=(max(6.0, 4.2 * len(regimes) + 1), 4.3),
                             sharey=True, squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    seeds = set()
    for ax, g in zip(axes[0], regimes):
        for mi, m in enumerate(models):
            rs = [r for r in runs if r["model"] == m and r["regime"] == g]
            # Seeds evaluate at the same steps; keep the steps all of them have.
            steps = sorted(set.intersection(*(set(r["curve"]["step"]) for r in rs))) if rs else []
            if not steps:
                continue
            seeds |= {r["seed"] for r in rs}
            ys = np.array([[dict(zip(r["curve"]["step"], r["curve"]["accuracy"]))[s]
                            for s in steps] for r in rs]) * 100
            mean, lo, hi = plotting.mean_band(ys, confidence, 0.0, 100.0)
            color = colors[mi % len(colors)]
            ax.plot(steps, mean, color=color, label=f"{m} ({len(rs)} seeds)")
            ax.fill_between(steps, lo, hi, color=color, alpha=0.15, linewidth=0)
        plotting.draw_chance(ax, chance)
        ax.set_title(f"{g}\n{budgets.get(g, '')}", fontsize=9)
        ax.set_xlabel("finetuning (classification) steps")
        ax.set_ylim(0, 102)  # a whisker clipped at 100% stays visible above the frame
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("validation accuracy (%)")
    # One legend for every panel's lines: a model run in one regime only (a bag-of-pixels
    # control has no SPT) would otherwise draw an unlabelled line.
    handles = {}
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    axes[0][-1].legend(list(handles.values()), list(handles), fontsize=7, loc="lower right")
    fig.suptitle(f"Validation accuracy during classification training, "
                 f"{plotting.data_label(data_fraction)}\nmean of {len(seeds)} seeds, band: "
                 f"{confidence:.0%} t-interval", fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    return path


def plot_scaling(records, path: str, confidence: float = 0.95) -> str | None:
    """Mean test accuracy against the training data fraction (log axis), one line per model ×
    regime with t-interval whiskers clipped to [0, 100]; None with fewer than two fractions."""
    test = group(records, "test_accuracy")
    fractions = sorted({k[0] for k in test})
    if len(fractions) < 2:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    models = _ordered(k[1] for k in test)
    regimes = _ordered((k[2] for k in test), REGIMES)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-o", "--s", ":^", "-.v"]
    for (mi, m), (gi, g) in itertools.product(enumerate(models), enumerate(regimes)):
        ivs = [(f, stats.mean_ci(test.get((f, m, g), []), confidence)) for f in fractions]
        ivs = [(f, iv) for f, iv in ivs if iv.n]
        if not ivs:
            continue
        means = [100 * iv.mean for _, iv in ivs]
        ax.errorbar([f for f, _ in ivs], means, fmt=styles[gi % len(styles)],
                    yerr=plotting.clipped_yerr(
                        means, [100 * iv.half_width if iv.n > 1 else 0.0 for _, iv in ivs]),
                    color=colors[mi % len(colors)], capsize=3, label=f"{m} / {g}")
    plotting.draw_chance(ax, plotting.chance_accuracy(_ok(records)))
    ax.set_xscale("log")
    ax.set_xticks(fractions, [f"{f:.3g}" for f in fractions])
    ax.set_xticks([], minor=True)  # the log axis's own minor labels overprint the fractions
    ax.set_xlabel("training data fraction")
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(0, 102)  # a whisker clipped at 100% stays visible above the frame
    ax.set_title(f"Test accuracy against training data: mean ± {confidence:.0%} t-interval",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    _save(fig, path)
    return path


def _save(fig, path):
    """PNG of `fig` at `path` (`plotting.save_png`)."""
    plotting.save_png(fig, path)


def lr_selected(records) -> tuple[list[dict], list[dict]]:
    """`sweeps.select` plus the unfinished runs of every lr (so none goes unreported)."""
    shown, rows = sweeps.select(records)
    if rows:
        ids = {id(r) for r in shown}
        shown += [r for r in records if r.get("status") != "finished" and id(r) not in ids]
    return shown, rows


def write_report(records, workdir: str, title: str = "Comparison") -> dict:
    """Writes `comparison.md`, `accuracy.png` and `curves.png` (+ one pair per extra data
    fraction, and `scaling.png` across them), and `denoising.png` where runs pretrained, under
    `workdir`; returns {name: path}."""
    out = {"markdown": os.path.join(workdir, "comparison.md")}
    records, lr_rows = lr_selected(records)
    text = markdown(records, title)
    if lr_rows:
        text += "\n" + "\n".join(sweeps.markdown(lr_rows))
    # causal LM runs: length generalisation, equal compute; then the learning curves
    extra = [t for t in (probereport.markdown(records, chance=plotting.chance_accuracy(
                             _ok(records))), lmreport.markdown(records),
                         learning_curves.markdown(records), stops.markdown(records)) if t]
    results_lib.write_text(out["markdown"], "\n".join([text, *extra]))
    out.update(lmreport.write_plots(records, workdir, _save))
    out.update(learning_curves.write_plots(records, workdir, _save))
    for name, fn in (("frontier", probereport.plot_frontier),
                     ("steps_to_learn", probereport.plot_steps_to_learn)):
        png = fn(records, os.path.join(workdir, f"{name}.png"))
        if png:
            out[name] = png
    scaling = plot_scaling(records, os.path.join(workdir, "scaling.png"))
    if scaling:
        out["scaling"] = scaling
    fractions = sorted({r.get("data_fraction", 1.0) for r in records}, reverse=True)
    for frac in fractions:
        suffix = "" if frac == 1.0 else f"_frac{frac:g}"
        if any(r.get("data_fraction", 1.0) == frac for r in _ok(records)):
            out["bars" + suffix] = plot_bars(
                records, os.path.join(workdir, f"accuracy{suffix}.png"), data_fraction=frac)
        curves = plot_curves(records, os.path.join(workdir, f"curves{suffix}.png"),
                             data_fraction=frac)
        if curves:
            out["curves" + suffix] = curves
    return out
