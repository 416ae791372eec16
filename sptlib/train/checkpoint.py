"""Orbax checkpoints of one training stage (parameter transfer between stages:
`sptlib.train.transfer`).

Layout of one stage's checkpoints (`workdir/<stage>/checkpoints/`):

    <step>/state/      the `TrainState` (orbax PyTree / OCDBT; arrays restored onto any mesh)
    <step>/data/       every process's training data iterator state (JSON), saved with the state
    <step>/metrics/    validation metrics of that step (when evaluated) plus `score`
    <step>/digest/     SHA-256 of every array and of the data and metrics items, recorded at save
                       time (`sptlib.train.digest`); a restore that reads other bytes fails
    corrupt/<step>-*   checkpoints found unreadable or damaged, moved aside (never deleted)
    diverged/<step>-*  checkpoints of a diverged state (`sptlib.train.loop`), moved aside

`score` is the stage's `best_metric` signed so that larger is better (`-loss` for best_mode=min;
`sptlib.train.convergence.score_of`):
any reader can pick the best checkpoint of a directory without knowing the stage's config.

Retention: the latest `keep` checkpoints plus the best-scoring one (orbax
`AnyPreservationPolicy(LatestN, BestN)`), so pruning never drops the best checkpoint.

Restore priority (MaxText's), implemented by `sptlib.train.loop`:
  1. the stage's own latest readable checkpoint -> full resume (`StageCheckpointer.restore_latest`).
     A checkpoint of another config (tree, shape, dtype) stops the run, nothing moved; only
     unreadable ones (missing or corrupt files, bytes that differ from the save-time digest, an
     unreadable metrics file) are moved to `corrupt/`, and if none is left the run stops rather
     than restarting from step 0 (unless `stages.<s>.start_over_if_unreadable`);
  2. else `init_from` -> parameters only (`sptlib.train.transfer.load_pretrained`);
  3. else the random init.
Every path is an `etils.epath.Path`, so `gs://` workdirs work like local ones.
"""

import json
import math
import time
from typing import Any, Optional, Sequence

from absl import logging
from etils import epath
import jax
from jax.experimental import multihost_utils
import orbax.checkpoint as ocp

from sptlib import errors
from sptlib.errors import (CheckpointDigestError, CheckpointMismatchError,
                           NoReadableCheckpointError)
from sptlib.train import digest as digest_lib
from sptlib.train.checkpoint_io import (
    absolute, describe_mismatch,
    gather_iterator_states, leaf_specs, local_iterator_state, saved_tree,
    to_host)

CHECKPOINTS_DIR = "checkpoints"
CORRUPT_DIR = "corrupt"
DIVERGED_DIR = "diverged"
# Keys of the data item besides the iterator states (`save(extra=...)`).
_ITERATOR_KEYS = ("process_count", "states")


# ----------------------------------------------------------------------------------------------
# Helpers.
# ----------------------------------------------------------------------------------------------

def is_step_dir(path: epath.Path) -> bool:
    """Whether `path` is one checkpoint step's folder (`<step>/state`)."""
    return path.name.isdigit() and (path / "state").exists()


def best_step(directory) -> Optional[int]:
    """The best checkpoint of a checkpoints folder: the highest `score` of its steps' metrics
    (ties go to the earlier step, the first time the score was reached); the latest step when
    none has a score; None when the folder holds no checkpoint. It needs no stage config: the
    score was signed by `best_mode` when it was saved."""
    directory = epath.Path(directory)
    steps = sorted(int(p.name) for p in directory.iterdir() if is_step_dir(p)) \
        if directory.is_dir() else []
    scored = []
    for s in steps:
        try:
            metrics = json.loads((directory / str(s) / "metrics" / "metrics").read_text())
            scored.append((float(metrics["score"]), -s))
        except Exception:  # pylint: disable=broad-except  (no metrics: not evaluated)
            continue
    if not scored:
        return steps[-1] if steps else None
    return -max(scored)[1]


class _NoLibraryTracebacks:
    """Keeps orbax's (and asyncio's) error records to their first line: a failed background
    write reaches the user as one `WriteError` line; `--verbose` / SPTLIB_TRACEBACK=1 keeps the
    tracebacks."""

    def filter(self, record):
        if record.exc_info and ("/orbax/" in record.pathname or record.name == "asyncio") \
                and not errors.wants_traceback():
            record.msg = (record.getMessage().splitlines() or [""])[0][:300]
            record.args = ()
            record.exc_info = record.exc_text = record.stack_info = None
        return True


_FILTER = _NoLibraryTracebacks()


def quiet_library_tracebacks():
    import logging as pylogging
    for name in ("absl", "asyncio"):
        if _FILTER not in pylogging.getLogger(name).filters:
            pylogging.getLogger(name).addFilter(_FILTER)


def _score_fn(metrics):
    return float(metrics.get("score", -math.inf))


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
        self.manager = None
        # Unreadable steps moved aside: [{step, error, moved_to}] (see `restore_latest`).
        self.quarantined = []
        # The data item's extra keys of the last restore (`save(extra=...)`).
        self.extra = {}
        quiet_library_tracebacks()
        self._check_metrics_files()  # orbax reads every metrics file when it opens the folder
        policy = ocp.checkpoint_managers.AnyPreservationPolicy([
            ocp.checkpoint_managers.LatestN(n=keep),
            ocp.checkpoint_managers.BestN(get_metric_fn=_score_fn, n=1,
                                          keep_checkpoints_without_metrics=False),
        ])
        options = ocp.CheckpointManagerOptions(
            best_fn=_score_fn, best_mode="max", preservation_policy=policy,
            enable_async_checkpointing=async_saves, cleanup_tmp_directories=True, create=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options,
                                             item_names=("state", "data", digest_lib.ITEM))

    def _check_metrics_files(self):
        """Moves aside every step whose metrics file is unreadable or differs from its digest
        (orbax would stop on it with a JSONDecodeError before anything could fall back)."""
        try:
            if not self.directory.is_dir():
                return
        except Exception:  # pylint: disable=broad-except
            return  # an unreachable object store: the manager reports it
        for step_dir in sorted(self.directory.iterdir(), key=lambda p: p.name):
            if not step_dir.name.isdigit() or not step_dir.is_dir():
                continue
            path = step_dir / "metrics" / "metrics"
            try:
                rec = digest_lib.read(step_dir)
                if path.exists():
                    metrics = json.loads(path.read_text())
                    if rec is not None:
                        digest_lib.check_json(rec, "metrics", metrics, path)
                elif rec is not None and rec.get("metrics"):
                    raise CheckpointDigestError(f"{path} is missing")
                continue
            except (ValueError, UnicodeDecodeError, CheckpointDigestError) as e:
                error = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
            step = int(step_dir.name)
            logging.warning("Checkpoint step %d in %s has a damaged metrics/digest file (%s); "
                            "falling back to the previous checkpoint.", step, self.directory,
                            error)
            self.quarantined.append({"step": step, "error": error,
                                     "moved_to": str(self._quarantine(step))})

    # -- queries ------------------------------------------------------------------------------
    def all_steps(self) -> Sequence[int]:
        return sorted(self.manager.all_steps())

    def latest_step(self) -> Optional[int]:
        return self.manager.latest_step()

    def best_step(self) -> Optional[int]:
        """`best_step(self.directory)`: the best-scoring checkpoint that exists (a step folder
        deleted behind the manager's back is not a candidate)."""
        steps = self.all_steps()
        if any(not (self.directory / str(s)).exists() for s in steps):
            self.manager.reload()  # its cached list still names the deleted steps
        return best_step(self.directory)

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
             metrics: Optional[dict] = None, extra: Optional[dict] = None) -> bool:
        """Starts an (async) save of `state` and the data iterator state at `step`, with the
        digest of both (computed here, from the host copy of `state`).

        Args:
          metrics: validation metrics of this step (must contain `score`); None if not evaluated.
          extra: JSON kept in the data item beside the iterator states (the loop's validation
            history and wall time, so that a damaged history.json can be rebuilt); read back
            as `self.extra` after a restore.
        Returns:
          Whether a save was started (False when the step is already saved).
        """
        if step in self.manager.all_steps():
            return False
        data = dict(extra or {}, **gather_iterator_states(iterator_state))
        data[digest_lib.ITEM] = digest_lib.VERSION
        record = digest_lib.make(state, data, metrics, to_host)
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data),
            **{digest_lib.ITEM: ocp.args.JsonSave(record)})
        return bool(self.manager.save(step, args=args, metrics=metrics, force=True))

    def wait_until_finished(self):
        self.manager.wait_until_finished()

    def close(self):
        self.manager.wait_until_finished()
        self.manager.close()

    # -- restore --------------------------------------------------------------------------------
    def restore(self, step: int, abstract_state) -> tuple:
        """Restores (state, iterator_state) of `step` onto the shardings in `abstract_state`,
        every array and the data item checked against the save-time digest.

        Raises:
          CheckpointDigestError: what was read differs from what was saved (names the array).
        """
        step_dir = self.directory / str(step)
        record = digest_lib.read(step_dir)
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
        if record is None:
            logging.warning("Checkpoint %s has no digest (written before digests): restored "
                            "without verifying its contents.", step_dir)
        else:
            digest_lib.check_arrays(record, digest_lib.array_digests(restored.state, to_host),
                                    step_dir)
            digest_lib.check_json(record, "data", restored.data, step_dir)
        data = restored.data
        self.extra = ({k: v for k, v in data.items() if k not in _ITERATOR_KEYS}
                      if isinstance(data, dict) and "states" in data else {})
        return restored.state, local_iterator_state(data)

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

    def set_aside(self, steps: Sequence[int], folder: str = DIVERGED_DIR) -> list:
        """Moves the given steps' folders to `folder/` (never deleted); returns where to."""
        self.wait_until_finished()
        return [str(self._quarantine(s, folder)) for s in steps]

    def _quarantine(self, step: int, folder: str = CORRUPT_DIR) -> epath.Path:
        """Moves an unreadable step folder aside so the manager no longer lists it."""
        src = self.directory / str(step)
        dst = self.directory / folder / f"{step}-{int(time.time())}"
        n = 0
        while dst.exists():  # the same step set aside twice within a second
            n += 1
            dst = self.directory / folder / f"{step}-{int(time.time())}-{n}"
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
        if self.manager is not None:
            self.manager.reload()
        return dst
