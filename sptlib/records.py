"""Reading a comparison run's results: `results.json` of the run and of its stages -> one record.

`sptlib.compare` writes one record per run to `comparison.json` (`make_record`); `sptlib.report`
reads them. A results file that cannot be parsed (truncated by a kill) is logged, naming it, and
treated as absent, so the run counts as unfinished and is run (resumed) again.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

from absl import logging
from etils import epath


def _get(d, *keys, default=None):
    """First present key of `keys` (each 'a.b' walks nested dicts)."""
    for key in keys:
        node = d
        for part in key.split("."):
            if isinstance(node, dict) and part in node:
                node = node[part]
            else:
                break
        else:
            return node
    return default


def load_results(workdir: str) -> dict | None:
    path = epath.Path(workdir) / "results.json"  # epath: gs:// workdirs too
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        logging.warning("%s is unreadable (%s); the run counts as unfinished.", path, e)
        return None


def _stage_results(results: dict | None, workdir: str, name: str) -> dict:
    """A stage's results: `workdir/<stage>/results.json` (written by the trainer), else the entry
    the pipeline's summary holds for it."""
    st = load_results(os.path.join(workdir, name))
    if st:
        return st
    results = results or {}
    for key in (f"stages.{name}", name):
        st = _get(results, key)
        if isinstance(st, dict):
            return st
    return {}


def is_finished(workdir: str, stage_order: Sequence[str]) -> bool:
    """True when every stage of `stage_order` has results with status `finished`."""
    summary = load_results(workdir)
    for name in stage_order:
        st = _stage_results(summary, workdir, name)
        if st.get("status") != "finished":
            return False
    return True


def _curve(stage: dict, stage_dir: str) -> dict | None:
    """Validation accuracy against step of one stage: from `history` in its results when the
    trainer records one, else from the TensorBoard events in `stage_dir`."""
    hist = _get(stage, "history", "validation_history")
    if hist:
        pts = [(h.get("step"), _get(h, "accuracy", "validation.accuracy")) for h in hist]
        pts = [(s, a) for s, a in pts if s is not None and a is not None]
        if pts:
            return {"step": [int(p[0]) for p in pts], "accuracy": [float(p[1]) for p in pts]}
    return curve_from_events(stage_dir, "validation/accuracy")


def curve_from_events(logdir: str, tag: str) -> dict | None:
    """Reads scalar `tag` from the TensorBoard event files in `logdir` ({step: [...], accuracy:
    [...]}, last value per step), or None."""
    d = epath.Path(logdir)
    if not d.is_dir() or not any(f.name.startswith("events.") for f in d.iterdir()):
        return None
    try:
        from tensorboard.backend.event_processing import event_accumulator
        from tensorboard.util import tensor_util
    except ImportError:
        return None
    acc = event_accumulator.EventAccumulator(logdir, size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    tags = acc.Tags()
    points = {}
    if tag in tags.get("tensors", []):
        for ev in acc.Tensors(tag):
            points[int(ev.step)] = float(tensor_util.make_ndarray(ev.tensor_proto))
    elif tag in tags.get("scalars", []):
        for ev in acc.Scalars(tag):
            points[int(ev.step)] = float(ev.value)
    if not points:
        return None
    steps = sorted(points)
    return {"step": steps, "accuracy": [points[s] for s in steps]}


def make_record(spec, results: dict | None, *, status: str, error: str = "",
                wall_time_s: float | None = None) -> dict:
    """One `comparison.json` record from a run's `results.json` and its `compare.RunSpec`."""
    order = list(spec.config.stage_order)
    rec = {"model": spec.model, "regime": spec.regime, "seed": spec.seed,
           "data_fraction": spec.data_fraction, "task": spec.config.data.task,
           "workdir": spec.workdir, "status": status, "stages": {}}
    if error:
        rec["error"] = error
    summary = results or {}
    total_wall = 0.0
    for name in order:
        st = _stage_results(summary, spec.workdir, name)
        wall = _get(st, "wall_time_total_s", "wall_time_s")  # all invocations of a resumed stage
        rec["stages"][name] = {
            "steps": _get(st, "final_step", "steps"),
            "wall_time_s": wall,
            "objective": spec.config.stages[name].objective.kind,
            "best_step": _get(st, "best_step"),
            "best_metric": _get(st, "best_metric"),
            "best_validation": _get(st, "validation.best"),
            "train_steps_per_s": _get(st, "train_steps_per_s"),
            "num_params": _get(st, "num_params"),
            # One train step on the global batch, counted from the traced step.
            "flops_per_step": _get(st, "flops_per_step"),
        }
        total_wall += float(wall or 0.0)
    cls = order[-1]  # the classification stage (finetune or scratch)
    st = _stage_results(summary, spec.workdir, cls)
    # The best-validation checkpoint's test accuracy (never the last checkpoint's).
    rec["test_accuracy"] = _get(st, "test.best.accuracy", "test_accuracy")
    rec["val_accuracy"] = _get(st, "validation.best.accuracy", "val_accuracy")
    rec["test_accuracy_last"] = _get(st, "test.last.accuracy")
    rec["curve"] = _curve(st, os.path.join(spec.workdir, cls)) if st else None
    rec["pretrain_steps"] = sum(int(rec["stages"][n]["steps"] or 0) for n in order[:-1])
    rec["wall_time_s"] = total_wall if total_wall else wall_time_s
    lg = summary.get("length_generalization")
    if lg:
        rec["length_generalization"] = lg
    return rec
