"""The resolved run: an experiment config turned, once, into what each stage runs on the devices.

`resolve_stage(config, stage_name, devices=..., info=...)` fixes everything the config leaves
to the machine: the platform, the mesh sizes on the devices present, the logical axis rules, the
global batch shapes of the train and eval steps, the model config with its data-dependent fields
and `dtype="auto"` filled in, and the attention kernel each platform's dispatcher will lower.
It also decides, once, what the code below reads instead of the config's stage: the seed, the
global and per-process batch sizes, the best-checkpoint rule, every learning rate with the
config field it comes from, and whether the loop waits for each step (`kernels.platform`).
`sptlib.train.setup.build_stage` builds from it (so training, `sptlib.protocol.aot`, the benchmark
and length evaluation all do), `python -m sptlib.main --print_config` prints it for every stage,
and each stage saves it beside its checkpoints (`resolved.json`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import jax
import ml_collections
import numpy as np

from sptlib import data as data_lib
from sptlib import models
from sptlib.errors import ConfigError
from sptlib.kernels import platform as platform_lib
from sptlib.train import sharding

RESOLVED_FILE = "resolved.json"


@dataclasses.dataclass(frozen=True)
class ResolvedStage:
    """One stage as it will run (see the module docstring): what training, `sptlib.protocol.aot`,
    the benchmark and length evaluation read instead of the config's stage. `mesh` is the
    `jax.sharding.Mesh`; `to_json()` is what is printed and saved."""

    name: str
    platform: str                 # cpu | gpu | tpu
    num_devices: int
    mesh: Any                     # jax.sharding.Mesh over the stage's devices
    rules: tuple                  # logical axis rules
    info: dict                    # the task's info
    model_cfg: Any                # config.model resolved (vocab, lengths, dtype, causal)
    batch: dict                   # train batch: name -> (global shape, dtype)
    eval_batch: dict
    attention_kernel: str         # cpu | cudnn | pallas | splash | reference | "" (no attention)
    objective: str
    num_steps: int
    seed: int                     # config.seed + stage.seed_offset: init, dropout, data order
    batch_size: int               # global train batch
    eval_batch_size: int          # global eval batch (stage.eval_batch_size, 0 = batch_size)
    local_batch_size: int         # this process's shares
    local_eval_batch_size: int
    best_metric: str              # the best-checkpoint rule: validation metric and its sense
    best_mode: str                # max | min
    learning_rates: tuple         # ((group, peak lr, config field it comes from), ...)
    sync_each_step: bool          # kernels.platform.sync_each_step

    def to_json(self) -> dict:
        m = self.model_cfg
        return {
            "stage": self.name, "platform": self.platform, "devices": self.num_devices,
            "mesh": {k: int(v) for k, v in self.mesh.shape.items()},
            "rules": [[name, axes] for name, axes in self.rules],
            "batch": {k: [list(s), d] for k, (s, d) in self.batch.items()},
            "eval_batch": {k: [list(s), d] for k, (s, d) in self.eval_batch.items()},
            "model": {"mixer": m.mixer, "pattern": m.pattern, "d_model": m.d_model,
                      "n_layers": m.n_layers, "dtype": m.dtype, "remat": bool(m.remat),
                      "remat_policy": m.remat_policy,
                      "attention": dict(m.attention.to_dict(), kernel_chosen=self.attention_kernel)
                      if self.attention_kernel else None},
            "objective": self.objective, "num_steps": self.num_steps, "task": self.info,
            "seed": self.seed, "batch_size": self.batch_size,
            "eval_batch_size": self.eval_batch_size,
            "per_process": {"batch_size": self.local_batch_size,
                            "eval_batch_size": self.local_eval_batch_size},
            "best": {"metric": self.best_metric, "mode": self.best_mode},
            "learning_rates": {g: {"peak": lr, "from": origin}
                               for g, lr, origin in self.learning_rates},
            "sync_each_step": self.sync_each_step,
            "reproducibility": reproducibility(),
        }


def reproducibility() -> dict:
    """What a bitwise-identical rerun must share besides the config and its seed (on CPU a run
    is bitwise reproducible for these, whatever the machine's load: docs/training.md): the
    platform, the JAX/XLA build, the device and process counts, the CPUs the process may use
    (XLA:CPU's thread pools follow them) and the flags that change XLA's code."""
    import jaxlib
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count()
    return {"platform": jax.default_backend(), "jax": jax.__version__,
            "jaxlib": getattr(jaxlib, "__version__", "?"), "devices": jax.device_count(),
            "processes": jax.process_count(), "cpus_visible": cpus,
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "native_cpu_kernels": os.environ.get("SPTLIB_NATIVE", "1") != "0"}


def peak_learning_rates(cfg) -> dict:
    """`{group: (peak lr, origin)}` for the groups "default", "ssm" and "ssm_dt": `ssm_lr` None
    follows `lr`, `ssm_dt_lr` None follows the SSM group's; `origin` names the config field the
    value comes from (e.g. "optim.lr" for an `ssm_dt_lr` that follows `lr`)."""
    default = (cfg.lr, "optim.lr")
    ssm = default if cfg.ssm_lr is None else (cfg.ssm_lr, "optim.ssm_lr")
    dt = ssm if cfg.ssm_dt_lr is None else (cfg.ssm_dt_lr, "optim.ssm_dt_lr")
    return {"default": default, "ssm": ssm, "ssm_dt": dt}


def _uses_attention(m):
    if m.get("layers"):  # a free hybrid stack: its layer list says
        return any(name == "attention" for name, _ in models.layer_specs(m))
    return m.mixer == "attention" or m.pattern in ("gss_hybrid", "wide_attention")


def batch_shapes(info, batch_size: int, length: int = 0, sharding=None) -> dict:
    """`ShapeDtypeStruct`s of a batch of the task (docs/architecture.md, "Batches").

    inputs int32 `[batch, length]` (tokens) or float32 `[batch, length, d_input]` plus raw int32
    (continuous); mask bool `[batch, length]`; label int32 `[batch]` (per-position tasks:
    targets int32 `[batch, length]` instead); example_mask bool `[batch]`; paired tasks add
    inputs2 / mask2. `length` defaults to `info["max_length"]`.
    """
    n, length = int(batch_size), int(length or info["max_length"])

    def spec(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    if info["input_type"] == "tokens":
        inputs = {"inputs": spec((n, length), np.int32)}
    else:
        d = int(info["d_input"])
        inputs = {"inputs": spec((n, length, d), np.float32),
                  "raw": spec((n, length, d), np.int32)}
    labels = ({"targets": spec((n, length), np.int32)} if info.get("per_position")
              else {"label": spec((n,), np.int32)})
    out = dict(inputs, mask=spec((n, length), np.bool_), **labels,
               example_mask=spec((n,), np.bool_))
    if info.get("pair"):
        out["inputs2"] = inputs["inputs"]
        out["mask2"] = out["mask"]
    return out


def _shapes(info, batch_size):
    return {k: (tuple(int(d) for d in v.shape), np.dtype(v.dtype).name)
            for k, v in batch_shapes(info, batch_size).items()}


def _per_process(stage_name, field, size):
    pc = jax.process_count()
    if size % pc:
        raise ConfigError(f"config.stages.{stage_name}.{field}={size}: not divisible by the {pc} "
                          f"processes; use a multiple of {pc}")
    return size // pc


def _check_batch_split(stage: ResolvedStage) -> None:
    """Each global batch divides over the devices its `batch` rule splits it over."""
    axes = dict(stage.rules).get("batch")
    axes = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
    n = math.prod(int(stage.mesh.shape[a]) for a in axes)
    for field in ("batch_size", "eval_batch_size"):
        value = getattr(stage, field)
        if value % n:
            zero = " (0 = batch_size)" if field == "eval_batch_size" else ""
            raise ConfigError(
                f"config.stages.{stage.name}.{field}={value}: the batch is split over {n} devices "
                f"(mesh axes {', '.join(axes)} of config.mesh, {stage.num_devices} devices in "
                f"all); use a multiple of {n}{zero}")


def _shared(config, devices, info):
    """(devices, mesh, logical rules, model config resolved for the devices' platform): the
    same for every stage of `config`."""
    devices = list(devices) if devices is not None else jax.devices()
    return (devices, sharding.create_mesh(config.mesh, devices),
            tuple(sharding.normalize_rules(config.logical_axis_rules)),
            models.resolve_model_config(config.model, info, devices[0].platform))


def resolve_stage(config, stage_name: str, *, devices=None, info=None) -> ResolvedStage:
    """The resolved stage `stage_name` of `config` on `devices` (default `jax.devices()`; may be
    a TPU topology's compile-only devices). `info`: the task's info (default: from the data)."""
    if info is None:
        info = data_lib.get_task(config.data).info
    return _resolve(config, stage_name, info, *_shared(config, devices, info))


def _resolve(config, stage_name, info, devices, mesh, rules, model_cfg) -> ResolvedStage:
    stage = config.stages[stage_name]
    where = devices[0].platform
    model_cfg = ml_collections.ConfigDict(model_cfg.to_dict())  # this stage's own copy
    if stage.get("bypass_mixers", False):
        model_cfg.bypass_mixers = True  # mlpinit's stage 1: every sequence mixer bypassed
    if stage.get("causal") is not None:
        # The mask is a stage setting: causal SPT, then a bidirectional finetune (the release).
        model_cfg.causal = bool(stage.causal)
    kernel = ""
    if _uses_attention(model_cfg):
        a = model_cfg.attention
        kernel = platform_lib.attention_kernel(
            where, algorithm=a.impl, dtype=model_cfg.dtype,
            head_dim=a.head_dim or model_cfg.d_model // a.n_heads, causal=bool(model_cfg.causal),
            window=int(a.window), kernel=a.kernel)
    batch_size = int(stage.batch_size)
    eval_batch_size = int(stage.eval_batch_size or stage.batch_size)
    return ResolvedStage(
        name=stage_name, platform=where, num_devices=len(devices), mesh=mesh, rules=rules,
        info=dict(info), model_cfg=model_cfg, batch=_shapes(info, batch_size),
        eval_batch=_shapes(info, eval_batch_size), attention_kernel=kernel,
        objective=str(stage.objective.kind), num_steps=int(stage.num_steps),
        seed=int(config.seed) + int(stage.seed_offset), batch_size=batch_size,
        eval_batch_size=eval_batch_size,
        local_batch_size=_per_process(stage_name, "batch_size", batch_size),
        local_eval_batch_size=_per_process(stage_name, "eval_batch_size", eval_batch_size),
        best_metric=str(stage.best_metric), best_mode=str(stage.best_mode),
        learning_rates=tuple((g, lr, origin) for g, (lr, origin)
                             in peak_learning_rates(stage.optim).items()),
        sync_each_step=platform_lib.sync_each_step(where, len(devices)))


def resolve_run(config, *, devices=None, info=None) -> list[ResolvedStage]:
    """`resolve_stage` for every stage of `config.stage_order`, on one mesh; every batch must
    divide over the devices and processes it is split over (a `ConfigError` naming the field
    otherwise). `info`: the task's info (default: from the config alone,
    `sptlib.data.task_info`)."""
    if info is None:
        info = data_lib.task_info(config.data)
    try:
        shared = _shared(config, devices, info)
    except ValueError as e:  # mesh sizes vs the devices present
        raise ConfigError(f"config.mesh: {e}") from None
    stages = [_resolve(config, name, info, *shared) for name in config.stage_order]
    for stage in stages:
        _check_batch_split(stage)
    return stages
