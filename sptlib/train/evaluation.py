"""Evaluation of one stage: a pass over a split, and the final validation / test of the last and
the best checkpoint that makes the stage's results."""

import math
import time

import jax

from sptlib.train import checkpoint_io
from sptlib.train import convergence
from sptlib.train import metrics as metrics_lib
from sptlib.train import sharding
from sptlib.train import steps
from sptlib.train.results import StageResults


def evaluator(task, built):
    """`evaluate(state, split, max_batches=0) -> metrics` over one pass of `split` of `task`
    with `built.eval_step`, at `built.resolved`'s per-process eval batch size."""
    resolved = built.resolved

    def evaluate(state, split, max_batches=0):
        it = task.make_iterator(split, batch_size=resolved.local_eval_batch_size,
                                seed=resolved.seed, shard_index=jax.process_index(),
                                shard_count=jax.process_count(), num_epochs=1,
                                drop_remainder=False)
        acc = None
        for i, batch in enumerate(it):
            if max_batches and i >= max_batches:
                break
            m = built.eval_step(state, sharding.shard_batch(batch, built.mesh, built.rules))
            if resolved.sync_each_step:
                jax.block_until_ready(m)
            acc = metrics_lib.accumulate(acc, m)
        return metrics_lib.summarize(acc)

    return evaluate


def final_evaluation(run, state) -> StageResults:
    """Validation and test metrics of the last and the best checkpoint of `run` (the loop's
    `_Run`); the stage's results (without `init`, `num_params`, `flops_per_step`,
    `stop_reason`)."""
    stage, name, step, evaluate = run.stage, run.name, run.step, run.evaluate
    rule = run.built.resolved  # the best-checkpoint rule
    train_rate = run.progress.rate()
    run.ckpt.wait_until_finished()
    last_val = run.last_val
    if last_val is None or last_val[0] != step:
        last_val = (step, evaluate(state, "validation", stage.eval_steps))
    last_metrics = {"validation": last_val[1], "test": evaluate(state, "test")}
    fingerprint = steps.params_fingerprint(state.params)
    best_step = run.ckpt.best_step()
    convergence.warn_missing_best(rule, run.name, run.history, run.ckpt, best_step)
    if best_step is None or best_step == step:
        best_step = step
        best_metrics = last_metrics
    else:
        best_state, _ = run.ckpt.restore(
            best_step, checkpoint_io.abstract_like(state, run.built.state_shardings))
        best_metrics = {"validation": evaluate(best_state, "validation", stage.eval_steps),
                        "test": evaluate(best_state, "test")}
        del best_state
    for which, ms in (("best", best_metrics), ("last", last_metrics)):
        for split, vals in ms.items():
            run.writer.write_scalars(step, metrics_lib.scalars_for_writer(
                f"{split}_{which}", vals))
    run.writer.flush()
    results = StageResults(
        stage=name, status="finished", final_step=step, best_step=int(best_step),
        best_metric=rule.best_metric, best_mode=rule.best_mode,
        validation={"best": best_metrics["validation"], "last": last_metrics["validation"]},
        test={"best": best_metrics["test"], "last": last_metrics["test"]},
        params_fingerprint=fingerprint, history=run.history, resumed_at_step=run.start_step,
        train_steps_per_s=train_rate if math.isfinite(train_rate) else None,
        wall_time_s=time.time() - run.t_start, wall_time_total_s=run.wall_total())
    m = rule.best_metric
    run.progress.finish(  # stdout (sptlib.main) and the log
        f"finished at step {step} in {metrics_lib.format_duration(results.wall_time_s)}: best "
        f"step {best_step} (validation {m}={best_metrics['validation'].get(m, math.nan):.4g}), "
        f"test {m} best={best_metrics['test'].get(m, math.nan):.4g} "
        f"last={last_metrics['test'].get(m, math.nan):.4g}.")
    return results
