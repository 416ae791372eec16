"""The resolved run: an experiment config turned, once, into what each stage runs on the devices.

`resolve_stage(config, stage_name, devices=..., info=...)` fixes everything the config leaves
to the machine: the platform, the mesh sizes on the devices present, the logical axis rules, the
global batch shapes of the train and eval steps, the model config with its data-dependent fields
and `dtype="auto"` filled in, and the attention kernel each platform's dispatcher will lower.
`sptlib.train.setup.build_stage` builds from it (so training, `sptlib.slices.aot`, the benchmark and
length evaluation all do), `python -m sptlib.main --print_config` prints it for every stage, and
each stage saves it beside its checkpoints (`resolved.json`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from sptlib import data as data_lib
from sptlib import models
from sptlib.kernels import platform as platform_lib
from sptlib.train import sharding

RESOLVED_FILE = "resolved.json"


@dataclasses.dataclass(frozen=True)
class ResolvedStage:
    """One stage as it will run (see the module docstring). `mesh` is the `jax.sharding.Mesh`;
    `to_json()` is what is printed and saved."""

    name: str
    platform: str                 # cpu | gpu | tpu
    num_devices: int
    mesh: Any                     # jax.sharding.Mesh over the stage's devices
    rules: tuple                  # logical axis rules
    info: dict                    # the task's info
    model_cfg: Any                # config.model resolved (vocab, lengths, dtype)
    batch: dict                   # train batch: name -> (global shape, dtype)
    eval_batch: dict
    attention_kernel: str         # cpu | cudnn | pallas | splash | reference | "" (no attention)
    objective: str
    num_steps: int

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
                      "remat_policy": m.get("remat_policy", "full"),
                      "attention": dict(m.attention.to_dict(), kernel_chosen=self.attention_kernel)
                      if self.attention_kernel else None},
            "objective": self.objective, "num_steps": self.num_steps, "task": self.info,
        }


def _uses_attention(m):
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


def resolve_stage(config, stage_name: str, *, devices=None, info=None) -> ResolvedStage:
    """The resolved stage `stage_name` of `config` on `devices` (default `jax.devices()`; may be
    a TPU topology's compile-only devices). `info`: the task's info (default: from the data)."""
    stage = config.stages[stage_name]
    devices = list(devices) if devices is not None else jax.devices()
    where = devices[0].platform
    if info is None:
        info = data_lib.get_task(config.data).info
    model_cfg = models.resolve_model_config(config.model, info, where)
    if stage.get("bypass_mixers", False):
        model_cfg.bypass_mixers = True  # mlpinit's stage 1: every sequence mixer bypassed
    if stage.get("causal") is not None:
        # The mask is a stage setting: causal SPT, then a bidirectional finetune (the release).
        model_cfg.causal = bool(stage.causal)
    mesh = sharding.create_mesh(config.mesh, devices)
    rules = tuple(sharding.normalize_rules(config.logical_axis_rules))
    kernel = ""
    if _uses_attention(model_cfg):
        a = model_cfg.attention
        kernel = platform_lib.attention_kernel(
            where, algorithm=a.impl, dtype=model_cfg.dtype,
            head_dim=a.head_dim or model_cfg.d_model // a.n_heads, causal=bool(model_cfg.causal),
            window=int(a.window), kernel=a.get("kernel", "auto"))
    return ResolvedStage(
        name=stage_name, platform=where, num_devices=len(devices), mesh=mesh, rules=rules,
        info=dict(info), model_cfg=model_cfg, batch=_shapes(info, int(stage.batch_size)),
        eval_batch=_shapes(info, int(stage.eval_batch_size or stage.batch_size)),
        attention_kernel=kernel, objective=str(stage.objective.kind),
        num_steps=int(stage.num_steps))


def resolve_run(config, *, devices=None, info=None) -> list[ResolvedStage]:
    """`resolve_stage` for every stage of `config.stage_order`."""
    if info is None:
        info = data_lib.task_info(config.data)
    return [resolve_stage(config, name, devices=devices, info=info)
            for name in config.stage_order]
