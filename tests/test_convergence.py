"""Training to convergence (sptlib.train.convergence): a stage stops when validation stopped
improving for `patience` evaluations, and a resumed stage stops at the same step.

Truths: stop steps hand-computed from a forced validation-accuracy sequence (the evaluator is
replaced by one that returns a fixed accuracy per step); for a real tiny run, the stop step
recomputed from its own history.json by a naive loop written here; a killed-and-rerun stage
compared with an uninterrupted one.
"""

import jax
import pytest

from sptlib.errors import ConfigError
from sptlib.protocol import stages
from sptlib.train import config as config_lib
from sptlib.train import convergence
from sptlib.train import evaluation
from sptlib.train import loop
from sptlib.train import results as results_lib

from tests.test_loop import _tiny_config

# Validation accuracy after each step that is evaluated (eval_every 2): best 0.6 at step 4,
# then 0.58, 0.55, 0.59, 0.9 (too late for patience 3).
FORCED = {2: 0.5, 4: 0.6, 6: 0.58, 8: 0.55, 10: 0.59, 12: 0.9, 14: 0.95, 16: 0.96}


def _h(*values, metric="accuracy"):
    return [{"step": 10 * (i + 1), metric: v} for i, v in enumerate(values)]


def test_evaluations_without_improvement_by_hand():
    count = convergence.evaluations_without_improvement
    assert count(_h(0.1, 0.2, 0.3), "accuracy", "max") == 0
    assert count(_h(0.1, 0.3, 0.3, 0.2), "accuracy", "max") == 2  # equal is no improvement
    assert count(_h(0.1, 0.3, 0.305, 0.309), "accuracy", "max", min_delta=0.01) == 2
    assert count(_h(2.0, 1.0, 1.5, 0.9, metric="loss"), "loss", "min") == 0
    assert count(_h(2.0, 1.0, 1.5, float("nan"), metric="loss"), "loss", "min") == 2
    assert count([], "accuracy", "max") == 0


def _stage(patience, num_steps=16, metric="accuracy", mode="max", min_delta=0.0):
    s = config_lib.stage_config(patience=patience, num_steps=num_steps, best_metric=metric,
                                best_mode=mode, min_delta=min_delta)
    return s


def test_should_stop_and_reason():
    hist = [{"step": s, "accuracy": a} for s, a in FORCED.items() if s <= 10]
    assert convergence.should_stop(hist, _stage(3))  # 6, 8, 10 did not beat 0.6 (step 4)
    assert not convergence.should_stop(hist, _stage(4))
    assert not convergence.should_stop(hist, _stage(0))  # a fixed budget never stops early
    assert convergence.stop_reason(hist, _stage(3), final_step=10) == "patience"
    assert convergence.stop_reason(hist, _stage(4), final_step=16) == "cap"
    assert convergence.stop_reason(hist, _stage(0), final_step=16) is None


def test_bad_patience_is_a_config_error():
    c = config_lib.base_config()
    c.stages.pretrain.patience = -1
    with pytest.raises(ConfigError, match="stages.pretrain.patience must be >= 0"):
        config_lib.validate(c)


def _forced_evaluator(monkeypatch, crash_at=None):
    """Replaces the stage's evaluator by one returning FORCED[step] as validation accuracy (and
    test accuracy); with `crash_at`, the first validation at that step raises (a kill)."""
    crashed = []

    def fake(task, built):
        def evaluate(state, split, max_batches=0):
            step = int(jax.device_get(state.step))
            if split == "validation" and step == crash_at and not crashed:
                crashed.append(step)
                raise RuntimeError("killed")
            return {"accuracy": FORCED.get(step, 0.0), "loss": 1.0 - FORCED.get(step, 0.0)}
        return evaluate

    monkeypatch.setattr(evaluation, "evaluator", fake)
    return crashed


def _scratch_config(tmp_path, patience=3, num_steps=16):
    c = _tiny_config(tmp_path / "lra")
    s = c.stages.scratch
    s.batch_size, s.eval_batch_size = 8, 16
    s.num_steps, s.eval_every, s.checkpoint_every, s.log_every = num_steps, 2, 2, 2
    s.patience, s.keep = patience, 1
    c.stage_order = ("scratch",)
    return c


def test_stops_at_the_hand_computed_evaluation(tmp_path, monkeypatch):
    _forced_evaluator(monkeypatch)
    stages.run(_scratch_config(tmp_path, patience=3), tmp_path / "wd")
    res = results_lib.read_stage(tmp_path / "wd" / "scratch")
    # Best 0.6 at step 4; steps 6, 8, 10 do not beat it: patience 3 runs out at step 10.
    assert (res.final_step, res.best_step, res.stop_reason) == (10, 4, "patience")
    assert [h["step"] for h in res.history] == [2, 4, 6, 8, 10]
    assert res.metric("test", "best", "accuracy") == pytest.approx(0.6)
    # The stage is finished: a rerun does not train on toward the cap.
    again = loop.train_stage(_scratch_config(tmp_path, patience=3), "scratch", tmp_path / "wd")
    assert again.final_step == 10


def test_patience_never_reached_stops_at_the_cap(tmp_path, monkeypatch):
    _forced_evaluator(monkeypatch)
    stages.run(_scratch_config(tmp_path, patience=4, num_steps=12), tmp_path / "wd")
    res = results_lib.read_stage(tmp_path / "wd" / "scratch")
    assert (res.final_step, res.best_step, res.stop_reason) == (12, 12, "cap")


# crash_at=10 resumes mid-way too (from 8); 8 resumes two evaluations before the stop (slow).
@pytest.mark.parametrize("crash_at", [pytest.param(8, marks=pytest.mark.slow), 10])
def test_killed_stage_resumes_to_the_same_stop(tmp_path, monkeypatch, crash_at):
    """Killed during the evaluation of step 8 (resumes from the checkpoint of step 6) or of the
    stopping step 10 (resumes from 8): the rerun stops at step 10 like an uninterrupted run."""
    crashed = _forced_evaluator(monkeypatch, crash_at=crash_at)
    with pytest.raises(Exception):
        stages.run(_scratch_config(tmp_path, patience=3), tmp_path / "wd")
    assert crashed == [crash_at]
    assert results_lib.read_stage(tmp_path / "wd" / "scratch") is None
    out = stages.run(_scratch_config(tmp_path, patience=3), tmp_path / "wd")
    res = out["stages"]["scratch"]
    assert res.init["kind"] == "resume" and res.resumed_at_step == crash_at - 2
    assert (res.final_step, res.best_step, res.stop_reason) == (10, 4, "patience")
    assert [h["step"] for h in res.history] == [2, 4, 6, 8, 10]


def test_killed_after_the_stopping_checkpoint_trains_no_further(tmp_path, monkeypatch):
    """Killed after step 10's evaluation and checkpoint, before results.json: the rerun resumes
    from step 10 and, its history showing convergence, goes straight to the final evaluation."""
    _forced_evaluator(monkeypatch)
    final = evaluation.final_evaluation
    calls = []

    def crash_once(run, state):
        if not calls:
            calls.append(run.step)
            raise RuntimeError("killed")
        return final(run, state)

    monkeypatch.setattr(evaluation, "final_evaluation", crash_once)
    with pytest.raises(Exception):
        stages.run(_scratch_config(tmp_path, patience=3), tmp_path / "wd")
    assert calls == [10]
    res = stages.run(_scratch_config(tmp_path, patience=3), tmp_path / "wd")["stages"]["scratch"]
    assert (res.resumed_at_step, res.final_step, res.stop_reason) == (10, 10, "patience")


def test_real_tiny_run_stops_where_its_own_history_says(tmp_path):
    """A real pretraining run (masked denoising, validation loss) with patience 1 and a tiny
    lr: the stop step must be the first evaluation not below the best loss before it, computed
    here from its history.json."""
    c = _tiny_config(tmp_path / "lra")
    s = c.stages.pretrain
    s.num_steps, s.eval_every, s.checkpoint_every, s.log_every = 40, 2, 2, 2
    s.patience, s.keep, s.eval_steps = 1, 1, 1
    c.stage_order = ("pretrain",)
    stages.run(c, tmp_path / "wd")
    res = results_lib.read_stage(tmp_path / "wd" / "pretrain")
    history = results_lib.read_json(tmp_path / "wd" / "pretrain" / "history.json")
    losses = [h["loss"] for h in history]
    expected = None
    for i in range(1, len(losses)):
        if not losses[i] < min(losses[:i]):
            expected = history[i]["step"]
            break
    if expected is None:  # never stalled within the cap
        assert (res.final_step, res.stop_reason) == (40, "cap")
    else:
        assert (res.final_step, res.stop_reason) == (expected, "patience")
        assert history[-1]["step"] == expected


def test_missing_best_warns_only_when_the_kept_checkpoint_scores_worse(caplog):
    """Validation accuracy ties (1.0 at steps 100 and 200) and orbax keeps the later checkpoint:
    no warning (the quickstart printed one per seed). A genuinely better, deleted checkpoint
    still warns, naming its step."""
    import types
    rule = types.SimpleNamespace(best_metric="accuracy", best_mode="max")
    ckpt = types.SimpleNamespace(all_steps=lambda: [200, 300], directory="/wd/ckpt")
    tie = [{"step": 100, "accuracy": 1.0}, {"step": 200, "accuracy": 1.0},
           {"step": 300, "accuracy": 0.9}]
    with caplog.at_level("WARNING"):
        convergence.warn_missing_best(rule, "scratch", tie, ckpt, 200)
    assert "gone" not in caplog.text
    worse = [{"step": 100, "accuracy": 1.0}, {"step": 200, "accuracy": 0.95},
             {"step": 300, "accuracy": 0.9}]
    with caplog.at_level("WARNING"):
        convergence.warn_missing_best(rule, "scratch", worse, ckpt, 200)
    assert "step 100" in caplog.text and "gone" in caplog.text
