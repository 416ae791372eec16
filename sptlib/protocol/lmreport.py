"""The language-modelling part of a comparison: length generalisation and equal compute.

`sptlib.protocol.compare` adds `record["lm"]` to every finished causal-LM run (`lm_record`: the
`sptlib.protocol.lmeval` results plus the validation curve); `sptlib.protocol.report` appends `markdown(records)`
and writes the plots of `write_plots(records, workdir)`:

  * bits per token (= bits per byte for byte tokens) of the best checkpoint on the same held-out
    text with windows of 1x … 16x the training length, mean ± 95% CI over seeds;
  * the same split by position bucket inside the window ([0, L), [L, 2L), …);
  * equal compute (the GSS paper's Table 2 compares at equal TPU-hours, not equal steps): every
    model's validation bits at the same compiled training FLOPs (XLA's count of one training step
    × steps) and at the same measured training seconds — the budget is the smallest total any
    model spent, and each curve is interpolated linearly there;
  * `length_generalisation.png` (bits vs evaluation length, one line per model) and
    `equal_compute.png` (validation bits vs training FLOPs).

No JAX here: this module only reads records.
"""

from __future__ import annotations

import collections
import json
import os

from etils import epath
import numpy as np

from sptlib.protocol import stats
from sptlib.train import results as results_lib

LM_TASKS = ("code_lm", "pg19", "lm1b", "arxiv")


def is_lm(config) -> bool:
    """True for a run whose last stage is a causal LM on an LM task."""
    last = config.stages[config.stage_order[-1]]
    return last.objective.kind == "causal" and config.data.task in LM_TASKS


def lm_record(config, workdir, factors, *, evaluate=True, log=print) -> dict | None:
    """`record["lm"]` of a finished run: lmeval results (cached in the run's lm_eval.json;
    computed unless `evaluate=False`) plus the validation curve and training cost."""
    stage = config.stage_order[-1]
    res = (results_lib.read_stage(os.path.join(workdir, stage))
           or results_lib.StageResults(stage=stage, status="absent"))
    cache = epath.Path(workdir) / "lm_eval.json"
    if cache.exists() and not evaluate:
        ev = json.loads(cache.read_text())
    elif evaluate:
        from sptlib.protocol import lmeval  # deferred: JAX
        try:
            ev = lmeval.evaluate_cached(config, workdir, tuple(factors))
        except Exception as e:  # pylint: disable=broad-except
            log(f"[compare] LM length evaluation of {workdir} failed: {type(e).__name__}: {e}")
            ev = {"factors": {}, "errors": {"all": f"{type(e).__name__}: {e}"}}
    else:
        ev = {"factors": {}, "errors": {}}
    metric = "bits_per_token"
    history = [(int(h["step"]), float(h[metric])) for h in res.history if metric in h]
    return dict(ev, history=history, steps=res.final_step,
                train_steps_per_s=res.train_steps_per_s, num_params=res.num_params,
                test_bits=res.metric("test", "best", metric))


def _lm_runs(records):
    return [r for r in records if r.get("status") == "finished" and r.get("lm")]


def _factor_key(k):
    return float(str(k).rstrip("x"))


def length_table(records, confidence=0.95):
    """{model: {factor key: [bits over seeds]}} and the sorted factor keys."""
    runs = _lm_runs(records)
    vals = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in runs:
        for k, v in r["lm"].get("factors", {}).items():
            vals[r["model"]][k].append(v["bits_per_token"])
    factors = sorted({k for m in vals.values() for k in m}, key=_factor_key)
    return vals, factors


def _interp_at(history, cost_per_step, budget):
    """Validation bits at `budget` cost units (linear in steps between evaluations)."""
    if not history or not cost_per_step:
        return None
    steps = np.array([h[0] for h in history], float)
    bits = np.array([h[1] for h in history], float)
    at = budget / cost_per_step
    if at < steps[0] - 1e-9 or at > steps[-1] + 1e-9:
        return None
    return float(np.interp(at, steps, bits))


def equal_compute(records):
    """Rows {model: {...}} with per-step FLOPs / seconds and validation bits at the common
    FLOP budget and at the common wall-clock budget (the smallest total of any model)."""
    runs = _lm_runs(records)
    per = {}
    for kind, cost_of in (("flops", lambda lm: lm.get("train_step_flops")),
                          ("seconds", lambda lm: (1.0 / lm["train_steps_per_s"])
                           if lm.get("train_steps_per_s") else None)):
        totals = [cost_of(r["lm"]) * r["lm"]["history"][-1][0] for r in runs
                  if cost_of(r["lm"]) and r["lm"].get("history")]
        if not totals:
            continue
        budget = min(totals)
        for r in runs:
            row = per.setdefault(r["model"], collections.defaultdict(list))
            c = cost_of(r["lm"])
            if c:
                row[f"{kind}_per_step"].append(c)
                v = _interp_at(r["lm"]["history"], c, budget)
                if v is not None:
                    row[f"bits_at_{kind}"].append(v)
            row["budget_" + kind] = budget
    for r in runs:
        row = per.setdefault(r["model"], collections.defaultdict(list))
        if r["lm"].get("history"):
            row["bits_final"].append(r["lm"]["history"][-1][1])
        if r["lm"].get("num_params"):
            row["params"].append(r["lm"]["num_params"])
    return per


def markdown(records, confidence=0.95) -> str:
    """The LM sections of comparison.md ('' when no run has LM results)."""
    runs = _lm_runs(records)
    if not runs:
        return ""
    vals, factors = length_table(records, confidence)
    models = list(dict.fromkeys(r["model"] for r in runs))
    lm0 = runs[0]["lm"]
    L = lm0.get("train_length")
    lines = ["## Language modelling: bits per token at longer windows", "",
             f"Best-validation checkpoint, trained at L = {L}, scored on the same "
             f"{lm0.get('eval_tokens')} held-out tokens ({lm0.get('split', 'test')} split) cut "
             "into windows of factor × L (bits per byte for byte tokens; lower is better); "
             f"mean ± {confidence:.0%} CI over seeds (n).", "",
             "| model | " + " | ".join(f"{f} ({int(_factor_key(f) * L)})" for f in factors)
             + " | 8x − 1x |", "|---" * (len(factors) + 2) + "|"]
    for m in models:
        cells = []
        for f in factors:
            iv = stats.mean_ci(vals[m].get(f, []), confidence)
            cells.append(f"{iv.format(1.0, 3)} ({iv.n})" if iv.n else "–")
        d = "–"
        if vals[m].get("8x") and vals[m].get("1x"):
            d = _signed(stats.diff_ci(vals[m]["8x"], vals[m]["1x"], confidence))
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {d} |")
    errors = {(r["model"], k): v for r in runs for k, v in r["lm"].get("errors", {}).items()}
    for (m, k), why in sorted(errors.items()):
        lines.append(f"\n{m} at {k}: not evaluated — {why}")
    lines.append("")
    # Position buckets at the longest factor.
    if factors:
        fmax = factors[-1]
        bucket_vals = collections.defaultdict(lambda: collections.defaultdict(list))
        for r in runs:
            for b, v in (r["lm"]["factors"].get(fmax, {}).get("buckets") or {}).items():
                bucket_vals[r["model"]][b].append(v)
        buckets = sorted({b for d in bucket_vals.values() for b in d},
                         key=lambda b: int(b.split("-")[0]))
        if buckets:
            lines += [f"### Bits per token by position in the {fmax} window", "",
                      "| model | " + " | ".join(buckets) + " |",
                      "|---" * (len(buckets) + 1) + "|"]
            for m in models:
                lines.append(f"| {m} | " + " | ".join(
                    stats.mean_ci(bucket_vals[m].get(b, []), confidence).format(1.0, 3)
                    for b in buckets) + " |")
            lines.append("")
    eq = equal_compute(records)
    if eq:
        lines += ["### Equal compute (validation bits per token)", "",
                  "Equal steps is the column *final*; *at equal FLOPs* / *at equal time* read every "
                  "model's validation curve at the smallest total any model spent (compiled "
                  "training-step FLOPs × steps; measured training seconds, on a shared machine).",
                  "", "| model | params | GFLOP/step | s/step | final (equal steps) | "
                  "at equal FLOPs | at equal time |", "|---|---|---|---|---|---|---|"]
        for m in models:
            row = eq.get(m, {})
            params = f"{int(np.mean(row['params'])):,}" if row.get("params") else "–"
            fl = f"{np.mean(row['flops_per_step']) / 1e9:.2f}" if row.get("flops_per_step") else "–"
            sec = (f"{np.mean(row['seconds_per_step']):.3f}" if row.get("seconds_per_step")
                   else "–")
            bits = [stats.mean_ci(row.get(k, []), confidence).format(1.0, 3)
                    for k in ("bits_final", "bits_at_flops", "bits_at_seconds")]
            lines.append(f"| {m} | {params} | {fl} | {sec} | " + " | ".join(bits) + " |")
        budgets = [f"{k}: {v:.4g}" for k, v in
                   next(iter(eq.values())).items() if k.startswith("budget_")]
        lines += ["", "Budgets (the smallest total): " + ", ".join(budgets) + ".", ""]
    return "\n".join(lines)


def _signed(d):
    if np.isnan(d.half_width):
        return f"{d.mean:+.3f}"
    return f"{d.mean:+.3f} ± {d.half_width:.3f}"


def write_plots(records, workdir, save) -> dict:
    """`length_generalisation.png` and `equal_compute.png` under `workdir` (via `save(fig,
    path)`); returns {name: path} of those written."""
    runs = _lm_runs(records)
    if not runs:
        return {}
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    vals, factors = length_table(records)
    L = runs[0]["lm"].get("train_length") or 1
    out = {}
    fig, ax = plt.subplots(figsize=(6, 4))
    for m, per in vals.items():
        fs = [f for f in factors if per.get(f)]
        ivs = [stats.mean_ci(per[f]) for f in fs]
        xs = [_factor_key(f) * L for f in fs]
        ax.errorbar(xs, [iv.mean for iv in ivs],
                    yerr=[0 if iv.n < 2 else iv.half_width for iv in ivs], marker="o",
                    capsize=3, label=m)
    ax.set_xscale("log", base=2)
    ax.axvline(L, color="grey", ls=":", lw=1)
    out["length_generalisation"] = _finish(
        fig, ax, "evaluation window (tokens); dotted: training length",
        "bits per token (held-out)", "Zero-shot length generalisation (mean ± 95% CI)",
        os.path.join(workdir, "length_generalisation.png"), save)
    curves = [r for r in runs if r["lm"].get("history") and r["lm"].get("train_step_flops")]
    if curves:
        fig, ax = plt.subplots(figsize=(6, 4))
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        models = list(dict.fromkeys(r["model"] for r in curves))
        for r in curves:
            i = models.index(r["model"])
            h = np.array(r["lm"]["history"], float)
            ax.plot(h[:, 0] * r["lm"]["train_step_flops"], h[:, 1], color=colors[i % 10],
                    label=r["model"] if r["seed"] == min(x["seed"] for x in curves
                                                         if x["model"] == r["model"]) else None)
        out["equal_compute"] = _finish(
            fig, ax, "training FLOPs (compiled step × steps)", "validation bits per token",
            "Equal compute: validation loss vs training FLOPs",
            os.path.join(workdir, "equal_compute.png"), save)
    return out


def _finish(fig, ax, xlabel, ylabel, title, path, save):
    """Labels, grid and legend of a report plot; saves it to `path` and returns the path."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, path)
    return path
