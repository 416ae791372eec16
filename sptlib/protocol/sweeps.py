"""The learning-rate axis of `sptlib.protocol.compare`: one run per lr, the lr chosen on validation.

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

`config.compare.lr_seeds = (0,)` (or `--lr_seeds=0`) makes the sweep cheaper: only those seeds
run every lr; every other seed runs once, at the lr that the sweep seeds' mean validation
accuracy chose for its cell (`resolve`, just before the run; the grid runs seed-major, so the
sweep seeds finish first). Only the sweep seeds' runs vote in the table too.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import math
import os
from typing import Sequence

PRETRAIN_KINDS = ("masked", "causal")
AUTO = "(auto)"  # the lr in a deferred spec's directory name, until `resolve` sets it


def lr_stages(cfg) -> list[str]:
    """The stages of `cfg.stage_order` the lr axis sets (every stage but denoising pretraining)."""
    return [s for s in cfg.stage_order if cfg.stages[s].objective.kind not in PRETRAIN_KINDS]


def apply_lr(cfg, lr: float) -> None:
    """Sets the lr of the classification stages to `lr`, in place: every other learning rate of
    those stages (`ssm_lr`, `ssm_dt_lr`) moves by the same factor, so the recipe's ratios hold.
    A None stays None (it follows `lr` / `ssm_lr` in `sptlib.train.optim`)."""
    for name in lr_stages(cfg):
        o = cfg.stages[name].optim
        old = float(o.lr)
        # From lr 0 there is no factor: the groups take `lr` itself (ratio 1).
        scale = (lambda v: float(v) * float(lr) / old) if old else (lambda v: float(lr))
        o.lr = float(lr)
        for key in ("ssm_lr", "ssm_dt_lr"):
            if o.get(key) is not None:
                o[key] = scale(o[key])


def lr_dir(cell_dir: str, lr) -> str:
    """`.../<regime>[-frac<f>]/seed<k>` -> `.../<regime>[-frac<f>]-lr<lr>/seed<k>`."""
    parent, seed = os.path.split(cell_dir)
    return os.path.join(f"{parent}-lr{lr if isinstance(lr, str) else format(lr, 'g')}", seed)


def expand_lrs(specs: Sequence, lrs: Sequence[float] | None,
               lr_seeds: Sequence[int] = ()) -> list:
    """Each spec once per lr (lr innermost, so a seed's cells finish before the next seed's);
    with `lr_seeds`, the other seeds' specs once each, their lr left to `resolve`."""
    if not lrs:
        return list(specs)
    out = []
    for spec in specs:
        if lr_seeds and spec.seed not in lr_seeds:
            out.append(dataclasses.replace(spec, lr_from=tuple(float(x) for x in lrs),
                                           lr_seeds=tuple(lr_seeds),
                                           workdir=lr_dir(spec.workdir, AUTO)))
            continue
        for lr in lrs:
            cfg = copy.deepcopy(spec.config)
            with cfg.unlocked():
                apply_lr(cfg, lr)
            out.append(dataclasses.replace(spec, config=cfg, lr=float(lr),
                                           workdir=lr_dir(spec.workdir, lr)))
    return out


def deferred(spec) -> bool:
    """A spec whose lr is still to be chosen from the sweep seeds' validation accuracy."""
    return bool(getattr(spec, "lr_from", ())) and spec.lr is None


def choose(scores: dict) -> float | None:
    """The lr of highest mean validation accuracy (`{lr: (mean, n)}`; ties: the smaller lr)."""
    voting = [lr for lr, (m, n) in scores.items() if n and not math.isnan(m)]
    return min(voting, key=lambda lr: (-scores[lr][0], lr)) if voting else None


def resolve(spec, specs: Sequence, val_accuracy):
    """`spec` with its lr chosen when it is `deferred` and every sweep run of its cell finished.

    `val_accuracy(spec) -> float | None` (None: not finished) reads a sweep run's validation
    accuracy; nothing else is read. Returns `spec` unchanged if it is not deferred or its sweep
    is not finished yet.
    """
    if not deferred(spec):
        return spec
    sweep = [s for s in specs if not getattr(s, "lr_from", ()) and s.lr in spec.lr_from
             and s.seed in spec.lr_seeds and (s.model, s.regime, s.data_fraction) ==
             (spec.model, spec.regime, spec.data_fraction)]
    vals = {s.workdir: val_accuracy(s) for s in sweep}
    if not sweep or any(v is None for v in vals.values()):
        return spec
    scores = {lr: (_mean([vals[s.workdir] for s in sweep if s.lr == lr]),
                   sum(1 for s in sweep if s.lr == lr)) for lr in spec.lr_from}
    lr = choose(scores)
    cfg = copy.deepcopy(spec.config)
    with cfg.unlocked():
        apply_lr(cfg, lr)
    parent, seed = os.path.split(spec.workdir)
    base = os.path.join(parent.removesuffix(f"-lr{AUTO}"), seed)
    return dataclasses.replace(spec, config=cfg, lr=lr, workdir=lr_dir(base, lr))


def waiting(specs: Sequence, val_accuracy, is_finished) -> list:
    """The deferred specs of `specs` whose lr sweep has finished and that have not run yet
    (resolved; `is_finished(workdir, stage_order)` as in `share_pretrain`)."""
    out = []
    for spec in specs:
        if deferred(spec):
            r = resolve(spec, specs, val_accuracy)
            if not deferred(r) and not is_finished(r.workdir, r.config.stage_order):
                out.append(r)
    return out


def steps(specs: Sequence) -> int:
    """Training steps of `specs`, a pretraining stage they share (`pretrain_key`) counted once."""
    seen, total = set(), 0
    for spec in specs:
        for name in spec.config.stage_order:
            key = pretrain_key(spec) if name == "pretrain" else None
            if key is None or key not in seen:
                total += int(spec.config.stages[name].get("num_steps", 1))
            seen.add(key)
    return total


def pretrain_key(spec):
    """Specs with equal keys run the same pretraining stage (the lr axis does not touch it)."""
    if "pretrain" not in spec.config.stage_order or spec.lr is None:
        return None
    return (spec.model, spec.regime, spec.seed, spec.data_fraction,
            spec.config.stages.pretrain.to_json())


def share_pretrain(spec, specs: Sequence, is_finished) -> str | None:
    """Links `spec.workdir/pretrain` to a finished, identical pretraining stage of another lr.

    Returns the linked directory, or None (nothing to share yet: the stage will be trained).
    `is_finished(workdir, stage_order)` is `sptlib.protocol.records.is_finished`.
    """
    key = pretrain_key(spec)
    target = os.path.join(spec.workdir, "pretrain")
    if key is None or os.path.lexists(target):
        return None
    for other in specs:
        if other is spec or pretrain_key(other) != key:
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

    Only finished records with a validation accuracy vote, and of those only the sweep seeds'
    (`lr_sweep`, when the grid has `lr_seeds`); the chosen lr has the highest mean validation
    accuracy over its seeds (ties: the smaller lr). Records without an lr pass through.

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
                    if r.get("status") == "finished" and r.get("val_accuracy") is not None
                    and r.get("lr_sweep", True)]
            scores[lr] = (_mean(vals), len(vals))
        chosen = choose(scores)
        if chosen is not None:
            kept += per_lr[chosen]
        rows.append({"data_fraction": frac, "model": model, "regime": regime, "lr": chosen,
                     "validation": dict(sorted(scores.items()))})
    ids = {id(r) for r in kept}
    return [r for r in records if id(r) in ids], rows  # in the grid's order


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
