"""One stage's set-up, shared by training, length generalisation, the benchmark and AOT compiles.

`build_stage(config, stage_name, ...)` turns `config` + a stage name into everything a stage runs:
task info, objective, model, mesh, logical rules, optimizer, train state with its shardings, and
the jit-compiled train / eval steps (`sptlib.train.steps`: state donation, batch sharding over
the `batch` rule's mesh axes). `sptlib.train.loop.train_stage`, `sptlib.protocol.lengthgen`,
`sptlib.bench.train_step` and `sptlib.protocol.aot` all call it, so what is compiled ahead of time for a TPU
slice is what trains.

With `abstract=True` nothing is allocated: the state and the example batch are
`jax.ShapeDtypeStruct`s carrying their shardings, on any `devices` (e.g. the devices of a TPU
topology from `jax.experimental.topologies`), ready for `stage.train_step.lower(state,
batch).compile()`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Optional

import jax
import numpy as np
import optax

from sptlib import data as data_lib
from sptlib import models, objectives
from sptlib.train import flops, optim, sharding, steps
from sptlib.train.resolve import ResolvedStage, batch_shapes, resolve_stage

__all__ = ["Stage", "build_stage", "batch_shapes", "peek", "train_step_flops", "ResolvedStage"]


@dataclasses.dataclass
class Stage:
    """A built stage (see `build_stage`).

    `state` is a `TrainState` of arrays, or of `ShapeDtypeStruct`s with shardings when abstract;
    `example_batch` is the batch the shapes came from (global `ShapeDtypeStruct`s when abstract).
    `train_step` is None for an evaluation-only stage (`train=False`).
    """

    name: str
    config: Any                   # the experiment config
    cfg: Any                      # config.stages[name]
    seed: int                     # resolved.seed (config.seed + stage.seed_offset)
    info: dict                    # the task's info (vocab_size, num_classes, max_length, ...)
    objective: objectives.Objective
    model_cfg: Any                # config.model with the data-dependent fields filled in
    model: Any
    mesh: jax.sharding.Mesh
    rules: tuple
    optimizer: optax.GradientTransformation
    state: Any
    state_shardings: Any
    example_batch: dict
    train_step: Optional[Callable]
    eval_step: Callable
    resolved: ResolvedStage       # what the stage was built from (sptlib.train.resolve)

    @property
    def num_params(self) -> int:
        return int(sum(np.prod(x.shape) for x in jax.tree.leaves(self.state.params)))


def peek(iterator):
    """The iterator's next batch (for shapes), with the iterator rewound: the data order must
    not depend on the peek."""
    state0 = iterator.get_state()
    batch = next(iterator)
    iterator.set_state(state0)
    return batch


def build_stage(config, stage_name: str, *, example_batch=None, info=None, devices=None,
                abstract: bool = False, train: bool = True,
                resolved: Optional[ResolvedStage] = None) -> Stage:
    """Builds stage `stage_name` of `config` (the code path `train_stage` runs).

    Args:
      config: the experiment config (`sptlib.train.config`).
      stage_name: a key of `config.stages`.
      example_batch: a batch (dict of arrays, this process's share) whose shapes the state is
        initialised from; default: `batch_shapes(info, resolved.batch_size)` (abstract, global).
      info: the task's `info`; default: `sptlib.data.get_task(config.data).info` (reads the
        data's metadata; `sptlib.data.task_info(config.data)` avoids the disk).
      devices: the mesh's devices (default `jax.devices()`); may be TPU topology devices.
      abstract: allocate nothing: `state` is `ShapeDtypeStruct`s with shardings.
      train: False builds an evaluation-only stage (`optax.identity`, no train step).
      resolved: the stage already resolved for these `devices` and `info` (`resolve_stage`);
        default: resolved here.

    Returns:
      A `Stage`.
    """
    stage = config.stages[stage_name]
    if resolved is None:
        if info is None:
            info = data_lib.get_task(config.data).info
        resolved = resolve_stage(config, stage_name, devices=devices, info=info)
    info, seed = resolved.info, resolved.seed
    model_cfg, mesh, rules = resolved.model_cfg, resolved.mesh, list(resolved.rules)
    objective = objectives.make_objective(stage.objective, info, model_cfg)
    model = models.build_model(model_cfg, objective.head_cfg)
    if example_batch is None:
        example_batch = batch_shapes(info, resolved.batch_size,
                                     sharding=sharding.batch_sharding(mesh, rules))

    if train:
        abstract_vars, _ = steps.state_logical_specs(model, objective, example_batch)
        peaks = {group: lr for group, lr, _ in resolved.learning_rates}
        optimizer = optim.make_optimizer(stage.optim, abstract_vars["params"],
                                         max(1, resolved.num_steps), peaks)
    else:
        optimizer = optax.identity()  # the eval step never applies it
    if abstract:
        state, shardings = steps.abstract_train_state(model, optimizer, example_batch, mesh,
                                                      rules, objective=objective)
    else:
        state, shardings = steps.init_train_state(model, optimizer, example_batch,
                                                  jax.random.PRNGKey(seed), mesh, rules,
                                                  objective=objective)
    train_step = (steps.make_train_step(model, objective, optimizer, mesh, shardings, rules)
                  if train else None)
    eval_step = steps.make_eval_step(model, objective, mesh, shardings, rules)
    return Stage(name=stage_name, config=config, cfg=stage, seed=seed, info=info,
                 objective=objective, model_cfg=model_cfg, model=model, mesh=mesh, rules=rules,
                 optimizer=optimizer,
                 state=state, state_shardings=shardings, example_batch=example_batch,
                 train_step=train_step, eval_step=eval_step, resolved=resolved)


def train_step_flops(built: Stage, *, strict: bool = True) -> Optional[float]:
    """FLOPs of one train step on the global batch, counted from the traced step with loop trip
    counts (`sptlib.train.flops`); nothing is compiled or run. `strict=False` (results.json:
    compute accounting must never lose a finished run) logs a failure and returns None."""
    if not strict:
        try:
            return train_step_flops(built)
        except Exception as e:  # noqa: BLE001
            logging.warning("[%s] could not count the train step's FLOPs: %s", built.name, e)
            return None
    pc = 1 if isinstance(built.state.step, jax.ShapeDtypeStruct) else jax.process_count()
    batch = {k: jax.ShapeDtypeStruct((v.shape[0] * pc,) + tuple(v.shape[1:]), v.dtype)
             for k, v in built.example_batch.items()}
    # Shapes only: the state's buffers may have been donated to a train step since.
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                         built.state, built.state_shardings)
    return flops.step_flops(built.train_step, state, batch)
