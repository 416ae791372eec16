"""Reading a comparison run's results: `results.json` of the run and of its stages -> one record.

`sptlib.protocol.compare` writes one record per run to `comparison.json` (`make_record`); `sptlib.protocol.report`
reads them. The files are read through `sptlib.train.results` (no JAX). A results file that
cannot be parsed (truncated by a kill) is logged, naming it, and treated as absent, so the run
counts as unfinished and is run (resumed) again.
"""

from __future__ import annotations

import collections
import os
from typing import Callable, Sequence, TypeVar

from absl import logging

from sptlib.errors import ResultsDigestError, ResultsError
from sptlib.train import results as results_lib
from sptlib.train.results import RunResults, StageResults

T = TypeVar("T")


def _readable(read: Callable[[str], T | None], directory: str) -> T | None:
    try:
        return read(directory)
    except ResultsDigestError:
        raise
    except (OSError, ResultsError) as e:
        logging.warning("%s/results.json is unreadable (%s); the run counts as unfinished.",
                        directory, e)
        return None


def load_results(workdir: str) -> RunResults | None:
    """The run's summary (`workdir/results.json`, written by `sptlib.protocol.stages`), or None."""
    try:
        return _readable(results_lib.read_run, workdir)
    except ResultsDigestError as e:  # its stages' own (verified) files still count
        logging.warning("%s", e)
        return None


def _stage_results(summary: RunResults | None, workdir: str, name: str) -> StageResults:
    """A stage's results: `workdir/<stage>/results.json` (written by the trainer), else the entry
    the runner's summary holds for it, else `status="absent"`."""
    try:
        st = _readable(results_lib.read_stage, os.path.join(workdir, name))
    except ResultsDigestError as e:  # edited since: unfinished, so the run recomputes it
        logging.warning("%s; the run counts as unfinished.", e)
        return StageResults(stage=name, status="absent")
    if st is None and summary is not None:
        st = summary.stage(name)
    return st or StageResults(stage=name, status="absent")


def is_finished(workdir: str, stage_order: Sequence[str]) -> bool:
    """True when every stage of `stage_order` has results with status `finished`."""
    summary = load_results(workdir)
    return all(_stage_results(summary, workdir, name).finished for name in stage_order)


def _curve(stage: StageResults) -> dict | None:
    """Validation accuracy against step of one stage, from the `history` the trainer records."""
    pts = [(h.get("step"), h.get("accuracy")) for h in stage.history]
    pts = [(s, a) for s, a in pts if s is not None and a is not None]
    if not pts:
        return None
    return {"step": [int(p[0]) for p in pts], "accuracy": [float(p[1]) for p in pts]}


def make_record(spec, summary: RunResults | None, *, status: str, error: str = "",
                wall_time_s: float | None = None) -> dict:
    """One `comparison.json` record from a run's results and its `compare.RunSpec`."""
    order = list(spec.config.stage_order)
    rec = {"model": spec.model, "regime": spec.regime, "seed": spec.seed,
           "data_fraction": spec.data_fraction, "task": spec.config.data.task,
           "workdir": spec.workdir, "status": status, "stages": {}}
    if error:
        rec["error"] = error
    if getattr(spec, "spent_from", ""):  # equal compute: the SPT run whose steps it trains
        rec["steps_matched_to"] = spec.spent_from
    total_wall = 0.0
    for name in order:
        st = _stage_results(summary, spec.workdir, name)
        wall = st.wall_time()  # all invocations of a resumed stage
        rec["stages"][name] = {
            "steps": st.final_step,
            "wall_time_s": wall,
            "objective": spec.config.stages[name].objective.kind,
            "best_step": st.best_step,
            # Training to convergence: "patience" | "cap" (None: a fixed budget).
            "stop_reason": st.stop_reason,
            "best_metric": st.best_metric,
            "best_validation": st.validation.get("best"),
            "train_steps_per_s": st.train_steps_per_s,
            "num_params": st.num_params,
            # One train step on the global batch, counted from the traced step.
            "flops_per_step": st.flops_per_step,
        }
        if (st.init or {}).get("fallback"):  # init_fallback: not the best checkpoint upstream
            rec["stages"][name]["init_fallback"] = st.init["fallback"]
        total_wall += float(wall or 0.0)
    st = _stage_results(summary, spec.workdir, order[-1])  # the classification stage
    # The best-validation checkpoint's test accuracy (never the last checkpoint's).
    rec["test_accuracy"] = st.metric("test", "best", "accuracy")
    rec["val_accuracy"] = st.metric("validation", "best", "accuracy")
    rec["test_accuracy_last"] = st.metric("test", "last", "accuracy")
    rec["curve"] = _curve(st)
    rec["pretrain_steps"] = sum(int(rec["stages"][n]["steps"] or 0) for n in order[:-1])
    rec["state_elements"], rec["state_bytes"] = _state_size(spec.config)
    rec["wall_time_s"] = total_wall if total_wall else wall_time_s
    return rec


def _state_size(config):
    """(elements, bytes) of the model's recurrent state per sequence at the task's length
    (`sptlib.models.build.model_state_size`, float32 bytes), or (None, None) where a mixer
    declares none (a user's without `state_elements` / `initial_state`)."""
    # Deferred: the mixers' modules (Flax, JAX) load only when a record is made; reading
    # records (`load_results`, `group`) stays JAX-free.
    from sptlib import data as data_lib  # deferred (see above)
    from sptlib.models import build, resolve_model_config  # deferred (see above)
    try:
        m = resolve_model_config(config.model, data_lib.task_info(config.data), "cpu")
        size = build.model_state_size(m, length=int(m.max_length))
    except Exception as e:  # pylint: disable=broad-except  (a record never fails for it)
        logging.warning("state size of %s unknown (%s)", config.model.get("mixer"), e)
        return None, None
    return size.elements, size.bytes


def finished(records) -> list[dict]:
    """The records of runs that finished with a test accuracy."""
    return [r for r in records if r.get("status") == "finished"
            and r.get("test_accuracy") is not None]


def group(records, key="test_accuracy") -> dict:
    """{(data_fraction, model, regime): [values of `key` over seeds]} of finished runs."""
    out = collections.defaultdict(list)
    for r in finished(records):
        v = r.get(key)
        if v is not None:
            out[(r.get("data_fraction", 1.0), r["model"], r["regime"])].append(float(v))
    return out
