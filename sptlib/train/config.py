"""The experiment config every trainer run reads: `base_config()` and `stage_config()`.

An experiment file (`experiments/<name>.py`, e.g. `lra.py`, whose `arg` names task, model and
regime: `lra.py:listops,s4d,spt-masked`) defines `get_config(arg=None)` that starts from
`base_config()`, sets the data, model and stages, and returns it. The returned config is *locked*:
assigning or overriding (`--config.a.b=v`) a key that does not exist is an error, so a typo never
silently trains the default. `docs/training.md` documents every field.

Layout:
    seed, data, model, mesh, logical_axis_rules, stage_order, stages.<name>.{objective, optim, ...}
Each stage runs in `workdir/<name>/` (see `sptlib.protocol.stages.run`).
"""

import ml_collections
from ml_collections import config_dict

from sptlib import objectives
from sptlib.data import config as data_config_lib
from sptlib.errors import ConfigError
from sptlib.models import config as model_config_lib
from sptlib.train import convergence
from sptlib.train import optim
from sptlib.train import sharding

# Keys `stage_config` accepts as plain overrides (the rest of a stage is `objective` and `optim`).
_STAGE_SCALARS = (
    "num_steps", "batch_size", "eval_batch_size", "eval_every", "eval_steps", "checkpoint_every",
    "keep", "best_metric", "best_mode", "init_from", "init_checkpoint", "init_fallback", "dont_load",
    "log_every",
    "async_checkpoints", "seed_offset", "start_over_if_unreadable", "patience", "min_delta",
)


def profile_config():
    """Options of the optional `jax.profiler` trace of a window of training steps."""
    c = ml_collections.ConfigDict()
    # First step of the traced window (counted as finished steps); 0 disables profiling.
    c.start_step = 0
    # Number of steps traced; the trace lands in `workdir/<stage>/profile/`.
    c.num_steps = 5
    return c


def stage_config(**overrides):
    """Returns one stage's config, e.g. `stage_config(objective="masked", num_steps=2000)`.

    Args:
      **overrides: any stage field. `objective` may be an objective kind (`masked | causal |
        classify | retrieval | tagging`, expanded with `objectives.objective_config`) or a
        full ConfigDict; `optim` a ConfigDict or a dict of fields to set on `optim_config()`;
        `profile` likewise. An unknown field raises `KeyError`.

    Returns:
      An unlocked ConfigDict (it is locked with the whole config by `base_config` users).
    """
    c = ml_collections.ConfigDict()
    # Training objective (sptlib.objectives.objective_config): kind, mask_rate, span_length, ...
    c.objective = objectives.objective_config("classify")
    # Optimiser and schedule (sptlib.train.optim.optim_config): lr, ssm_lr, weight_decay, ...
    c.optim = optim.optim_config()
    # Number of optimiser steps of this stage.
    c.num_steps = 1000
    # Global batch size (summed over all processes and devices); must divide by the process count.
    c.batch_size = 32
    # Global batch size of evaluation; 0 = batch_size.
    c.eval_batch_size = 0
    # Evaluate on validation every this many steps (and at the last step).
    c.eval_every = 200
    # Validation batches per evaluation; 0 = the full split. Final test evaluations use the full split.
    c.eval_steps = 0
    # Save a checkpoint every this many steps (and at every evaluation, at the last step and on
    # preemption / SIGTERM).
    c.checkpoint_every = 200
    # Number of most recent checkpoints kept; the best one by `best_metric` is kept in addition.
    c.keep = 2
    # Validation metric that picks the best checkpoint (a key of the objective's metrics), and
    # whether larger (max) or smaller (min) is better.
    c.best_metric = "accuracy"
    c.best_mode = "max"
    # Where the parameters come from when this stage has no checkpoint of its own: a stage name
    # (its `workdir/<name>/` checkpoints), a checkpoint directory, or one step's directory; None =
    # random init. Only parameters (and model state such as batch-norm statistics) are loaded.
    c.init_from = config_dict.placeholder(str)
    # Which checkpoint of `init_from` to load: best (by its best_metric) | latest.
    c.init_checkpoint = "best"
    # init_checkpoint=best and the best checkpoint that `init_from`'s results.json names is gone
    # (deleted, moved aside): False = stop with one line; True = start from the best checkpoint
    # that exists, with a warning, recorded in results.json (`init.fallback`) and comparison.json.
    c.init_fallback = False
    # Regexes (re.search on 'collection/path' such as 'head/dense/kernel', collection stripped)
    # of parameters NOT loaded from `init_from`: they keep their fresh initialisation.
    c.dont_load = ("^head/",)
    # Write training metrics and a progress line (steps/s, ETA) every this many steps.
    c.log_every = 50
    # Save checkpoints asynchronously (training continues while the files are written).
    c.async_checkpoints = True
    # Added to config.seed for this stage's init, dropout and data order.
    c.seed_offset = 0
    # When every checkpoint of this stage is unreadable (moved to checkpoints/corrupt/): False =
    # stop with an error; True = train the stage again from its start (an explicit choice).
    c.start_over_if_unreadable = False
    # Train to convergence (sptlib.train.convergence): stop after `patience` evaluations in a
    # row without an improvement of best_metric by more than `min_delta`; num_steps is the cap.
    # 0 = train exactly num_steps.
    c.patience = 0
    c.min_delta = 0.0
    # Optional profiler trace of a window of steps.
    c.profile = profile_config()
    for key, value in overrides.items():
        if key == "objective":
            c.objective = (objectives.objective_config(value) if isinstance(value, str)
                           else value)
        elif key in ("optim", "profile"):
            if isinstance(value, ml_collections.ConfigDict):
                setattr(c, key, value)
            else:
                getattr(c, key).update(value)
        elif key in _STAGE_SCALARS:
            setattr(c, key, value)
        else:
            raise KeyError(f"Unknown stage config field {key!r}; known: "
                           f"{sorted(('objective', 'optim', 'profile') + _STAGE_SCALARS)}")
    return c


def base_config():
    """Returns the default config: a masked-SPT `pretrain` stage, then a `finetune` stage.

    A third stage, `scratch` (classification from random init), is defined so that the baseline of
    the same experiment is one override away: `--config.stage_order="('scratch',)"` (see
    docs/training.md). The config is locked: unknown keys are errors.
    """
    c = ml_collections.ConfigDict()
    # Base random seed (parameter init, dropout, masking, data order); stages add `seed_offset`.
    c.seed = 0
    # Data (sptlib.data.config.data_config): task, lra_dir, max_length, ...
    c.data = data_config_lib.data_config()
    # Model (sptlib.models.config.model_config): mixer, sizes, encoder, pooling, ...
    c.model = model_config_lib.model_config()
    # Device mesh (sptlib.train.sharding.mesh_config): data, fsdp, tensor, dcn_data, dcn_fsdp.
    c.mesh = sharding.mesh_config()
    # Logical axis name -> mesh axis (or list of mesh axes, or None = replicated).
    c.logical_axis_rules = [tuple(r) for r in sharding.default_rules()]
    # The hardware this config is sized for, checked without it by `python -m sptlib.aot`.
    c.aot = ml_collections.ConfigDict()
    # Target TPU slice, e.g. "v4-8", "v5e-16", "v5p-128"; "" = not sized for a pod.
    c.aot.slice = ""
    # Mesh axes on that slice, applied over `mesh` there (by `sptlib.protocol.aot` and, with
    # --tensor/--fsdp, the TPU launcher); 0 = keep `mesh`'s. The local `mesh` stays all-data, so
    # the same config runs on a laptop unchanged.
    c.aot.tensor = 0
    c.aot.fsdp = 0
    # Stages run in this order, each in workdir/<stage>/.
    c.stage_order = ("pretrain", "finetune")
    c.stages = ml_collections.ConfigDict()
    # Self-pretraining: masked denoising on the task's own training inputs.
    c.stages.pretrain = stage_config(objective="masked", best_metric="loss", best_mode="min",
                                     dont_load=())
    # Finetuning: classifier head on the best pretrain checkpoint's backbone.
    c.stages.finetune = stage_config(objective="classify", init_from="pretrain")
    # Training from random init (the SPT paper's "scratch" baseline).
    c.stages.scratch = stage_config(objective="classify")
    c.lock()
    return c


def validate(config):
    """Checks cross-field consistency that the lock cannot; raises ConfigError naming the key."""
    order = tuple(config.stage_order)
    if not order:
        raise ConfigError("config.stage_order is empty")
    for name in order:
        if name not in config.stages:
            raise ConfigError(f"config.stage_order names stage {name!r} but config.stages has only "
                              f"{sorted(config.stages.keys())}")
        s = config.stages[name]
        for field in ("num_steps", "batch_size", "eval_every", "checkpoint_every", "log_every"):
            if s[field] <= 0:
                raise ConfigError(f"config.stages.{name}.{field} must be positive, got {s[field]}")
        for field in ("eval_batch_size", "eval_steps"):
            if s[field] < 0:
                raise ConfigError(f"config.stages.{name}.{field} must be >= 0 (0 = default), got "
                                  f"{s[field]}")
        if s.keep < 1:
            raise ConfigError(f"config.stages.{name}.keep must be >= 1, got {s.keep}")
        if s.best_mode not in ("min", "max"):
            raise ConfigError(f"config.stages.{name}.best_mode must be min or max, got "
                              f"{s.best_mode!r}")
        if s.init_checkpoint not in ("best", "latest"):
            raise ConfigError(f"config.stages.{name}.init_checkpoint must be best or latest, got "
                              f"{s.init_checkpoint!r}")
        bad = convergence.validate(name, s)
        if bad:
            raise ConfigError(bad)
        if s.init_from == name:
            raise ConfigError(f"config.stages.{name}.init_from names the stage itself")
