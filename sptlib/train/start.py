"""A stage's starting state and the record of what it grew from.

`restore` picks, by priority: the stage's own latest checkpoint (full resume, data iterator
included) > `init_from` (parameters only, `dont_load` patterns kept fresh) > the random init.
`inputs.json` (`config_history.record_start`) records the fingerprint of the checkpoint
`init_from` designated (`upstream`); `check_inputs` moves a stage's folder aside when its
upstream stage has changed since, so the stage runs again from the new checkpoint.
"""

import time

from absl import logging
from etils import epath
import jax

from sptlib.errors import NoCheckpointError, ResultsError
from sptlib.train import checkpoint as ckpt_lib
from sptlib.train import checkpoint_io
from sptlib.train import config_history
from sptlib.train import digest as digest_lib
from sptlib.train import results as results_lib
from sptlib.train import transfer


def restore(built, ckpt, train_iter, workdir, source):
    """The stage's starting state, by priority: own latest checkpoint (full resume, data
    iterator included) > `init_from` (parameters only, `dont_load` patterns kept fresh) > the
    random init in `built.state`. `source`: the `upstream` record of `init_from`. Returns
    `(state, init_info)`."""
    name, stage, state = built.name, built.cfg, built.state
    restored = ckpt.restore_latest(checkpoint_io.abstract_like(state, built.state_shardings),
                                   stage=name,
                                   start_over=stage.start_over_if_unreadable)
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
        before = results_lib.read_stage(workdir / stage.init_from)
        if not before or not before.finished:
            logging.warning("[%s] init_from stage %r has not finished (%s); using its %s "
                            "checkpoint so far.", name, stage.init_from,
                            before.status if before else "no results.json",
                            stage.init_checkpoint)
    step_dir = transfer.resolve_init_checkpoint(stage.init_from, workdir, stage.init_checkpoint)
    source = source or {}
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


def check_best_exists(config, stage_name, workdir):
    """The best checkpoint that `init_from`'s finished results.json names (`best_step`) still
    exists, or a one-line `NoCheckpointError` naming the missing step; with `init_fallback`, a
    warning and `{"missing_step", "used_step"}` (recorded in results.json's `init`), as the best
    of the checkpoints that exist is used instead. None when there is nothing to check (no
    init_from stage of this config, init_checkpoint=latest, the stage not finished)."""
    stage = config.stages[stage_name]
    if not stage.init_from or stage.init_from not in config.stages or \
            stage.init_checkpoint != "best":
        return None
    source_dir = epath.Path(workdir) / stage.init_from
    before = results_lib.read_stage(source_dir)
    if not before or not before.finished or before.best_step is None:
        return None
    checkpoints = source_dir / ckpt_lib.CHECKPOINTS_DIR
    if ckpt_lib.is_step_dir(checkpoints / str(before.best_step)):
        return None
    existing = sorted(int(p.name) for p in checkpoints.iterdir() if ckpt_lib.is_step_dir(p)) \
        if checkpoints.is_dir() else []
    used = ckpt_lib.best_step(checkpoints)
    where = f"{stage.init_from}/{results_lib.RESULTS_FILE}"
    if not stage.init_fallback or used is None:
        raise NoCheckpointError(
            f"[{stage_name}] init_from={stage.init_from!r}: its best checkpoint, step "
            f"{before.best_step} ({where}), is gone from {checkpoints} (checkpoints there: "
            f"{existing or 'none'}). Restore it, or move {source_dir} aside to train "
            f"{stage.init_from} again" + (
                f", or set config.stages.{stage_name}.init_fallback=True to start from the best "
                f"that exists (step {used}; recorded in results.json)" if used is not None
                else ""))
    logging.warning("[%s] init_from=%r: its best checkpoint, step %d (%s), is gone from %s; "
                    "init_fallback=True: starting from the best that exists, step %d "
                    "(recorded in results.json init.fallback).", stage_name, stage.init_from,
                    before.best_step, where, checkpoints, used)
    return {"missing_step": int(before.best_step), "used_step": int(used)}


def upstream(config, stage_name, workdir):
    """{"checkpoint", "fingerprint"} of the checkpoint `init_from` designates now (None when
    the stage has no init_from or it resolves to nothing)."""
    stage = config.stages[stage_name]
    if not stage.init_from:
        return None
    try:
        step_dir = transfer.resolve_init_checkpoint(stage.init_from, workdir,
                                                    stage.init_checkpoint)
        rec = digest_lib.read(step_dir)
    except Exception:  # pylint: disable=broad-except
        return None
    if rec is None:
        fingerprint = f"undigested:{step_dir.name}"
    else:
        arrays = {k: v for k, v in rec["arrays"].items()
                  if k.startswith(("params/", "model_state/"))}
        fingerprint = digest_lib.json_digest(arrays)
    return {"checkpoint": str(step_dir), "fingerprint": fingerprint}


def check_inputs(config, stage_name, workdir, now) -> bool:
    """Moves the stage's folder aside when the checkpoint it was initialised from has changed
    since (the upstream stage ran on): `now` is the `upstream` record of the checkpoint
    `init_from` designates now. Returns True when it did (the stage starts afresh)."""
    stage_dir = epath.Path(workdir) / stage_name
    path = stage_dir / config_history.INPUTS_FILE
    if not path.exists():
        return False
    try:
        recorded = results_lib.read_json(path).get("init_from")
    except (ResultsError, AttributeError):
        logging.warning("[%s] %s is unreadable; moved to %s.bad (whether its upstream stage "
                        "changed since can no longer be told).", stage_name, path, path.name)
        if jax.process_index() == 0:
            path.replace(path.parent / (path.name + ".bad"))
        return False
    if not recorded:
        return False
    if now is None or now["fingerprint"] == recorded.get("fingerprint"):
        return False
    aside = epath.Path(f"{stage_dir}.stale-{int(time.time())}")
    logging.warning("[%s] was initialised from %s (fingerprint %s...), but init_from=%r now "
                    "designates %s (fingerprint %s...): the upstream stage changed. Moving %s "
                    "to %s and running the stage again from the new checkpoint.", stage_name,
                    recorded.get("checkpoint"), str(recorded.get("fingerprint"))[:12],
                    config.stages[stage_name].init_from, now["checkpoint"],
                    now["fingerprint"][:12], stage_dir, aside)
    if jax.process_index() == 0:
        stage_dir.rename(aside)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(f"sptlib_stale_{stage_name}")
    return True
