"""The training loop of one stage: restore, train with periodic evaluation and checkpoints, test.

`train_stage(config, stage_name, workdir)` runs `config.stages[stage_name]` in `workdir/<stage>/`:

    checkpoints/          orbax checkpoints (sptlib.train.checkpoint): state + data iterator state
    events.out.tfevents*  TensorBoard scalars (clu writers): train/*, validation/*, test_*/*
    config.json           the full resolved config of the run
    results.json          final/best step, validation and test metrics of the best and the last
                          checkpoint, wall time, params_fingerprint (see `train_stage`)
    history.json          validation metrics at every evaluation ([{"step": s, metric: v}])
    profile/              jax.profiler trace when `profile.start_step > 0`

Restore priority (DESIGN §2): own latest checkpoint (full resume, data iterator included) >
`init_from` (parameters only, `dont_load` patterns kept fresh) > random init.
"""

import json
import math
import signal
import threading
import time
from typing import Optional

from absl import logging
from etils import epath
import jax
import ml_collections

from sptlib import data as data_lib
from sptlib import models
from sptlib import objectives
from sptlib.errors import NonFiniteLossError, PreemptedError  # noqa: F401 (re-exported)
from sptlib.train import checkpoint as ckpt_lib
from sptlib.train import metrics as metrics_lib
from sptlib.train import optim
from sptlib.train import sharding
from sptlib.train import steps

RESULTS_FILE = "results.json"
CONFIG_FILE = "config.json"
HISTORY_FILE = "history.json"



def _write_json(path: epath.Path, obj):
    if steps.is_main_process():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / (path.name + ".tmp")
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=_json_default))
        tmp.replace(path)  # atomic where the file system allows; overwrites


def _json_default(x):
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (tuple, set)):
        return list(x)
    return str(x)


def read_results(stage_dir) -> Optional[dict]:
    path = epath.Path(stage_dir) / RESULTS_FILE
    if not path.exists():
        return None
    return ckpt_lib.read_json(path)  # a truncated file is a ResultsError naming it


def resolve_model_config(model_cfg, task_info):
    """A copy of `config.model` with the data-dependent fields (0 = from the data) filled in."""
    m = ml_collections.ConfigDict(model_cfg.to_dict())
    if not m.vocab_size:
        m.vocab_size = int(task_info.get("vocab_size", 0))
    if not m.max_length:
        m.max_length = int(task_info["max_length"])
    if task_info.get("input_type") == "continuous":
        m.d_input = int(task_info.get("d_input", m.d_input))
    return m


class _StopFlag:
    """Set by SIGTERM (single-process runs) so the loop checkpoints and exits cleanly."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def install(self):
        if jax.process_count() > 1 or threading.current_thread() is not threading.main_thread():
            # Multi-host: the JAX preemption service decides (reached_preemption), consistently
            # on every process; a per-process flag could desynchronise them.
            return self
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum, frame):  # pylint: disable=unused-argument
        logging.warning("SIGTERM received: saving a checkpoint after this step, then stopping.")
        self.requested = True

    def uninstall(self):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None


def train_stage(config, stage_name: str, workdir) -> dict:
    """Runs one stage; returns its results (also written to `workdir/<stage>/results.json`).

    Results: `stage`, `status` (finished), `final_step`, `best_step`, `best_metric`,
    `validation` / `test` (each `{"best": metrics, "last": metrics}`), `wall_time_s` (this
    invocation), `wall_time_total_s` (every invocation of the stage, resumed ones included),
    `train_steps_per_s`, `params_fingerprint` (SHA-256 of the last parameters), `num_params`,
    `init` (how the state was obtained: resume | init_from | random), `history` (validation
    metrics at every evaluation, `[{"step": s, metric: value}]`).

    Raises:
      NonFiniteLossError: NaN/inf training loss (the last good checkpoint is kept).
      PreemptedError: SIGTERM / preemption (a checkpoint of the current step was saved).
      IncompatibleCheckpointError: `init_from` does not fit the model.
    """
    t_start = time.time()
    stage = config.stages[stage_name]
    workdir = ckpt_lib.absolute(workdir)  # orbax needs absolute local paths
    stage_dir = workdir / stage_name
    is_main = steps.is_main_process()
    num_steps = int(stage.num_steps)

    previous = read_results(stage_dir)
    if previous and previous.get("status") == "finished" and \
            previous.get("final_step") == num_steps:
        logging.info("[%s] already finished (%s); not training again.", stage_name,
                     stage_dir / RESULTS_FILE)
        return previous

    if is_main:
        stage_dir.mkdir(parents=True, exist_ok=True)
        cfg_path = stage_dir / CONFIG_FILE
        cfg_json = config.to_json_best_effort(indent=2, sort_keys=True)
        if cfg_path.exists() and cfg_path.read_text() != cfg_json:
            logging.warning("[%s] the config differs from the one this stage ran with before "
                            "(%s); continuing from its checkpoints with the new config.",
                            stage_name, cfg_path)
        cfg_path.write_text(cfg_json)

    metrics_lib.preload_writer_backend()
    # ------------------------------------------------------------------ data, model, optimizer
    seed = int(config.seed) + int(stage.seed_offset)
    task = data_lib.get_task(config.data)
    pc, pi = jax.process_count(), jax.process_index()
    for field in ("batch_size", "eval_batch_size"):
        if stage[field] % pc:
            raise ValueError(f"stages.{stage_name}.{field}={stage[field]} is not divisible by "
                             f"the process count {pc}")
    local_bs = stage.batch_size // pc
    local_eval_bs = (stage.eval_batch_size or stage.batch_size) // pc

    objective = objectives.get_objective(stage.objective)
    model_cfg = resolve_model_config(config.model, task.info)
    model = models.build_model(model_cfg, objective.head(task.info, model_cfg))
    mesh = sharding.create_mesh(config.mesh)
    rules = sharding.normalize_rules(config.logical_axis_rules)

    train_iter = task.make_iterator("train", batch_size=local_bs, seed=seed, shard_index=pi,
                                    shard_count=pc)
    # Peek one batch for shapes, then rewind: the data order must not depend on the peek.
    state0 = train_iter.get_state()
    example_batch = next(train_iter)
    train_iter.set_state(state0)

    abstract_vars, _ = steps.state_logical_specs(model, objective, example_batch)
    optimizer = optim.make_optimizer(stage.optim, abstract_vars["params"], num_steps)
    rng = jax.random.PRNGKey(seed)
    state, state_shardings = steps.init_train_state(model, optimizer, example_batch, rng, mesh,
                                                    rules, objective=objective)
    num_params = int(sum(x.size for x in jax.tree.leaves(state.params)))

    # ------------------------------------------------------------------ restore priority
    ckpt = ckpt_lib.StageCheckpointer(stage_dir / ckpt_lib.CHECKPOINTS_DIR, keep=stage.keep,
                                      async_saves=stage.async_checkpoints)
    restored = ckpt.restore_latest(ckpt_lib.abstract_like(state, state_shardings),
                                   stage=stage_name,
                                   start_over=stage.get("start_over_if_unreadable", False))
    if restored is not None:
        state, iterator_state, restored_step = restored
        train_iter.set_state(iterator_state)
        init_info = {"kind": "resume", "step": int(restored_step)}
        logging.info("[%s] resuming from its checkpoint at step %d.", stage_name, restored_step)
    elif stage.init_from:
        if stage.init_from in config.stages:
            source = read_results(workdir / stage.init_from)
            if not source or source.get("status") != "finished":
                logging.warning("[%s] init_from stage %r has not finished (%s); using its %s "
                                "checkpoint so far.", stage_name, stage.init_from,
                                (source or {}).get("status", "no results.json"),
                                stage.init_checkpoint)
        step_dir = ckpt_lib.resolve_init_checkpoint(stage.init_from, workdir,
                                                    stage.init_checkpoint)
        params, model_state, report = ckpt_lib.load_pretrained(
            step_dir, state.params, state.model_state, dont_load=tuple(stage.dont_load))
        state = state.replace(params=params, model_state=model_state)
        init_info = {"kind": "init_from", "checkpoint": str(step_dir),
                     "loaded": len(report["loaded"]), "not_loaded": report["not_loaded"],
                     "skipped_from_checkpoint": report["skipped_from_checkpoint"]}
        logging.info("[%s] initialised from %s (%d tensors loaded; fresh: %s; skipped: %s).",
                     stage_name, step_dir, len(report["loaded"]), report["not_loaded"],
                     report["skipped_from_checkpoint"])
    else:
        init_info = {"kind": "random", "seed": seed}
        logging.info("[%s] random init (seed %d), %d parameters.", stage_name, seed, num_params)
    init_info["quarantined"] = ckpt.quarantined  # unreadable checkpoints moved aside, if any

    train_step = steps.make_train_step(model, objective, optimizer, mesh, state_shardings, rules)
    eval_step = steps.make_eval_step(model, objective, mesh, state_shardings, rules)

    # XLA:CPU with several (e.g. fake) devices can deadlock in collectives when executions
    # overlap under async dispatch on few cores: there, wait for each step (nothing to overlap
    # with on a CPU anyway). Accelerators keep asynchronous dispatch.
    sync_each_step = jax.devices()[0].platform == "cpu" and jax.device_count() > 1

    def evaluate(st, split, max_batches=0):
        it = task.make_iterator(split, batch_size=local_eval_bs, seed=seed, shard_index=pi,
                                shard_count=pc, num_epochs=1, drop_remainder=False)
        acc = None
        for i, batch in enumerate(it):
            if max_batches and i >= max_batches:
                break
            m = eval_step(st, sharding.shard_batch(batch, mesh, rules))
            if sync_each_step:
                jax.block_until_ready(m)
            acc = metrics_lib.accumulate(acc, m)
        return metrics_lib.summarize(acc)

    writer = metrics_lib.create_writer(stage_dir, is_main=is_main)
    stop = _StopFlag().install()
    step = int(jax.device_get(state.step))
    start_step = step
    progress = metrics_lib.Progress(step, num_steps, time.time)
    acc = None
    last_val = None
    best_metric, best_mode = stage.best_metric, stage.best_mode
    prof = stage.profile
    profiling = False

    def stop_nonfinite(values):
        ckpt.wait_until_finished()
        good = ckpt.latest_step()
        kept = (f"the last good checkpoint is step {good} in {ckpt.directory}" if good is not None
                else "no checkpoint was saved before it")
        msg = (f"[{stage_name}] non-finite training loss between steps {last_checked + 1} and "
               f"{step} ({metrics_lib.format_metrics(values)}). Stopping the stage; {kept}. "
               f"Lower the learning rate, "
               f"raise warmup or set optim.grad_clip.")
        _write_json(stage_dir / RESULTS_FILE, {"stage": stage_name, "status": "diverged",
                                               "final_step": step, "last_good_step": good,
                                               "message": msg})
        raise NonFiniteLossError(msg)

    last_checked = step
    # Wall time of earlier invocations of this stage (killed or preempted ones included, up to
    # their last log or checkpoint), so results report the stage's total as well as this run's.
    spent_path = stage_dir / "wall_time.json"
    spent_before = 0.0
    if start_step > 0 and spent_path.exists():
        spent_before = float(json.loads(spent_path.read_text()).get("spent_s", 0.0))

    def record_spent():
        if is_main:
            _write_json(spent_path, {"spent_s": spent_before + time.time() - t_start})

    # Validation curve, kept across resumes (entries after the resumed step are dropped: they
    # will be recomputed identically).
    history_path = stage_dir / HISTORY_FILE
    history = []
    if history_path.exists():
        history = [h for h in json.loads(history_path.read_text()) if h["step"] <= step]
    # ------------------------------------------------------------------ train
    try:
        while step < num_steps:
            if is_main and prof.start_step > 0 and step == prof.start_step and not profiling:
                jax.profiler.start_trace(str(stage_dir / "profile"))
                profiling = True
            batch = sharding.shard_batch(next(train_iter), mesh, rules)
            state, step_metrics = train_step(state, batch)
            if sync_each_step:
                jax.block_until_ready((state, step_metrics))
            step += 1
            acc = metrics_lib.accumulate(acc, step_metrics)
            if profiling and step >= prof.start_step + prof.num_steps:
                jax.block_until_ready(state)
                jax.profiler.stop_trace()
                profiling = False
                logging.info("[%s] profiler trace written to %s.", stage_name,
                             stage_dir / "profile")

            final = step == num_steps
            preempt = stop.requested or (pc > 1 and ckpt.reached_preemption(step))
            # On preemption the grace period is short: checkpoint now, evaluate after resuming.
            eval_now = final or (step % stage.eval_every == 0 and not preempt)
            save_now = step % stage.checkpoint_every == 0 or eval_now or preempt
            log_now = step % stage.log_every == 0 or final
            if log_now or save_now:
                # Every checkpoint passes this check, so no checkpoint holds a diverged state.
                # (The window runs from the last log, so a NaN stays in the sums until then.)
                values = metrics_lib.summarize(acc)
                loss_keys = [k for k in values if "loss" in k] or list(values)
                if not all(math.isfinite(values[k]) for k in loss_keys):
                    stop_nonfinite(values)
                if log_now:
                    line = progress.line(step)
                    writer.write_scalars(step, metrics_lib.scalars_for_writer("train", values))
                    writer.write_scalars(step, {"train/steps_per_s": progress.rate()})
                    logging.info("[%s] %s | %s", stage_name, line,
                                 metrics_lib.format_metrics(values))
                    acc, last_checked = None, step
            val = None
            if eval_now:
                val = evaluate(state, "validation", stage.eval_steps)
                last_val = (step, val)
                history.append(dict(val, step=step))
                _write_json(history_path, history)
                writer.write_scalars(step, metrics_lib.scalars_for_writer("validation", val))
                logging.info("[%s] step %d validation: %s", stage_name, step,
                             metrics_lib.format_metrics(val))
                if best_metric not in val:
                    raise KeyError(f"stages.{stage_name}.best_metric={best_metric!r} is not a "
                                   f"validation metric; have {sorted(val)}")
            if log_now or save_now:
                record_spent()
            if save_now:
                ckpt_metrics = None
                if val is not None:
                    ckpt_metrics = dict(val, score=ckpt_lib.score_of(val, best_metric,
                                                                     best_mode))
                ckpt.save(step, state, train_iter.get_state(), metrics=ckpt_metrics)
            if preempt and not final:
                ckpt.wait_until_finished()
                raise PreemptedError(f"[{stage_name}] stopped at step {step} on request "
                                     f"(SIGTERM/preemption); checkpoint saved in "
                                     f"{ckpt.directory}. Run the same command to resume.")
        if profiling:
            jax.profiler.stop_trace()
            profiling = False
        train_rate = progress.rate()

        # -------------------------------------------------------------- final evaluations
        ckpt.wait_until_finished()
        if last_val is None or last_val[0] != step:
            last_val = (step, evaluate(state, "validation", stage.eval_steps))
        last_metrics = {"validation": last_val[1], "test": evaluate(state, "test")}
        fingerprint = steps.params_fingerprint(state.params)
        best_step = ckpt.best_step()
        if best_step is None or best_step == step:
            best_step = step
            best_metrics = last_metrics
        else:
            best_state, _ = ckpt.restore(best_step,
                                         ckpt_lib.abstract_like(state, state_shardings))
            best_metrics = {"validation": evaluate(best_state, "validation", stage.eval_steps),
                            "test": evaluate(best_state, "test")}
            del best_state
        for which, ms in (("best", best_metrics), ("last", last_metrics)):
            for split, vals in ms.items():
                writer.write_scalars(step, metrics_lib.scalars_for_writer(
                    f"{split}_{which}", vals))
        writer.flush()
        results = {
            "stage": stage_name,
            "status": "finished",
            "final_step": step,
            "best_step": int(best_step),
            "best_metric": best_metric,
            "best_mode": best_mode,
            "validation": {"best": best_metrics["validation"], "last": last_metrics["validation"]},
            "test": {"best": best_metrics["test"], "last": last_metrics["test"]},
            "params_fingerprint": fingerprint,
            "history": history,
            "num_params": num_params,
            "init": init_info,
            "resumed_at_step": start_step,
            "train_steps_per_s": train_rate if math.isfinite(train_rate) else None,
            "wall_time_s": time.time() - t_start,
            "wall_time_total_s": spent_before + time.time() - t_start,
        }
        _write_json(stage_dir / RESULTS_FILE, results)
        logging.info("[%s] finished at step %d in %s: best step %d (%s %s=%.4g), test %s "
                     "best=%.4g last=%.4g.", stage_name, step,
                     metrics_lib.format_duration(results["wall_time_s"]), best_step,
                     "validation", best_metric, best_metrics["validation"].get(best_metric,
                                                                             math.nan),
                     best_metric, best_metrics["test"].get(best_metric, math.nan),
                     last_metrics["test"].get(best_metric, math.nan))
        return results
    finally:
        if profiling:
            jax.profiler.stop_trace()
        stop.uninstall()
        # Never leave with a save in flight (MaxText): a half-written latest checkpoint would
        # cost the next run a fallback.
        ckpt.close()
        writer.close()
