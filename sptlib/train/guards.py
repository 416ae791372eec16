"""What the training loop checks around a stage, beside the steps themselves.

- `StopFlag`: SIGTERM and SIGINT (Ctrl-C) ask the loop to checkpoint the current step and stop
  (exit 3 / 130); a second SIGINT interrupts at once.
- `finite_params`: whether every floating parameter is finite (one reduction, run when a
  checkpoint is about to be saved, never in the train step).
- `check_space`: the stage folder's file system has room for a checkpoint and the file-size
  limit (ulimit -f) allows one, before the first step.
- `config_changes` / `record_config`: the stage's `config.json` is the record of what its
  checkpoints were first trained with, never overwritten; a resume with another config writes
  `config.step<N>.json` and warns naming the fields.
- `upstream` / `check_inputs`: the fingerprint of the checkpoint a stage was initialised from
  (`inputs.json`); when the upstream stage has changed since, the downstream stage's folder is
  moved aside and the stage runs again from the new checkpoint.
"""

import json
import math
import os
import signal
import shutil
import threading
import time

from absl import logging
from etils import epath
import jax
import jax.numpy as jnp
import numpy as np

from sptlib.errors import PreemptedError, ResultsError, WriteError
from sptlib.train import digest as digest_lib
from sptlib.train import lock as lock_lib
from sptlib.train.checkpoint import score_of
from sptlib.train import results as results_lib

CONFIG_FILE = "config.json"
INPUTS_FILE = "inputs.json"


class StopFlag:
    """Set by SIGTERM or SIGINT (single-process runs) so the loop checkpoints and exits cleanly.

    `signum` is the signal received. A second SIGINT raises `KeyboardInterrupt` at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.requested = False
        self.signum = None
        self._previous = {}

    def install(self):
        if jax.process_count() > 1 or threading.current_thread() is not threading.main_thread():
            # Multi-host: the JAX preemption service decides (reached_preemption), consistently
            # on every process; a per-process flag could desynchronise them.
            return self
        for s in self.SIGNALS:
            self._previous[s] = signal.signal(s, self._handle)
        pending = lock_lib.pending_stop()  # a SIGTERM whose exception was swallowed before
        if pending is not None:
            self.requested, self.signum = True, pending
        return self

    def _handle(self, signum, frame):  # pylint: disable=unused-argument
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        name = signal.Signals(signum).name
        logging.warning("%s received: saving a checkpoint after this step, then stopping%s.",
                        name, " (Ctrl-C again to stop at once)" if signum == signal.SIGINT
                        else "")
        self.requested, self.signum = True, signum

    def uninstall(self):
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous = {}

    def error(self, what, then):
        """The PreemptedError of this request: "<what> on request (<signal>); <then>"."""
        how = signal.Signals(self.signum).name if self.signum else "preemption"
        return PreemptedError(f"{what} on request ({how}); {then}", signum=self.signum)


@jax.jit
def _all_finite(params):
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(params)
              if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def finite_params(params) -> bool:
    """Whether every floating parameter is finite (replicated scalar: same on every process)."""
    out = _all_finite(params)
    return bool(np.asarray(out.addressable_data(0)))


def state_bytes(state) -> int:
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)
                   if hasattr(x, "dtype")))


def check_space(stage_dir, state) -> None:
    """Room for one more checkpoint of `state` in `stage_dir`'s file system, and a file-size
    limit that allows it; raises a one-line `WriteError` naming the folder otherwise.

    A checkpoint's largest files are its arrays (up to the whole state in one OCDBT file) and
    orbax's `_METADATA` (measured: 1.3 KiB per array); both are bounded from above here."""
    text = str(stage_dir)
    if "://" in text:
        return
    leaves = [x for x in jax.tree.leaves(state) if hasattr(x, "dtype")]
    need = max(state_bytes(state), 1536 * len(leaves) + (64 << 10))
    probe = text
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    try:
        free = shutil.disk_usage(probe or ".").free
    except OSError:
        return
    if free < need + (16 << 20):
        raise WriteError(f"cannot write {stage_dir}: {free / 2**20:.1f} MiB free there, a "
                         f"checkpoint of this stage needs about {need / 2**20:.1f} MiB (+16 MiB "
                         f"for logs and results); free some space or use another --workdir")
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):
        return
    if soft != resource.RLIM_INFINITY and soft < need:
        raise WriteError(f"cannot write {stage_dir}: the file-size limit is {soft} bytes "
                         f"(ulimit -f), a checkpoint of this stage needs files of up to about "
                         f"{need} bytes; raise the limit (ulimit -f unlimited)")


# ----------------------------------------------------------------------------------------------
# What a stage was built from.
# ----------------------------------------------------------------------------------------------

def config_changes(old: dict, new: dict, stage_name: str) -> list:
    """[(dotted key, old, new)] that matter to stage `stage_name` (other stages' fields and
    the `compare` grid are left out)."""
    def relevant(c):
        c = dict(c or {})
        for key in ("compare", "stage_order"):  # the grid, and which stages run: not this one
            c.pop(key, None)
        stages = dict(c.pop("stages", {}) or {})
        c["stages"] = {stage_name: stages.get(stage_name)}
        return c
    return results_lib.nested_diffs(relevant(old), relevant(new))


def describe(changes, limit=5) -> str:
    shown = "; ".join(f"config.{k}={o!r} then, {n!r} now" for k, o, n in changes[:limit])
    return shown + (f" (+{len(changes) - limit} more)" if len(changes) > limit else "")


def _config_json(config) -> str:
    return config.to_json_best_effort(indent=2, sort_keys=True)


def latest_config(stage_dir):
    """(path, dict) of the last config the stage ran with: `config.step<N>.json` of the highest
    N, else `config.json`; (None, None) when there is none."""
    stage_dir = epath.Path(stage_dir)
    if not stage_dir.is_dir():
        return None, None
    later = sorted((int(p.name[len("config.step"):-len(".json")]), p)
                   for p in stage_dir.glob("config.step*.json")
                   if p.name[len("config.step"):-len(".json")].isdigit())
    path = later[-1][1] if later else stage_dir / CONFIG_FILE
    if not path.exists():
        return None, None
    return path, results_lib.read_json(path)


def record_config(config, stage_name, stage_dir, resumed_at=None) -> None:
    """Writes `config.json` on the stage's first start (never overwritten afterwards). A resume
    at step N with another config writes `config.step<N>.json` and warns naming the fields."""
    stage_dir = epath.Path(stage_dir)
    stage_dir.mkdir(parents=True, exist_ok=True)
    text = _config_json(config)
    first = stage_dir / CONFIG_FILE
    if not first.exists():
        results_lib.write_json(first, json.loads(text))
        return
    path, old = latest_config(stage_dir)
    changes = config_changes(old, json.loads(text), stage_name)
    if not changes:
        return
    where = stage_dir / f"config.step{int(resumed_at or 0)}.json"
    logging.warning("[%s] resuming at step %s with another config than before (%s): %s. "
                    "The new config is recorded in %s; %s keeps the earlier one.", stage_name,
                    resumed_at, path, describe(changes), where, path)
    results_lib.write_json(where, json.loads(text))


def warn_finished_changes(config, stage_name, stage_dir) -> None:
    """A finished stage is not rerun when its config changed: say which fields differ."""
    path, old = latest_config(stage_dir)
    if old is None:
        return
    changes = config_changes(old, json.loads(_config_json(config)), stage_name)
    if changes:
        logging.warning("[%s] already finished with another config (%s): %s. Its results are "
                        "kept, not recomputed; use a new --workdir to run it with this config.",
                        stage_name, path, describe(changes))


def upstream(config, stage_name, workdir):
    """{"checkpoint", "fingerprint"} of the checkpoint `init_from` designates now (None when
    the stage has no init_from or it resolves to nothing)."""
    from sptlib.train import transfer  # a cycle otherwise: transfer imports checkpoint
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


def _set_aside_old_configs(config, stage_name, stage_dir) -> None:
    """A stage starting from step 0 (no checkpoint to resume: a first run, or a rerun after it
    diverged before its first good checkpoint) is trained by this config alone: an earlier
    `config.json` (and `config.step<N>.json`) that differs is renamed `<name>.before-<time>`,
    so that `config.json` records what the new checkpoints are trained with."""
    stage_dir = epath.Path(stage_dir)
    path, old = latest_config(stage_dir)
    if old is None:
        return
    changes = config_changes(old, json.loads(_config_json(config)), stage_name)
    if not changes:
        return
    stamp = int(time.time())
    olds = [stage_dir / CONFIG_FILE] + [p for p in stage_dir.glob("config.step*.json")
                                        if p.name[len("config.step"):-len(".json")].isdigit()]
    for p in olds:
        if p.exists() and jax.process_index() == 0:
            p.replace(stage_dir / f"{p.name[:-len('.json')]}.before-{stamp}.json")
    logging.warning("[%s] starting from step 0 (no checkpoint to resume) with another config "
                    "than before (%s): %s. config.json records the new one; the earlier one is "
                    "kept as config.before-%d.json.", stage_name, path, describe(changes), stamp)


def record_start(config, stage_name, stage_dir, init_info) -> None:
    """`record_config`, and `inputs.json` when the stage starts from scratch or `init_from`
    (a resume keeps the record of what its checkpoints grew from)."""
    if init_info["kind"] == "resume":
        record_config(config, stage_name, stage_dir, init_info.get("step"))
        return
    _set_aside_old_configs(config, stage_name, stage_dir)
    record_config(config, stage_name, stage_dir)
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


def finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def previous_layout(stage_dir):
    """{"devices", "mesh"} the stage last started on (its `resolved.json`), or None."""
    path = epath.Path(stage_dir) / "resolved.json"
    try:
        old = results_lib.read_json(path) if path.exists() else None
    except ResultsError:
        return None
    return {"devices": old.get("devices"), "mesh": old.get("mesh")} \
        if isinstance(old, dict) else None


def note_layout(init_info, before, resolved, stage_name) -> None:
    """Records in `init_info` (hence results.json's `init`) a resume on another device count or
    mesh than the stage last ran on, with a warning: the data order and the reductions' rounding
    then differ from an uninterrupted run."""
    now = {"devices": resolved.num_devices,
           "mesh": {k: int(v) for k, v in resolved.mesh.shape.items()}}
    if init_info.get("kind") != "resume" or not before or before == now:
        return
    init_info["layout_changed"] = {"before": before, "now": now}
    logging.warning("[%s] resuming on %s devices (mesh %s), the stage last ran on %s (mesh %s): "
                    "recorded in results.json init.layout_changed; the run is no longer "
                    "bit-identical to an uninterrupted one.", stage_name, now["devices"],
                    now["mesh"], before.get("devices"), before.get("mesh"))


def warn_missing_best(stage, name, history, ckpt, best_step) -> None:
    """Warns when the history's best evaluation has no checkpoint any more (deleted or moved
    aside): "best" is then the best of the checkpoints that exist (`best_step`); the history
    keeps the truth."""
    scored = [(score_of(h, stage.best_metric, stage.best_mode), -h["step"], h["step"])
              for h in history if stage.best_metric in h]
    if not scored:
        return
    score, _, truth = max(scored)
    if truth == best_step or truth in ckpt.all_steps() or not math.isfinite(score):
        return
    value = next(h[stage.best_metric] for h in history if h["step"] == truth)
    logging.warning("[%s] the best checkpoint, step %d (validation %s=%.4g in history.json), is "
                    "gone from %s (deleted or moved aside): best_step is recomputed among the "
                    "checkpoints that exist (step %s); history.json keeps step %d's metrics.",
                    name, truth, stage.best_metric, value, ckpt.directory, best_step, truth)

