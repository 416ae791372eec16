"""Orbax checkpoints of a training stage, and parameter transfer between stages.

Layout of one stage's checkpoints (`workdir/<stage>/checkpoints/`):

    <step>/state/      the `TrainState` (orbax PyTree / OCDBT; arrays restored onto any mesh)
    <step>/data/       every process's training data iterator state (JSON), saved with the state
    <step>/metrics/    validation metrics of that step (when evaluated) plus `score`
    corrupt/<step>-*   checkpoints found unreadable on restore, moved aside (never deleted)

`score` is the stage's `best_metric` signed so that larger is better (`-loss` for best_mode=min):
any reader can pick the best checkpoint of a directory without knowing the stage's config.

Retention: the latest `keep` checkpoints plus the best-scoring one (orbax
`AnyPreservationPolicy(LatestN, BestN)`), so pruning never drops the best checkpoint.

Restore priority (MaxText's), implemented by `sptlib.train.loop`:
  1. the stage's own latest readable checkpoint -> full resume (`StageCheckpointer.restore_latest`).
     A checkpoint of another config (tree, shape, dtype) stops the run, nothing moved; only
     unreadable ones are moved to `corrupt/`, and if none is left the run stops rather than
     restarting from step 0 (unless `stages.<s>.start_over_if_unreadable`);
  2. else `init_from` -> parameters only (`load_pretrained`);
  3. else the random init.
Every path is an `etils.epath.Path`, so `gs://` workdirs work like local ones.
"""

import json
import math
import re
import time
from typing import Any, Iterable, Optional, Sequence

from absl import logging
from etils import epath
import flax
import jax
from jax.experimental import multihost_utils
import numpy as np
import orbax.checkpoint as ocp

# Error types live in sptlib.errors (JAX-free); file helpers in checkpoint_io. Both re-exported.
from sptlib.errors import (CheckpointMismatchError, IncompatibleCheckpointError,  # noqa: F401
                           NoCheckpointError, NoReadableCheckpointError, ResultsError)
from sptlib.train.checkpoint_io import (  # noqa: F401
    _flat, abstract_like, absolute, decode_iterator_state, describe_mismatch,
    encode_iterator_state, gather_iterator_states, leaf_specs, local_iterator_state, read_json,
    saved_tree, to_host)

_saved_tree = saved_tree  # the name tests used before the split
CHECKPOINTS_DIR = "checkpoints"
CORRUPT_DIR = "corrupt"


# ----------------------------------------------------------------------------------------------
# Helpers.
# ----------------------------------------------------------------------------------------------

def score_of(metrics: dict, best_metric: str, best_mode: str) -> float:
    """The checkpoint score (larger = better) of validation `metrics`; -inf if missing/non-finite."""
    value = metrics.get(best_metric)
    if value is None or not math.isfinite(float(value)):
        return -math.inf
    return float(value) if best_mode == "max" else -float(value)


def _score_fn(metrics):
    return float(metrics.get("score", -math.inf))


def _is_step_dir(path: epath.Path) -> bool:
    return path.name.isdigit() and (path / "state").exists()


# ----------------------------------------------------------------------------------------------
# One stage's checkpoint manager.
# ----------------------------------------------------------------------------------------------

class StageCheckpointer:
    """Saves and restores one stage's `TrainState` and data iterator state.

    Saves are asynchronous (training continues while files are written); call
    `wait_until_finished()` before reading them back or exiting. All processes must call
    `save`/`restore_*` together (orbax synchronises them); only process 0 moves corrupt folders.
    """

    def __init__(self, directory, *, keep: int = 2, async_saves: bool = True):
        self.directory = absolute(directory)
        policy = ocp.checkpoint_managers.AnyPreservationPolicy([
            ocp.checkpoint_managers.LatestN(n=keep),
            ocp.checkpoint_managers.BestN(get_metric_fn=_score_fn, n=1,
                                          keep_checkpoints_without_metrics=False),
        ])
        options = ocp.CheckpointManagerOptions(
            best_fn=_score_fn, best_mode="max", preservation_policy=policy,
            enable_async_checkpointing=async_saves, cleanup_tmp_directories=True, create=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options,
                                             item_names=("state", "data"))
        # Unreadable steps moved aside by `restore_latest`: [{step, error, moved_to}].
        self.quarantined = []

    # -- queries ------------------------------------------------------------------------------
    def all_steps(self) -> Sequence[int]:
        return sorted(self.manager.all_steps())

    def latest_step(self) -> Optional[int]:
        return self.manager.latest_step()

    def best_step(self) -> Optional[int]:
        """The best-scoring step among the kept checkpoints (latest if none has metrics)."""
        scored = [(s, self.metrics(s)) for s in self.all_steps()]
        scored = [(s, m) for s, m in scored if m and "score" in m]
        if not scored:
            return self.latest_step()
        # Ties go to the earlier step (the first time the score was reached).
        return max(scored, key=lambda sm: (_score_fn(sm[1]), -sm[0]))[0]

    def metrics(self, step: int) -> Optional[dict]:
        try:
            return self.manager.metrics(step)
        except Exception:  # pylint: disable=broad-except
            return None

    def reached_preemption(self, step: int) -> bool:
        """True when the JAX preemption service says this step is a sync point (multi-host)."""
        return self.manager.reached_preemption(step)

    # -- save -----------------------------------------------------------------------------------
    def save(self, step: int, state, iterator_state: Any, *,
             metrics: Optional[dict] = None) -> bool:
        """Starts an (async) save of `state` and the data iterator state at `step`.

        Args:
          metrics: validation metrics of this step (must contain `score`); None if not evaluated.
        Returns:
          Whether a save was started (False when the step is already saved).
        """
        if step in self.manager.all_steps():
            return False
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(gather_iterator_states(iterator_state)))
        return bool(self.manager.save(step, args=args, metrics=metrics, force=True))

    def wait_until_finished(self):
        self.manager.wait_until_finished()

    def close(self):
        self.manager.wait_until_finished()
        self.manager.close()

    # -- restore --------------------------------------------------------------------------------
    def restore(self, step: int, abstract_state) -> tuple:
        """Restores (state, iterator_state) of `step` onto the shardings in `abstract_state`."""
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
        return restored.state, local_iterator_state(restored.data)

    def check_identity(self, step: int, abstract_state, stage: str = "") -> bool:
        """Whether `step`'s saved tree can be read; raises if it was written by another config.

        Returns False when the checkpoint's metadata cannot be read (missing or corrupt files).

        Raises:
          CheckpointMismatchError: the saved tree, a shape or a dtype differs from
            `abstract_state` (names the stage, the parameter and both shapes). Nothing is moved.
        """
        try:
            saved = leaf_specs(saved_tree(self.directory / str(step)))
        except Exception:  # pylint: disable=broad-except
            return False
        diff = describe_mismatch(saved, leaf_specs(abstract_state))
        if diff:
            where = f"stage {stage!r}: " if stage else ""
            if diff.startswith("'opt_state/"):  # params and model state match
                diff += " (only the optimizer state differs: optim.grad_clip switched on/off?)"
            raise CheckpointMismatchError(
                f"{where}checkpoint {self.directory / str(step)} does not match this config: "
                f"{diff}. It was written by another config (compare {self.directory.parent}/"
                f"config.json); nothing was changed. Use a new --workdir, or restore the config "
                f"it was written with.")
        return True

    def restore_latest(self, abstract_state, *, stage: str = "",
                       start_over: bool = False) -> Optional[tuple]:
        """Full resume: (state, iterator_state, step) of the latest readable checkpoint, or None.

        A checkpoint written by another config (tree, shape, dtype) stops the run before anything
        is moved (`CheckpointMismatchError`). A checkpoint that cannot be read (corrupt or missing
        files) is logged, moved to `checkpoints/corrupt/` (listed in `self.quarantined`), and the
        previous one is tried. When every checkpoint was unreadable, it raises
        `NoReadableCheckpointError` unless `start_over` (then None: a fresh start).
        """
        for step in sorted(self.manager.all_steps(), reverse=True):
            readable = self.check_identity(step, abstract_state, stage)
            error = "metadata unreadable"
            if readable:
                try:
                    state, iterator_state = self.restore(step, abstract_state)
                    return state, iterator_state, step
                except Exception as e:  # pylint: disable=broad-except
                    error = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
            logging.warning("Checkpoint step %d in %s is unreadable (%s); falling back to the "
                            "previous checkpoint.", step, self.directory, error)
            self.quarantined.append({"step": int(step), "error": error,
                                     "moved_to": str(self._quarantine(step))})
        corrupt = self.directory / CORRUPT_DIR
        earlier = sorted(p.name for p in corrupt.iterdir()) if corrupt.exists() else []
        if (self.quarantined or earlier) and not start_over:
            # Also after an earlier run moved them: an empty folder must not mean "start over".
            moved = ", ".join([q["moved_to"] for q in self.quarantined] or
                              [str(corrupt / n) for n in earlier])
            raise NoReadableCheckpointError(
                f"{('stage ' + repr(stage) + ': ') if stage else ''}no readable checkpoint is "
                f"left in {self.directory} (unreadable, moved aside: {moved}); not restarting "
                f"from step 0 on my own. Set --config.stages.{stage or '<stage>'}."
                f"start_over_if_unreadable=True to train this stage again from the start.")
        return None

    def _quarantine(self, step: int) -> epath.Path:
        """Moves an unreadable step folder aside so the manager no longer lists it."""
        src = self.directory / str(step)
        dst = self.directory / CORRUPT_DIR / f"{step}-{int(time.time())}"
        if jax.process_index() == 0:
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                src.rename(dst)
                logging.warning("Moved unreadable checkpoint %s to %s.", src, dst)
            except Exception as e:  # pylint: disable=broad-except
                # Object stores (gs://) cannot rename folders atomically: delete instead.
                logging.warning("Could not move %s aside (%s); deleting it.", src, e)
                src.rmtree(missing_ok=True)
                dst = "deleted"
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"sptlib_quarantine_{step}")
        self.manager.reload()
        return dst


# ----------------------------------------------------------------------------------------------
# Parameter transfer between stages (init_from).
# ----------------------------------------------------------------------------------------------

def resolve_init_checkpoint(init_from: str, workdir, which: str = "best") -> epath.Path:
    """The step folder that `init_from` designates.

    Args:
      init_from: a stage name (-> `workdir/<name>/checkpoints`), a stage folder (holding
        `checkpoints/`), a checkpoints folder (holding `<step>/` folders) or one step's folder.
      workdir: the pipeline's workdir (for stage names).
      which: best (highest `score`; the latest if no checkpoint has metrics) | latest.
    """
    candidates = []
    if "/" not in init_from and workdir is not None:
        candidates.append(absolute(workdir) / init_from / CHECKPOINTS_DIR)
    path = absolute(init_from)
    candidates += [path / CHECKPOINTS_DIR, path]
    for cand in candidates:
        if not cand.exists():
            continue
        if _is_step_dir(cand):
            return cand
        steps = sorted(int(p.name) for p in cand.iterdir() if _is_step_dir(p))
        if not steps:
            continue
        if which == "latest":
            return cand / str(steps[-1])
        best, best_score = steps[-1], -math.inf
        for s in steps:
            mpath = cand / str(s) / "metrics" / "metrics"
            try:
                score = float(json.loads(mpath.read_text()).get("score", -math.inf))
            except Exception:  # pylint: disable=broad-except
                continue
            if score > best_score:
                best, best_score = s, score
        return cand / str(best)
    raise NoCheckpointError(
        f"init_from={init_from!r}: no checkpoint found (looked in "
        f"{', '.join(str(c) for c in candidates)}). Run that stage first or fix the path.")


def _matches(path: str, patterns: Iterable[str]) -> Optional[str]:
    for pat in patterns:
        if re.search(pat, path):
            return pat
    return None


def load_pretrained(step_dir, params, model_state=None, *, dont_load: Sequence[str] = (),
                    verify: bool = True):
    """Loads parameters (and model state) from a checkpoint into a freshly initialised model.

    Every parameter of the model whose path (e.g. `backbone/layers_0/mixer/kernel`, relative to its
    collection) matches none of `dont_load` must exist in the checkpoint with the same shape; every
    checkpoint parameter that matches none must exist in the model. Matching ones keep their fresh
    values (model side) or are skipped (checkpoint side); each is logged.

    Args:
      step_dir: one checkpoint step folder (see `resolve_init_checkpoint`).
      params: the freshly initialised `params` (arrays with the target shardings).
      model_state: the fresh non-trainable collections (`{"batch_stats": ...}`) or {}/None.
      dont_load: regexes (re.search) of paths not to load.
      verify: read the loaded tensors back from the files and check them bitwise equal to the
        arrays placed in the model.

    Returns:
      (params, model_state, report) with report = {"checkpoint", "loaded", "not_loaded",
      "skipped_from_checkpoint"} (lists of paths; `not_loaded` keep their fresh init).

    Raises:
      IncompatibleCheckpointError: naming the first (sorted) mismatched parameter.
    """
    step_dir = absolute(step_dir)
    saved = saved_tree(step_dir)
    model_state = model_state or {}
    targets = {"params": params, "model_state": model_state}
    report = {"checkpoint": str(step_dir), "loaded": [], "not_loaded": [],
              "skipped_from_checkpoint": []}
    load_items = {}
    mismatches = []
    for coll, target in targets.items():
        tflat = _flat(target)
        sflat = _flat(saved.get(coll, {}) or {})
        # Model state is best-effort: a collection absent from the checkpoint stays fresh.
        strict = coll == "params"
        for path in sorted(set(tflat) | set(sflat)):
            shown = f"{coll}/{path}" if coll != "params" else path
            if _matches(path, dont_load):
                if path in tflat:
                    report["not_loaded"].append(shown)
                if path in sflat:
                    report["skipped_from_checkpoint"].append(shown)
                continue
            if path not in sflat:
                if strict:
                    mismatches.append((shown, f"parameter {shown!r} (shape "
                                              f"{tuple(tflat[path].shape)}) is in the model but "
                                              f"not in the checkpoint"))
                else:
                    report["not_loaded"].append(shown)
                continue
            if path not in tflat:
                mismatches.append((shown, f"parameter {shown!r} (shape "
                                          f"{tuple(sflat[path].shape)}) is in the checkpoint but "
                                          f"not in the model"))
                continue
            t_shape, s_shape = tuple(tflat[path].shape), tuple(sflat[path].shape)
            if t_shape != s_shape:
                mismatches.append((shown, f"parameter {shown!r} has shape {s_shape} in the "
                                          f"checkpoint but {t_shape} in the model"))
                continue
            load_items.setdefault(coll, {})[path] = tflat[path]
    if mismatches:
        mismatches.sort()
        raise IncompatibleCheckpointError(
            f"Checkpoint {step_dir} does not fit the model: {mismatches[0][1]} "
            f"({len(mismatches)} mismatched parameter(s) in all; check d_model / n_layers / "
            f"mixer against the stage that wrote it, or add a dont_load pattern).")

    def unflat(flat_items, leaf_fn):
        return flax.traverse_util.unflatten_dict(
            {tuple(k.split("/")): leaf_fn(v) for k, v in flat_items.items()})

    item = {coll: unflat(items, lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                               sharding=x.sharding))
            for coll, items in load_items.items()}
    with ocp.PyTreeCheckpointer() as ckptr:
        restored = ckptr.restore(step_dir / "state", args=ocp.args.PyTreeRestore(
            item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
            partial_restore=True))

    out = {}
    for coll, target in targets.items():
        tflat = dict(_flat(target))
        rflat = _flat(restored.get(coll, {})) if coll in restored else {}
        for path, value in rflat.items():
            tflat[path] = value
            report["loaded"].append(f"{coll}/{path}" if coll != "params" else path)
        out[coll] = (flax.traverse_util.unflatten_dict(
            {tuple(k.split("/")): v for k, v in tflat.items()}) if tflat else type(target)())

    if verify and load_items:
        # Independent read: the same tensors as NumPy (no sharding), compared bitwise with what
        # now sits in the model, so a wrong path, cast or resharding cannot pass silently.
        host_item = {coll: unflat(items, lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype))
                     for coll, items in load_items.items()}
        with ocp.PyTreeCheckpointer() as ckptr:
            from_file = ckptr.restore(step_dir / "state", args=ocp.args.PyTreeRestore(
                item=host_item,
                restore_args=ocp.checkpoint_utils.construct_restore_args(host_item),
                partial_restore=True))
        for coll in load_items:
            placed = _flat(out[coll])
            for path, ref in _flat(from_file[coll]).items():
                got = to_host(placed[path])
                ref = np.asarray(ref)
                if got.dtype != ref.dtype or got.shape != ref.shape or \
                        got.tobytes() != ref.tobytes():
                    raise RuntimeError(f"Loaded parameter {coll}/{path} differs from the "
                                       f"checkpoint file {step_dir} after placement")

    for path in report["not_loaded"]:
        logging.info("init_from: %s not loaded (fresh init).", path)
    for path in report["skipped_from_checkpoint"]:
        logging.info("init_from: %s in the checkpoint skipped (dont_load).", path)
    logging.info("init_from %s: loaded %d tensors%s, %d kept fresh, %d skipped.", step_dir,
                 len(report["loaded"]), " (verified bitwise)" if verify else "",
                 len(report["not_loaded"]), len(report["skipped_from_checkpoint"]))
    return out["params"], out["model_state"], report
