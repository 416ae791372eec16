"""The training loop of one stage: restore, train with periodic evaluation and checkpoints, test.

`train_stage(config, stage_name, workdir)` runs `config.stages[stage_name]` in `workdir/<stage>/`:

    checkpoints/          orbax checkpoints (sptlib.train.checkpoint): state + data iterator state
                          (+ the validation history and wall time so far) + their digest
    events.out.tfevents*  TensorBoard scalars (metrics.EventWriter): train/*, validation/*, test_*/*
    config.json           the full resolved config the stage first ran with (never overwritten;
                          a resume with another config adds config.step<N>.json, see config_history)
    inputs.json           what the stage was initialised from (init_from: checkpoint, fingerprint)
    resolved.json         the resolved stage it runs as (sptlib.train.resolve: platform, mesh,
                          rules, batch shapes, dtype, attention kernel), rewritten at each start
    results.json          final/best step, validation and test metrics of the best and the last
                          checkpoint, wall time, params_fingerprint (see `train_stage`)
    history.json          validation metrics at every evaluation ([{"step": s, metric: v}])
    profile/              jax.profiler trace when `profile.start_step > 0`

Restore priority (`sptlib.train.start.restore`): own latest checkpoint (full resume, data iterator included) >
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
from sptlib import write_errors
from sptlib.errors import NonFiniteLossError, ResultsDigestError, ResultsError
from sptlib.train import checkpoint as ckpt_lib
from sptlib.train import config_history
from sptlib.train import convergence
from sptlib.train import evaluation
from sptlib.train import guards
from sptlib.train import metrics as metrics_lib
from sptlib.train import results as results_lib
from sptlib.train import setup
from sptlib.train import sharding
from sptlib.train import signals
from sptlib.train import start
from sptlib.train.results import RESULTS_FILE, StageResults
from sptlib.train import resolve
from sptlib.train.sharding import is_main_process

HISTORY_FILE = "history.json"


def _write_json(path: epath.Path, obj):
    if is_main_process():
        results_lib.write_json(path, obj)


def _read_verified(stage_name, stage_dir):
    """The stage's results.json; one that differs from its digest (a number edited since) is
    moved aside to results.json.edited and the stage goes on as without one: a finished stage
    resumes at its last step and its metrics are recomputed from the checkpoints."""
    try:
        return results_lib.read_stage(stage_dir)
    except ResultsDigestError as e:
        aside = stage_dir / (RESULTS_FILE + ".edited")
        logging.warning("[%s] %s Moved to %s; recomputing the metrics from the checkpoints.",
                        stage_name, e, aside.name)
        if is_main_process():
            (stage_dir / RESULTS_FILE).replace(aside)
        return None


def train_stage(config, stage_name: str, workdir, *, task=None, resolved=None) -> StageResults:
    """Runs one stage; returns its results (also written to `workdir/<stage>/results.json`;
    the fields are `sptlib.train.results.StageResults`'s). `task` (`sptlib.data.get_task`) and
    `resolved` (`sptlib.train.resolve.resolve_stage` on this host's devices) are built here
    when not given (the stage runner gives the run's).

    Raises:
      NonFiniteLossError: NaN/inf loss or parameters (only confirmed-finite checkpoints kept).
      PreemptedError: SIGTERM / SIGINT / preemption (a checkpoint of the current step was saved).
      IncompatibleCheckpointError: `init_from` does not fit the model.
      WriteError: disk full, file-size limit, unwritable path (one line naming the file).
    """
    try:
        return _train_stage(config, stage_name, workdir, task, resolved)
    except errors.SptlibError:
        raise
    except Exception as e:  # disk full / ulimit -f, however orbax or TensorFlow wrapped it
        found = write_errors.find_write_error(e, ckpt_lib.absolute(workdir) / stage_name)
        if found is None:
            raise
        raise found from e


def _train_stage(config, stage_name, workdir, task, resolved):
    t_start = time.time()
    stage = config.stages[stage_name]
    workdir = ckpt_lib.absolute(workdir)  # orbax needs absolute local paths
    stage_dir = workdir / stage_name
    fallback = start.check_best_exists(config, stage_name, workdir)  # best gone: one line
    source = start.upstream(config, stage_name, workdir)  # the checkpoint init_from names now
    start.check_inputs(config, stage_name, workdir, source)  # upstream changed: start afresh
    previous = _read_verified(stage_name, stage_dir)
    if previous and previous.finished and (previous.final_step == int(stage.num_steps) or
                                           previous.stop_reason == convergence.PATIENCE):
        logging.info("[%s] already finished (%s); not training again.", stage_name,
                     stage_dir / RESULTS_FILE)
        if is_main_process():
            config_history.warn_finished_changes(config, stage_name, stage_dir)
        return previous

    if task is None:
        task = data_lib.get_task(config.data)
    if resolved is None:
        resolved = resolve.resolve_stage(config, stage_name, info=task.info)
    train_iter = task.make_iterator("train", batch_size=resolved.local_batch_size,
                                    seed=resolved.seed, shard_index=jax.process_index(),
                                    shard_count=jax.process_count())
    built = setup.build_stage(config, stage_name, example_batch=setup.peek(train_iter),
                              resolved=resolved)
    layout_before = config_history.previous_layout(stage_dir)
    if is_main_process():
        guards.check_space(stage_dir, built.state)
        stage_dir.mkdir(parents=True, exist_ok=True)
        _write_json(stage_dir / resolve.RESOLVED_FILE, resolved.to_json())
    ckpt = ckpt_lib.StageCheckpointer(stage_dir / ckpt_lib.CHECKPOINTS_DIR, keep=stage.keep,
                                      async_saves=stage.async_checkpoints)
    writer = metrics_lib.create_writer(stage_dir, is_main=is_main_process())
    stop = signals.StopFlag().install()
    run = None
    failed = True
    try:
        state, init_info = start.restore(built, ckpt, train_iter, workdir, source)
        if fallback and init_info.get("kind") == "init_from":
            init_info["fallback"] = fallback
        config_history.note_layout(init_info, layout_before, resolved, stage_name)
        if is_main_process():
            config_history.record_start(config, stage_name, stage_dir, init_info)
        run = _Run(built, stage_dir, ckpt, writer, train_iter,
                   evaluation.evaluator(task, built), t_start)
        state = run.train(state, stop)
        stop_reason = convergence.stop_reason(run.history, stage, run.step)
        results = dataclasses.replace(
            evaluation.final_evaluation(run, state), stop_reason=stop_reason, init=init_info,
            num_params=built.num_params, flops_per_step=setup.train_step_flops(built, strict=False))
        _write_json(stage_dir / RESULTS_FILE, results_lib.sealed(results.to_json()))
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


class _Run:
    """The training loop's bookkeeping: metrics windows, validation history, wall time,
    profiler window, checkpoints."""

    def __init__(self, built, stage_dir, ckpt, writer, train_iter, evaluate, t_start):
        self.built, self.stage, self.name = built, built.cfg, built.name
        self.stage_dir, self.ckpt, self.writer = stage_dir, ckpt, writer
        self.train_iter, self.evaluate, self.t_start = train_iter, evaluate, t_start
        self.sync = built.resolved.sync_each_step
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
            # steps.make_train_step: objective.loss (objectives/), its gradient, the AdamW update.
            state, step_metrics = built.train_step(state, batch)
            if self.sync:
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
                    ckpt_metrics = dict(val, score=convergence.score_of(
                        val, built.resolved.best_metric, built.resolved.best_mode))
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
        _write_json(self.stage_dir / RESULTS_FILE, results_lib.sealed(StageResults(
            stage=self.name, status="diverged", final_step=self.step, last_good_step=good,
            message=msg).to_json()))
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
