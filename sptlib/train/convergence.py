"""Training to convergence: stop a stage when validation has stopped improving.

A stage with `patience > 0` stops after the evaluation at which its `best_metric` (classification:
validation accuracy, max; denoising: validation loss, min) has not improved by more than
`min_delta` on the best value so far for `patience` evaluations in a row; `num_steps` is then the
cap (the schedule still decays over it). `patience = 0` trains exactly `num_steps`. The best
checkpoint is kept as always (`sptlib.train.checkpoint`), and `results.json` records where and why
the stage stopped (`stop_reason`: "patience" | "cap"). `score_of` is the best-checkpoint rule
itself: a validation metric signed by `best_mode` so that larger is better, as every checkpoint's
`score` records it.

The decision depends only on the validation history (`history.json`, also saved in every
checkpoint), so a killed stage resumed from its latest checkpoint stops at the same step: the
training steps and evaluations it recomputes are the same, and a stage killed after its stopping
evaluation (but before its results were written) resumes straight into its final evaluation.
"""

from __future__ import annotations

import math
from typing import Sequence

from absl import logging

PATIENCE = "patience"
CAP = "cap"


def score_of(metrics: dict, best_metric: str, best_mode: str) -> float:
    """The checkpoint score (larger = better) of validation `metrics`; -inf if missing/non-finite."""
    value = metrics.get(best_metric)
    if value is None or not math.isfinite(float(value)):
        return -math.inf
    return float(value) if best_mode == "max" else -float(value)


def evaluations_without_improvement(history: Sequence[dict], metric: str, mode: str,
                                    min_delta: float = 0.0) -> int:
    """How many evaluations of `history` (`[{"step": s, metric: v}]`, in step order) came after
    the last one that improved the best `metric` so far by more than `min_delta` (the first
    evaluation always improves; non-finite values never do)."""
    best, since = None, 0
    for h in history:
        v = h.get(metric)
        v = None if v is None or not math.isfinite(float(v)) else float(v)
        better = v is not None and (best is None or (
            v > best + min_delta if mode == "max" else v < best - min_delta))
        if better:
            best, since = v, 0
        else:
            since += 1
    return since


def should_stop(history: Sequence[dict], stage) -> bool:
    """True when the stage (`patience`, `min_delta`, `best_metric`, `best_mode`) has converged
    by its validation `history`."""
    patience = int(stage.patience or 0)
    if patience <= 0 or not history:
        return False
    return evaluations_without_improvement(history, stage.best_metric, stage.best_mode,
                                           float(stage.min_delta or 0.0)) >= patience


def stop_reason(history: Sequence[dict], stage, final_step: int) -> str | None:
    """Why a finished stage stopped: "patience" (converged before the cap), "cap" (a stage
    training to convergence reached `num_steps`), None (a fixed-budget stage)."""
    if int(stage.patience or 0) <= 0:
        return None
    if final_step < int(stage.num_steps) and should_stop(history, stage):
        return PATIENCE
    return CAP


def validate(name: str, stage) -> str | None:
    """An error message for bad convergence fields of stage `name`, or None."""
    if int(stage.patience or 0) < 0:
        return f"config.stages.{name}.patience must be >= 0 (0 = a fixed budget), got " \
               f"{stage.patience}"
    if float(stage.min_delta or 0.0) < 0:
        return f"config.stages.{name}.min_delta must be >= 0, got {stage.min_delta}"
    return None


def warn_missing_best(rule, name, history, ckpt, best_step) -> None:
    """Warns when the history's best evaluation (by `rule`'s best_metric / best_mode) has no
    checkpoint any more (deleted or moved aside): "best" is then the best of the checkpoints
    that exist (`best_step`); the history keeps the truth."""
    # Of equal scores, the latest step: the one the manager kept (it prunes the earlier of
    # equals itself), so the warning names the step that went missing, not one pruned by design.
    scored = [(score_of(h, rule.best_metric, rule.best_mode), h["step"])
              for h in history if rule.best_metric in h]
    if not scored:
        return
    score, truth = max(scored)
    if truth == best_step or truth in ckpt.all_steps() or not math.isfinite(score):
        return
    if any(h["step"] == best_step and score_of(h, rule.best_metric, rule.best_mode) == score
           for h in history if rule.best_metric in h):
        return  # a tie: the checkpoint kept scored as well (orbax keeps the later of equals)
    value = next(h[rule.best_metric] for h in history if h["step"] == truth)
    logging.warning("[%s] the best checkpoint, step %d (validation %s=%.4g in history.json), is "
                    "gone from %s (deleted or moved aside): best_step is recomputed among the "
                    "checkpoints that exist (step %s); history.json keeps step %d's metrics.",
                    name, truth, rule.best_metric, value, ckpt.directory, best_step, truth)
