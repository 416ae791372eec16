"""Checks made before the first training step, so bad input fails in seconds, not after training.

`check(config, workdir)` is called once by `sptlib.protocol.stages.run`, after `config.validate` and
before any stage runs. Each failure is a `sptlib.errors.SptlibError` naming the config key, file
or flag and what to do:

  - the workdir is a folder (or can be created) and is writable; a remote (`gs://`) workdir
    answers within `workdir_checks.REMOTE_TIMEOUT_S` (the stage runner checks the stages'
    folders, `workdir_checks.check_stage_dirs`; `sptlib.train.resolve.resolve_run` that every
    batch divides over its devices and processes);
  - the model's choices (mixer, pattern, positions, encoder, dtype) and sizes, every stage's
    optimizer numbers (non-negative) and schedule;
  - every stage: the objective's parameters (mask_rate in (0, 1), span_length >= 1), and
    `best_metric` is a metric the objective reports;
  - a stage folder that already holds checkpoints or results was run with the same model, data
    and objective (its saved `config.json`), so its checkpoints belong to this config;
  - `config.data.lra_dir` is not empty for the tasks that read it;
  - every data split is read: the files exist and parse (errors name file and line), it holds
    examples, and its first and last records (every record of a validation/test split of at
    most `FULL_PROBE` examples) decode.
"""

import json
import math
import os

from absl import logging
from etils import epath

from sptlib import data as data_lib
from sptlib import write_errors
from sptlib import objectives
from sptlib.models import build
from sptlib.errors import (CheckpointMismatchError, ConfigError, DataError,
                           ResultsError)
from sptlib.train import results as results_lib, sharding, workdir_checks

# Validation/test splits up to this size are decoded record by record (a corrupt or wrong-size
# image anywhere in them is found before training); larger ones are probed at both ends.
FULL_PROBE = 20000
# Config fields a stage's checkpoints depend on: a change means they belong to another config.
IDENTITY = ("model", "data.task", "data.input_type", "data.max_length")
# Tasks whose files live under config.data.lra_dir (an empty value would mean the current folder).
LRA_TASKS = ("listops", "retrieval", "pathfinder", "pathx", "pathx256")



def check(config, workdir) -> tuple:
    """Runs every check below; raises the first failure (a `SptlibError`).

    Returns `(data_info, task)`: the data's counted skips for the run's summary,
    `{"examples": {split: n}, "truncated": {split: n}, "empty_images": n}`, and the task
    (`sptlib.data.get_task`) whose splits were read, for the stages to train on."""
    workdir_checks.check_workdir(workdir, config.stage_order)
    check_model(config.model)
    for name in config.stage_order:
        check_objective(config, name)
        check_best_metric(config, name)
        check_optim(config, name)
    check_saved_configs(config, workdir)
    info, task = check_data(config)
    check_batch_vs_data(config, info["examples"].get("train", 0))
    # The user's files: their inferred spec is written once, and must match on resume.
    data_lib.record_spec(config.data, workdir, write=sharding.is_main_process())
    return info, task


def check_batch_vs_data(config, num_train) -> None:
    """Warns (one line) when a stage's batch is larger than the training split: every batch
    then repeats examples within itself, which is rarely what was meant."""
    for name in config.stage_order:
        bs = int(config.stages[name].batch_size)
        if num_train and bs > num_train:
            logging.warning("config.stages.%s.batch_size=%d is larger than the training split "
                            "(%d examples): each batch repeats examples; lower the batch size "
                            "or use more data.", name, bs, num_train)


def _choice(key, value, allowed):
    if value not in allowed:
        raise ConfigError(f"{key}={value!r}: expected one of {', '.join(map(str, allowed))}")


def _at_least(key, value, low):
    # NaN compares False with everything and inf passes `< low`: both would train a step (or
    # more) before failing as "diverged", so a non-finite number is refused here.
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}={value!r}: must be a finite number >= {low}")
    if value < low:
        raise ConfigError(f"{key}={value!r}: must be >= {low}")


def check_model(m) -> None:
    """The model fields that select code or size (`sptlib.models.config`)."""
    _choice("config.model.pattern", m.pattern, build.PATTERNS)
    bow = m.pattern == "bow"  # the bag-of-words control: no mixer, no layers
    if not bow:  # a zoo mixer, or the user's by import path keeping the mixer contract
        build.check_mixer(m)
    _choice("config.model.positions", m.positions, ("none", "sinusoidal", "learned"))
    _choice("config.model.encoder", m.encoder, ("token", "linear"))
    _choice("config.model.dtype", m.get("dtype", "float32"), sorted(build.DTYPES) + ["auto"])
    _at_least("config.model.d_model", m.d_model, 1)
    _at_least("config.model.n_layers", m.n_layers, 0 if bow else 1)
    _at_least("config.model.max_length", m.max_length, 0)
    if not 0.0 <= m.dropout < 1.0:
        raise ConfigError(f"config.model.dropout={m.dropout!r}: must be in [0, 1)")


def check_optim(config, name) -> None:
    o, key = config.stages[name].optim, f"config.stages.{name}.optim"
    for field in ("lr", "ssm_lr", "ssm_dt_lr", "weight_decay", "ssm_weight_decay",
                  "warmup_steps", "grad_clip", "min_lr_ratio"):
        if o.get(field) is not None:
            _at_least(f"{key}.{field}", o[field], 0)
    _choice(f"{key}.schedule", o.schedule, ("constant", "cosine"))
    for field, why in (("b1", "Adam's first-moment decay"), ("b2", "Adam's second-moment decay; "
                                                                  "1.0 divides by zero at step 1")):
        if o.get(field) is not None and not 0.0 <= float(o[field]) < 1.0:
            raise ConfigError(f"{key}.{field}={o[field]!r}: must be in [0, 1) ({why}; the paper "
                              f"uses b1=0.9, b2=0.999)")
    if o.get("eps") is not None and not float(o.eps) > 0:
        raise ConfigError(f"{key}.eps={o.eps!r}: must be > 0")
    if o.get("min_lr_ratio") is not None and float(o.min_lr_ratio) > 1:
        raise ConfigError(f"{key}.min_lr_ratio={o.min_lr_ratio!r}: must be in [0, 1]")


def check_objective(config, name) -> None:
    obj = config.stages[name].objective
    key = f"config.stages.{name}.objective"
    _choice(f"{key}.kind", obj.kind, objectives.KINDS)
    smoothing = obj.get("label_smoothing")
    if smoothing is not None and not 0.0 <= float(smoothing) < 1.0:
        raise ConfigError(f"{key}.label_smoothing={smoothing!r}: must be in [0, 1) (the "
                          f"weight moved from the true label to the uniform distribution)")
    if obj.kind not in ("masked", "causal"):
        return
    if obj.kind == "masked":
        rate = float(obj.mask_rate)
        if not 0.0 < rate < 1.0:
            raise ConfigError(f"{key}.mask_rate={obj.mask_rate!r}: must be in (0, 1), the "
                              f"fraction of positions masked (the paper uses 0.1 to 0.5)")
        span = obj.span_length
        if not float(span).is_integer() or int(span) < 1:
            raise ConfigError(f"{key}.span_length={span!r}: must be an integer >= 1")


def metric_names(objective_cfg) -> set:
    """The validation metrics an objective reports (`sptlib.objectives`)."""
    names = {"loss"}
    if objective_cfg.kind in ("classify", "retrieval", "tagging") or \
            objective_cfg.get("target") != "l1":
        names.add("accuracy")
    if objective_cfg.kind == "tagging":
        names.add("exact")
    if objective_cfg.kind == "masked":
        names.add("masked_fraction")
    if objective_cfg.kind == "causal":
        names.add("bits_per_token")
    return names


def check_best_metric(config, name) -> None:
    stage = config.stages[name]
    names = metric_names(stage.objective)
    if stage.best_metric not in names:
        raise ConfigError(f"config.stages.{name}.best_metric={stage.best_metric!r}: the "
                          f"{stage.objective.kind!r} objective reports {sorted(names)}")


def _get(tree, dotted):
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def check_saved_configs(config, workdir) -> None:
    """A stage that already ran here ran with this model, data and objective (`config.json`)."""
    current = json.loads(config.to_json_best_effort())
    for name in config.stage_order:
        stage_dir = epath.Path(workdir) / name
        saved_path = stage_dir / "config.json"
        if not saved_path.exists():
            continue
        try:
            saved = json.loads(results_lib.read_text_no_link(saved_path))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ResultsError(f"{saved_path} is unreadable (truncated?); restore it or move the "
                               f"stage folder aside") from None
        keys = IDENTITY + (f"stages.{name}.objective.kind",)
        diffs = []
        for key in keys:
            diffs += results_lib.nested_diffs(_get(saved, key), _get(current, key), key)
        if diffs:
            shown = "; ".join(f"config.{k}={o!r} there, {n!r} now" for k, o, n in diffs[:3])
            more = f" (+{len(diffs) - 3} more)" if len(diffs) > 3 else ""
            raise CheckpointMismatchError(
                f"stage {name!r} in {stage_dir} was run with another config ({saved_path}): "
                f"{shown}{more}. Its checkpoints and results belong to that config; nothing was "
                f"changed. Use a new --workdir, or restore the config.")


def _probe(task, split, where) -> int:
    """Reads `split` (see the module docstring); returns its number of examples."""
    src = task.source(split)  # parses the files: errors name file and line
    n = len(src)
    if split == "train":
        n = task.num_examples(split)  # after config.data.data_fraction
    if n == 0:
        raise DataError(f"{where}: the {split} split holds no examples (an empty or header-only "
                        f"file?); regenerate or fix the data, or check config.data.data_fraction")
    total = len(src)
    ids = range(total) if split != "train" and total <= FULL_PROBE else sorted({0, total - 1})
    for i in ids:
        src[i]  # decodes: a corrupt or wrong-size record raises a DataError naming it
    return n


def check_data(config) -> tuple:
    """Every split of `config.data` is readable and non-empty (see the module docstring);
    returns `(counts, task)` (see `check`)."""
    _at_least("config.data.max_length", config.data.max_length, 0)
    if config.data.task in LRA_TASKS and not str(config.data.get("lra_dir") or "").strip():
        raise ConfigError(f"config.data.lra_dir={config.data.get('lra_dir')!r} is empty: task "
                          f"{config.data.task!r} reads its files from there; give the folder "
                          f"(e.g. --config.data.lra_dir=lra_release)")
    where = f"config.data (task {config.data.task!r}, lra_dir={config.data.lra_dir!r})"
    lra_dir = str(config.data.get("lra_dir") or "")
    if lra_dir and "://" not in lra_dir:
        workdir_checks.check_link(os.path.abspath(lra_dir), "config.data.lra_dir")
        if os.path.isdir(lra_dir):
            for entry in os.scandir(lra_dir):
                workdir_checks.check_link(entry.path, "config.data.lra_dir")
    try:
        task = data_lib.get_task(config.data)  # generates the data when configured to
        counts = {split: _probe(task, split, where) for split in ("train", "validation", "test")}
    except (DataError, ConfigError):
        raise
    except OSError as e:  # e.g. a full disk while the data is generated
        found = write_errors.find_write_error(e, os.path.abspath(lra_dir) if lra_dir else None)
        if found is None:
            raise
        workdir_hint = "; pick a writable --workdir"
        if str(found).endswith(workdir_hint):  # the data folder is at fault, not the workdir
            errno_ = getattr(found, "errno", None)
            found = type(found)(str(found)[:-len(workdir_hint)] + (
                "; the task data is generated there: make that folder writable or pick a "
                "writable data folder (--config.data.lra_dir=DIR or $SPTLIB_DATA)"))
            found.errno = errno_
        raise found from e
    except ValueError as e:  # the data builders' own checks (task, input_type, fraction, ...)
        raise ConfigError(f"config.data: {e}") from e
    empty = int(getattr(task.source("train"), "num_empty", 0))
    logging.info("preflight: %s splits %s read; truncated at max_length: %s%s.",
                 config.data.task, counts, task.num_truncated,
                 f"; {empty} empty images skipped" if empty else "")
    return ({"examples": counts, "truncated": dict(task.num_truncated), "empty_images": empty},
            task)
