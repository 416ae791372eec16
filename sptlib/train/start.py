"""A stage's starting state and the record of what it grew from.

`restore` picks, by priority: the stage's own latest checkpoint (full resume, data iterator
included) > `init_from` (parameters only, `dont_load` patterns kept fresh) > the random init.
`inputs.json` records the fingerprint of the checkpoint `init_from` designated (`upstream`);
`check_inputs` moves a stage's folder aside when its upstream stage has changed since, so the
stage runs again from the new checkpoint.
"""

import time

from absl import logging
from etils import epath
import jax

from sptlib.errors import ResultsError
from sptlib.train import checkpoint_io
from sptlib.train import config_history
from sptlib.train import digest as digest_lib
from sptlib.train import results as results_lib
from sptlib.train import transfer

INPUTS_FILE = "inputs.json"


def restore(built, ckpt, train_iter, workdir):
    """The stage's starting state, by priority: own latest checkpoint (full resume, data
    iterator included) > `init_from` (parameters only, `dont_load` patterns kept fresh) > the
    random init in `built.state`. Returns `(state, init_info)`."""
    name, stage, state = built.name, built.cfg, built.state
    restored = ckpt.restore_latest(checkpoint_io.abstract_like(state, built.state_shardings),
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
    source = upstream(built.config, name, workdir) or {}
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




def record_start(config, stage_name, stage_dir, init_info) -> None:
    """`record_config`, and `inputs.json` when the stage starts from scratch or `init_from`
    (a resume keeps the record of what its checkpoints grew from)."""
    if init_info["kind"] == "resume":
        config_history.record_config(config, stage_name, stage_dir, init_info.get("step"))
        return
    config_history.set_aside_old_configs(config, stage_name, stage_dir)
    config_history.record_config(config, stage_name, stage_dir)
    inputs = {"kind": init_info["kind"], "time": time.time()}
    if init_info["kind"] == "init_from":
        inputs["init_from"] = {k: init_info.get(k) for k in ("checkpoint", "fingerprint")}
    results_lib.write_json(epath.Path(stage_dir) / INPUTS_FILE, inputs)




def check_inputs(config, stage_name, workdir) -> bool:
    """Moves the stage's folder aside when the checkpoint it was initialised from has changed
    since (the upstream stage ran on); returns True when it did (the stage starts afresh)."""
    stage_dir = epath.Path(workdir) / stage_name
    path = stage_dir / INPUTS_FILE
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
    now = upstream(config, stage_name, workdir)
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
