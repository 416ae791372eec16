"""What a stage's checkpoints were trained with: its config and device layout over restarts.

The stage's `config.json` is the record of what its checkpoints were first trained with, never
overwritten; a resume with another config writes `config.step<N>.json` and warns naming the
fields; a start from step 0 with another config sets the earlier records aside. A resume on
another device count or mesh than `resolved.json` names is recorded in results.json's `init`;
`inputs.json` records what a stage started from (random init, or `init_from`'s fingerprint).
"""

import json
import time

from absl import logging
from etils import epath
import jax

from sptlib.errors import ResultsError
from sptlib.train import results as results_lib

CONFIG_FILE = "config.json"
INPUTS_FILE = "inputs.json"  # what the stage started from (`record_start`)


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


def set_aside_old_configs(config, stage_name, stage_dir) -> None:
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


def record_start(config, stage_name, stage_dir, init_info) -> None:
    """`record_config`, and `inputs.json` when the stage starts from scratch or `init_from`
    (a resume keeps the record of what its checkpoints grew from)."""
    if init_info["kind"] == "resume":
        record_config(config, stage_name, stage_dir, init_info.get("step"))
        return
    set_aside_old_configs(config, stage_name, stage_dir)
    record_config(config, stage_name, stage_dir)
    inputs = {"kind": init_info["kind"], "time": time.time()}
    if init_info["kind"] == "init_from":
        inputs["init_from"] = {k: init_info.get(k) for k in ("checkpoint", "fingerprint")}
    results_lib.write_json(epath.Path(stage_dir) / INPUTS_FILE, inputs)
