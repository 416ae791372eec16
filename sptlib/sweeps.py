"""The learning-rate axis of `sptlib.compare`: one run per lr, the lr chosen on validation.

`config.compare.lrs = (1e-3, 2e-3, 4e-3)` (or `--lrs=1e-3,2e-3,4e-3`) trains every (model,
regime, data fraction, seed) cell at each learning rate. The lr is that of the classification
stages (`scratch`, `finetune`, and the other stages whose objective is not masked / causal
pretraining); the SSM parameters' lr (`optim.ssm_lr`) is scaled by the same factor, so their
ratio to the rest stays the recipe's. The denoising stage of SPT keeps the recipe's lr, so it does
not depend on the lr axis: the SPT cells of one seed share one pretraining run (`share_pretrain`
links the later cells' `pretrain/` to the first finished one instead of training it again).

Runs go to `DIR/<model>/<regime>[-frac<f>]-lr<lr>/seed<k>/`. The table (`select`) reports, per
(data fraction, model, regime), the test accuracy at the lr whose mean **validation** accuracy
over seeds is highest (ties: the smaller lr); test accuracies never enter the choice.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import math
import os
from typing import Sequence

PRETRAIN_KINDS = ("masked", "causal")


def lr_stages(cfg) -> list[str]:
    """The stages of `cfg.stage_order` the lr axis sets (every stage but denoising pretraining)."""
    return [s for s in cfg.stage_order if cfg.stages[s].objective.kind not in PRETRAIN_KINDS]


def apply_lr(cfg, lr: float) -> None:
    """Sets the lr of the classification stages to `lr` (SSM lr scaled alike), in place."""
    for name in lr_stages(cfg):
        o = cfg.stages[name].optim
        ratio = float(o.ssm_lr) / float(o.lr) if float(o.lr) else 1.0
        o.lr = float(lr)
        o.ssm_lr = float(lr) * ratio


def lr_dir(cell_dir: str, lr: float) -> str:
    """`.../<regime>[-frac<f>]/seed<k>` -> `.../<regime>[-frac<f>]-lr<lr>/seed<k>`."""
    parent, seed = os.path.split(cell_dir)
    return os.path.join(f"{parent}-lr{lr:g}", seed)


def expand_lrs(specs: Sequence, lrs: Sequence[float] | None) -> list:
    """Each spec once per lr (lr innermost, so a seed's cells finish before the next seed's)."""
    if not lrs:
        return list(specs)
    out = []
    for spec in specs:
        for lr in lrs:
            cfg = copy.deepcopy(spec.config)
            with cfg.unlocked():
                apply_lr(cfg, lr)
            out.append(dataclasses.replace(spec, config=cfg, lr=float(lr),
                                           workdir=lr_dir(spec.workdir, lr)))
    return out


def _pretrain_key(spec):
    """Specs with equal keys run the same pretraining stage (the lr axis does not touch it)."""
    if "pretrain" not in spec.config.stage_order or spec.lr is None:
        return None
    return (spec.model, spec.regime, spec.seed, spec.data_fraction,
            spec.config.stages.pretrain.to_json())


def share_pretrain(spec, specs: Sequence, is_finished) -> str | None:
    """Links `spec.workdir/pretrain` to a finished, identical pretraining stage of another lr.

    Returns the linked directory, or None (nothing to share yet: the stage will be trained).
    `is_finished(workdir, stage_order)` is `sptlib.records.is_finished`.
    """
    key = _pretrain_key(spec)
    target = os.path.join(spec.workdir, "pretrain")
    if key is None or os.path.lexists(target):
        return None
    for other in specs:
        if other is spec or _pretrain_key(other) != key:
            continue
        source = os.path.join(other.workdir, "pretrain")
        if os.path.islink(source) or not is_finished(other.workdir, ("pretrain",)):
            continue
        os.makedirs(spec.workdir, exist_ok=True)
        os.symlink(os.path.relpath(source, spec.workdir), target)
        return source
    return None


# ------------------------------------------------------------------------------------------------
# Choosing the lr on validation.


def _mean(values):
    xs = [v for v in values if v is not None and not math.isnan(v)]
    return sum(xs) / len(xs) if xs else math.nan


def select(records: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """Keeps, per (data fraction, model, regime), the records of the lr chosen on validation.

    Only finished records with a validation accuracy vote; the chosen lr has the highest mean
    validation accuracy over its seeds (ties: the smaller lr). Records without an lr pass through.

    Returns:
      (the kept records, one row per cell: data_fraction, model, regime, chosen lr and per lr
      `{lr: (mean validation accuracy, seeds)}`).
    """
    by_cell = collections.defaultdict(lambda: collections.defaultdict(list))
    plain = []
    for r in records:
        if r.get("lr") is None:
            plain.append(r)
            continue
        by_cell[(r.get("data_fraction", 1.0), r["model"], r["regime"])][float(r["lr"])].append(r)
    kept, rows = list(plain), []
    for (frac, model, regime), per_lr in by_cell.items():
        scores = {}
        for lr, recs in per_lr.items():
            vals = [r["val_accuracy"] for r in recs
                    if r.get("status") == "finished" and r.get("val_accuracy") is not None]
            scores[lr] = (_mean(vals), len(vals))
        voting = [lr for lr, (m, n) in scores.items() if n and not math.isnan(m)]
        chosen = min(voting, key=lambda lr: (-scores[lr][0], lr)) if voting else None
        if chosen is not None:
            kept += per_lr[chosen]
        rows.append({"data_fraction": frac, "model": model, "regime": regime, "lr": chosen,
                     "validation": dict(sorted(scores.items()))})
    return kept, rows


def markdown(rows: Sequence[dict], records: Sequence[dict] = (), pct: float = 100.0) -> list[str]:
    """The lr-selection section: per cell the mean validation accuracy at each lr, the choice."""
    if not rows:
        return []
    lrs = sorted({lr for row in rows for lr in row["validation"]})
    fracs = {row["data_fraction"] for row in rows}
    head = (["fraction"] if len(fracs) > 1 else []) + ["model", "regime"]
    lines = ["## Learning rate chosen on validation", "",
             "Mean validation accuracy (%) over finished seeds at each learning rate (seeds in "
             "brackets); **bold** is the lr the tables above report (highest mean validation "
             "accuracy; test accuracy never enters the choice).", "",
             "| " + " | ".join(head + [f"lr {lr:g}" for lr in lrs]) + " | chosen |",
             "|---" * (len(head) + len(lrs) + 1) + "|"]
    for row in sorted(rows, key=lambda r: (-r["data_fraction"],)):
        cells = [f"{row['data_fraction']:g}"] if len(fracs) > 1 else []
        cells += [row["model"], row["regime"]]
        for lr in lrs:
            m, n = row["validation"].get(lr, (math.nan, 0))
            text = "–" if not n else f"{m * pct:.1f} ({n})"
            cells.append(f"**{text}**" if lr == row["lr"] and n else text)
        cells.append("–" if row["lr"] is None else f"{row['lr']:g}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]
