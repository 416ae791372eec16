"""The training loop of one stage: restore, train with periodic evaluation and checkpoints, test.

`train_stage(config, stage_name, workdir)` runs `config.stages[stage_name]` in `workdir/<stage>/`:

    checkpoints/          orbax checkpoints (sptlib.train.checkpoint): state + data iterator state
                          (+ the validation history and wall time so far) + their digest
    events.out.tfevents*  TensorBoard scalars (metrics.EventWriter): train/*, validation/*, test_*/*
    config.json           the full resolved config the stage first ran with (never overwritten;
                          a resume with another config adds config.step<N>.json, see guards)
    inputs.json           what the stage was initialised from (init_from: checkpoint, fingerprint)
    resolved.json         the resolved stage it runs as (sptlib.train.resolve: platform, mesh,
                          rules, batch shapes, dtype, attention kernel), rewritten at each start
    results.json          final/best step, validation and test metrics of the best and the last
                          checkpoint, wall time, params_fingerprint (see `train_stage`)
    history.json          validation metrics at every evaluation ([{"step": s, metric: v}])
    profile/              jax.profiler trace when `profile.start_step > 0`

Restore priority (`restore`): own latest checkpoint (full resume, data iterator included) >
`init_from` (parameters only, `dont_load` patterns kept fresh) > random init.

Divergence: a checkpoint is saved only after the training loss up to its step is finite and its
parameters are finite; a checkpoint whose own loss is not yet known (the next step's training
loss, or its validation loss) is "unconfirmed" until it is. When the loss or the parameters turn
non-finite, the unconfirmed checkpoints are moved to `checkpoints/diverged/`, `results.json` says
`diverged` with the last confirmed step, and `NonFiniteLossError` is raised (exit 2): no
checkpoint left to resume holds a diverged state, and a diverged run is never "finished".
"""

import dataclasses
import math
import sys
import time

from absl import logging
from etils import epath
import jax

from sptlib import data as data_lib
from sptlib import errors
from sptlib.errors import NonFiniteLossError, PreemptedError, ResultsError  # noqa: F401
from sptlib.train import checkpoint as ckpt_lib
from sptlib.train import convergence
from sptlib.train import guards
from sptlib.train import metrics as metrics_lib
from sptlib.train import results as results_lib
from sptlib.train import setup
from sptlib.train import sharding
from sptlib.train import steps
from sptlib.train import transfer
from sptlib.train.results import RESULTS_FILE, StageResults
from sptlib.train import resolve
from sptlib.train.sharding import is_main_process

CONFIG_FILE = "config.json"
HISTORY_FILE = "history.json"


def _write_json(path: epath.Path, obj):
    if is_main_process():
        results_lib.write_json(path, obj)


def train_stage(config, stage_name: str, workdir) -> StageResults:
    """Runs one stage; returns its results (also written to `workdir/<stage>/results.json`;
    the fields are `sptlib.train.results.StageResults`'s).

    Raises:
      NonFiniteLossError: NaN/inf loss or parameters (only confirmed-finite checkpoints kept).
      PreemptedError: SIGTERM / SIGINT / preemption (a checkpoint of the current step was saved).
      IncompatibleCheckpointError: `init_from` does not fit the model.
      WriteError: disk full, file-size limit, unwritable path (one line naming the file).
    """
    try:
        return _train_stage(config, stage_name, workdir)
    except errors.SptlibError:
        raise
    except Exception as e:  # disk full / ulimit -f, however orbax or TensorFlow wrapped it
        found = errors.find_write_error(e, ckpt_lib.absolute(workdir) / stage_name)
        if found is None:
            raise
        raise found from e


def _train_stage(config, stage_name, workdir):
    t_start = time.time()
    stage = config.stages[stage_name]
    workdir = ckpt_lib.absolute(workdir)  # orbax needs absolute local paths
    stage_dir = workdir / stage_name
    guards.check_inputs(config, stage_name, workdir)  # upstream changed: start afresh
    previous = results_lib.read_stage(stage_dir)
    if previous and previous.finished and (previous.final_step == int(stage.num_steps) or
                                           previous.stop_reason == convergence.PATIENCE):
        logging.info("[%s] already finished (%s); not training again.", stage_name,
                     stage_dir / RESULTS_FILE)
        if is_main_process():
            guards.warn_finished_changes(config, stage_name, stage_dir)
        return previous

    task = data_lib.get_task(config.data)
    local_bs, local_eval_bs = setup.local_batch_sizes(config, stage_name)
    seed = setup.stage_seed(config, stage_name)
    train_iter = task.make_iterator("train", batch_size=local_bs, seed=seed,
                                    shard_index=jax.process_index(),
                                    shard_count=jax.process_count())
    built = setup.build_stage(config, stage_name, example_batch=setup.peek(train_iter),
                              info=task.info)
    layout_before = guards.previous_layout(stage_dir)
    if is_main_process():
        guards.check_space(stage_dir, built.state)
        stage_dir.mkdir(parents=True, exist_ok=True)
        _write_json(stage_dir / resolve.RESOLVED_FILE, built.resolved.to_json())
    ckpt = ckpt_lib.StageCheckpointer(stage_dir / ckpt_lib.CHECKPOINTS_DIR, keep=stage.keep,
                                      async_saves=stage.async_checkpoints)
    writer = metrics_lib.create_writer(stage_dir, is_main=is_main_process())
    stop = guards.StopFlag().install()
    run = None
    failed = True
    try:
        state, init_info = restore(built, ckpt, train_iter, workdir)
        guards.note_layout(init_info, layout_before, built.resolved, stage_name)
        if is_main_process():
            guards.record_start(config, stage_name, stage_dir, init_info)
        run = _Run(built, stage_dir, ckpt, writer, train_iter,
                   _evaluator(task, built, local_eval_bs), t_start)
        state = run.train(state, stop)
        results = dataclasses.replace(
            final_evaluation(run, state), init=init_info, num_params=built.num_params,
            flops_per_step=setup.train_step_flops(built, strict=False))
        _write_json(stage_dir / RESULTS_FILE, results.to_json())
        failed = False
        if stop.requested:  # during the last step / final evaluation: finished, saved, stop
            raise stop.error(f"[{stage_name}] finished, then stopped", "run it again to go on.")
        return results
    finally:
        if run is not None:
            run.stop_profiler()
        stop.uninstall()
        # Never leave with a save in flight (MaxText): a half-written latest checkpoint would
        # cost the next run a fallback.
        try:
            ckpt.close()
            writer.close()
        except Exception:  # pylint: disable=broad-except
            if not failed:
                raise  # e.g. the last async save hit a full disk
            logging.warning("[%s] closing the checkpointer after an error failed too (%s).",
                            stage_name, errors.one_line(sys.exc_info()[1]))


def restore(built: setup.Stage, ckpt, train_iter, workdir):
    """The stage's starting state, by priority: own latest checkpoint (full resume, data
    iterator included) > `init_from` (parameters only, `dont_load` patterns kept fresh) > the
    random init in `built.state`. Returns `(state, init_info)`."""
    name, stage, state = built.name, built.cfg, built.state
    restored = ckpt.restore_latest(ckpt_lib.abstract_like(state, built.state_shardings),
                                   stage=name,
                                   start_over=stage.get("start_over_if_unreadable", False))
    if restored is not None:
        state, iterator_state, restored_step = restored
        train_iter.set_state(iterator_state)
        logging.info("[%s] resuming from its checkpoint at step %d.", name, restored_step)
        return state, {"kind": "resume", "step": int(restored_step),
                       "quarantined": ckpt.quarantined}
    if not stage.init_from:
        logging.info("[%s] random init (seed %d), %d parameters.", name, built.seed,
                     built.num_params)
        # Unreadable checkpoints moved aside, if any (a start over the user asked for).
        return state, {"kind": "random", "seed": built.seed, "quarantined": ckpt.quarantined}
    if stage.init_from in built.config.stages:
        source = results_lib.read_stage(workdir / stage.init_from)
        if not source or not source.finished:
            logging.warning("[%s] init_from stage %r has not finished (%s); using its %s "
                            "checkpoint so far.", name, stage.init_from,
                            source.status if source else "no results.json",
                            stage.init_checkpoint)
    step_dir = transfer.resolve_init_checkpoint(stage.init_from, workdir, stage.init_checkpoint)
    source = guards.upstream(built.config, name, workdir) or {}
    params, model_state, report = transfer.load_pretrained(
        step_dir, state.params, state.model_state, dont_load=tuple(stage.dont_load))
    logging.info("[%s] initialised from %s (%d tensors loaded; fresh: %s; skipped: %s).",
                 name, step_dir, len(report["loaded"]), report["not_loaded"],
                 report["skipped_from_checkpoint"])
    return state.replace(params=params, model_state=model_state), {
        "kind": "init_from", "checkpoint": str(step_dir),
        "fingerprint": source.get("fingerprint"), "loaded": len(report["loaded"]),
        "loaded_tensors": report["loaded"], "not_loaded": report["not_loaded"],
        "skipped_from_checkpoint": report["skipped_from_checkpoint"],
        "quarantined": ckpt.quarantined}


def _sync_each_step():
    # XLA:CPU with several (e.g. fake) devices can deadlock in collectives when executions
    # overlap under async dispatch on few cores: there, wait for each step (nothing to overlap
    # with on a CPU anyway). Accelerators keep asynchronous dispatch.
    return jax.devices()[0].platform == "cpu" and jax.device_count() > 1


def _evaluator(task, built: setup.Stage, local_eval_bs: int):
    """`evaluate(state, split, max_batches=0) -> metrics` over one pass of `split`."""
    sync = _sync_each_step()

    def evaluate(state, split, max_batches=0):
        it = task.make_iterator(split, batch_size=local_eval_bs, seed=built.seed,
                                shard_index=jax.process_index(),
                                shard_count=jax.process_count(), num_epochs=1,
                                drop_remainder=False)
        acc = None
        for i, batch in enumerate(it):
            if max_batches and i >= max_batches:
                break
            m = built.eval_step(state, sharding.shard_batch(batch, built.mesh, built.rules))
            if sync:
                jax.block_until_ready(m)
            acc = metrics_lib.accumulate(acc, m)
        return metrics_lib.summarize(acc)

    return evaluate


class _Run:
    """The training loop's bookkeeping: metrics windows, validation history, wall time,
    profiler window, checkpoints."""

    def __init__(self, built, stage_dir, ckpt, writer, train_iter, evaluate, t_start):
        self.built, self.stage, self.name = built, built.cfg, built.name
        self.stage_dir, self.ckpt, self.writer = stage_dir, ckpt, writer
        self.train_iter, self.evaluate, self.t_start = train_iter, evaluate, t_start
        self.is_main = is_main_process()
        self.profiling = False
        self.last_val = None
        self.step = self.start_step = self.last_checked = 0
        # The last step whose training loss is known finite: checkpoint s is confirmed when the
        # loss of step s + 1 (computed on its parameters) or its validation loss is finite.
        self.checked_through = 0
        self.confirmed = set()
        # Wall time of earlier invocations of this stage (killed or preempted ones included,
        # up to their last log or checkpoint), so results report the stage's total as well.
        self.spent_path = stage_dir / "wall_time.json"
        self.history_path = stage_dir / HISTORY_FILE
        self.spent_before = 0.0
        self.history = []

    def _resume_records(self):
        """Wall time and validation curve of earlier invocations. The checkpoint resumed from
        holds both up to its step: an unreadable history.json / wall_time.json is moved aside
        to `<name>.bad` and rebuilt from it (entries after the resumed step are dropped either
        way: they will be recomputed identically)."""
        extra = self.ckpt.extra if self.start_step > 0 else {}
        spent = self._read_record(self.spent_path, "spent_s" in extra)
        if self.start_step > 0:
            self.spent_before = float((spent or {}).get("spent_s", extra.get("spent_s", 0.0)))
        history = self._read_record(self.history_path, "history" in extra)
        if history is None:
            history = extra.get("history", [])
            if history:
                _write_json(self.history_path, history)
        self.history = [h for h in history if h["step"] <= self.step]

    def _read_record(self, path, rebuildable):
        if not path.exists():
            return None
        try:
            return results_lib.read_json(path)
        except ResultsError as e:
            if not rebuildable:
                raise ResultsError(f"{e}. This checkpoint predates the copy kept in checkpoints: "
                                   f"moving it aside loses its records before step "
                                   f"{self.step}") from None
            logging.warning("[%s] %s is unreadable; moved to %s.bad and rebuilt from the "
                            "checkpoint of step %d.", self.name, path, path.name, self.step)
            if self.is_main:
                path.replace(path.parent / (path.name + ".bad"))
            return None

    def wall_total(self):
        return self.spent_before + time.time() - self.t_start

    def train(self, state, stop):
        """Trains from `state.step` to `num_steps`; returns the last state."""
        stage, built, name = self.stage, self.built, self.name
        num_steps, pc = int(stage.num_steps), jax.process_count()
        sync = _sync_each_step()
        self.step = self.start_step = self.last_checked = int(jax.device_get(state.step))
        self.checked_through = self.step  # every loss up to a saved step was checked
        self.confirmed = {s for s in self.ckpt.all_steps() if s < self.step or guards.finite(
            (self.ckpt.metrics(s) or {}).get("loss"))}
        self._resume_records()
        self.progress = metrics_lib.Progress(self.step, num_steps, time.time, name, self.is_main)
        acc = None
        # Training to convergence stops after the evaluation that shows it (a resumed stage
        # whose checkpoint is that evaluation's does not train on).
        while self.step < num_steps and not convergence.should_stop(self.history, stage):
            self._start_profile()
            batch = sharding.shard_batch(next(self.train_iter), built.mesh, built.rules)
            state, step_metrics = built.train_step(state, batch)
            if sync:
                jax.block_until_ready((state, step_metrics))
            self.step += 1
            step = self.step
            acc = metrics_lib.accumulate(acc, step_metrics)
            self._end_profile(state)
            final = step == num_steps
            preempt = stop.requested or (pc > 1 and self.ckpt.reached_preemption(step))
            # On preemption the grace period is short: checkpoint now, evaluate after resuming.
            eval_now = final or (step % stage.eval_every == 0 and not preempt)
            save_now = step % stage.checkpoint_every == 0 or eval_now or preempt
            log_now = step % stage.log_every == 0 or final
            if log_now or save_now:
                # Every checkpoint passes these checks (loss up to its step, its parameters,
                # its validation loss when evaluated); see the module docstring.
                # (The window runs from the last log, so a NaN stays in the sums until then.)
                values = metrics_lib.summarize(acc)
                self._check_finite(values)
                if log_now:
                    self._log(values)
                    acc, self.last_checked = None, step
            if save_now and not guards.finite_params(state.params):
                self._diverged(f"non-finite parameters after step {step}")
            val = self._validate(state) if eval_now else None
            if (log_now or save_now) and self.is_main:
                _write_json(self.spent_path, {"spent_s": self.wall_total()})
            if save_now:
                ckpt_metrics = None
                if val is not None:
                    ckpt_metrics = dict(val, score=ckpt_lib.score_of(val, stage.best_metric,
                                                                     stage.best_mode))
                self.ckpt.save(step, state, self.train_iter.get_state(), metrics=ckpt_metrics,
                               extra={"history": self.history, "spent_s": self.wall_total()})
            if preempt and not final:
                self.ckpt.wait_until_finished()
                raise stop.error(f"[{name}] stopped at step {step}", f"checkpoint saved in "
                                 f"{self.ckpt.directory}. Run the same command to resume.")
        self.stop_profiler()
        return state

    def _start_profile(self):
        """Starts the `stage.profile` trace window before its first step."""
        prof = self.stage.profile
        if (self.is_main and prof.start_step > 0 and self.step == prof.start_step
                and not self.profiling):
            jax.profiler.start_trace(str(self.stage_dir / "profile"))
            self.profiling = True

    def _end_profile(self, state):
        prof = self.stage.profile
        if self.profiling and self.step >= prof.start_step + prof.num_steps:
            jax.block_until_ready(state)
            self.stop_profiler()
            logging.info("[%s] profiler trace written to %s.", self.name,
                         self.stage_dir / "profile")

    def stop_profiler(self):
        if self.profiling:
            jax.profiler.stop_trace()
            self.profiling = False

    def _check_finite(self, values):
        loss_keys = [k for k in values if "loss" in k] or list(values)
        if all(math.isfinite(values[k]) for k in loss_keys):
            # Every checkpoint before this step was used for a loss now known to be finite.
            self.checked_through = self.step
            self.confirmed |= {s for s in self.ckpt.all_steps() if s < self.step}
            return
        self._diverged(f"non-finite training loss between steps {self.last_checked + 1} and "
                       f"{self.step} ({metrics_lib.format_metrics(values)})")

    def _diverged(self, what):
        """Sets the unconfirmed checkpoints aside, records `diverged`, raises."""
        self.ckpt.wait_until_finished()
        saved = self.ckpt.all_steps()
        good = max((s for s in saved if s in self.confirmed), default=None)
        suspect = [s for s in saved if good is None or s > good]
        moved = self.ckpt.set_aside(suspect) if suspect else []
        kept = (f"the last checkpoint with a finite loss is step {good} in "
                f"{self.ckpt.directory}" if good is not None
                else "no checkpoint with a finite loss was saved before it")
        aside = (f" (checkpoints of steps {suspect} moved to {ckpt_lib.DIVERGED_DIR}/)"
                 if moved else "")
        msg = (f"[{self.name}] diverged: {what}. Stopping the stage; {kept}{aside}. Lower the "
               f"learning rate, raise warmup or set optim.grad_clip, then rerun the same "
               f"command to resume from it.")
        _write_json(self.stage_dir / RESULTS_FILE, StageResults(
            stage=self.name, status="diverged", final_step=self.step, last_good_step=good,
            message=msg).to_json())
        raise NonFiniteLossError(msg)

    def _log(self, values):
        self.progress.log(self.step, values)  # the log line, the progress bar
        self.writer.write_scalars(self.step, metrics_lib.scalars_for_writer("train", values))
        self.writer.write_scalars(self.step, {"train/steps_per_s": self.progress.rate()})

    def _validate(self, state):
        val = self.evaluate(state, "validation", self.stage.eval_steps)
        bad = {k: v for k, v in val.items() if "loss" in k and not guards.finite(v)}
        if bad:  # before it is recorded or saved: this covers the last step's update
            self._diverged(f"non-finite validation {metrics_lib.format_metrics(bad)} of the "
                           f"parameters after step {self.step}")
        self.confirmed.add(self.step)
        self.last_val = (self.step, val)
        self.history.append(dict(val, step=self.step))
        _write_json(self.history_path, self.history)
        self.writer.write_scalars(self.step, metrics_lib.scalars_for_writer("validation", val))
        self.progress.validation(self.step, val, self.stage.best_metric)
        if self.stage.best_metric not in val:
            raise KeyError(f"stages.{self.name}.best_metric={self.stage.best_metric!r} is not "
                           f"a validation metric; have {sorted(val)}")
        return val


def final_evaluation(run: _Run, state) -> StageResults:
    """Validation and test metrics of the last and the best checkpoint; the stage's results
    (without `init`, `num_params`, `flops_per_step`)."""
    stage, name, step, evaluate = run.stage, run.name, run.step, run.evaluate
    train_rate = run.progress.rate()
    run.ckpt.wait_until_finished()
    last_val = run.last_val
    if last_val is None or last_val[0] != step:
        last_val = (step, evaluate(state, "validation", stage.eval_steps))
    last_metrics = {"validation": last_val[1], "test": evaluate(state, "test")}
    fingerprint = steps.params_fingerprint(state.params)
    best_step = run.ckpt.best_step()
    guards.warn_missing_best(run.stage, run.name, run.history, run.ckpt, best_step)
    if best_step is None or best_step == step:
        best_step = step
        best_metrics = last_metrics
    else:
        best_state, _ = run.ckpt.restore(
            best_step, ckpt_lib.abstract_like(state, run.built.state_shardings))
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
        best_metric=stage.best_metric, best_mode=stage.best_mode,
        validation={"best": best_metrics["validation"], "last": last_metrics["validation"]},
        test={"best": best_metrics["test"], "last": last_metrics["test"]},
        params_fingerprint=fingerprint, history=run.history, resumed_at_step=run.start_step,
        stop_reason=convergence.stop_reason(run.history, stage, step),
        train_steps_per_s=train_rate if math.isfinite(train_rate) else None,
        wall_time_s=time.time() - run.t_start, wall_time_total_s=run.wall_total())
    m = stage.best_metric
    run.progress.finish(  # stdout (sptlib.main) and the log
        f"finished at step {step} in {metrics_lib.format_duration(results.wall_time_s)}: best "
        f"step {best_step} (validation {m}={best_metrics['validation'].get(m, math.nan):.4g}), "
        f"test {m} best={best_metrics['test'].get(m, math.nan):.4g} "
        f"last={last_metrics['test'].get(m, math.nan):.4g}.")
    return results
