"""sptlib's stable public API for other JAX code (docs/api.md): import from here.

Names here keep their signatures across minor versions; anything imported from deeper modules
may move. Shapes: `[batch, length, features]` for mixers and backbones. The names by area::

  Mixers       MIXERS, get_mixer(name) -> Linen class; every mixer is
               cls(d_model=, causal=, dropout=, ...)(x, *, mask, deterministic) -> x's shape;
               check_mixer(cls, d_model=, causal=) runs that contract on your own class.
  Parameters   ssm_param(init, names, group="ssm"): mark a parameter of your own module for the
               SSM optimiser group (own learning rate, no weight decay; "ssm_dt": the step-size
               group); param_labels(params) reads the groups.
  Kernels      sptlib.kernels (pure jnp: SSM kernels, FFT convolution, attention).
  Backbones    model_config(), build_backbone(model_cfg) -> Backbone (x[B, L, D], mask) ->
               [B, L, D]; build_model(model_cfg, head_cfg): encoder -> backbone -> head.
  Objectives   objective_config(kind), make_objective(cfg, info, model_cfg).
  Train steps  make_optimizer, init_train_state, make_train_step, make_eval_step.
  Checkpoints  load_backbone(path) -> (params of the backbone, the run's resolved model config):
               the backbone of an sptlib run (e.g. an SPT pretrain stage) for your own model.
"""

from __future__ import annotations

import json

import ml_collections

from sptlib.layers import MIXERS, get_mixer
from sptlib.errors import ConfigError
from sptlib.layers.contract import ContractError, check_mixer as _check_mixer
from sptlib.layers.param_groups import param_labels, ssm_group as ssm_param
from sptlib.models.build import block_config, build_model, layer_specs
from sptlib.models.backbone import Backbone
from sptlib.models.config import model_config
from sptlib.objectives import make_objective, objective_config
from sptlib.train.optim import make_optimizer
from sptlib.train.steps import init_train_state, make_eval_step, make_train_step

__all__ = ["MIXERS", "get_mixer", "check_mixer", "ssm_param", "param_labels", "model_config",
           "build_backbone", "build_model", "objective_config", "make_objective",
           "make_optimizer", "init_train_state", "make_train_step", "make_eval_step",
           "load_backbone"]


def check_mixer(cls, *, d_model: int = 16, causal: bool = False, options=()) -> None:
    """Raises `sptlib.errors.ConfigError` naming the broken rule if `cls` breaks the mixer
    contract (shape, mask/deterministic arguments, `causal` attribute, no future leak) or a
    conformance rule (padding invariance, finite gradients and a declared float64 reference's,
    step = parallel, declared state size, bfloat16 finite at length 2048; docs/api.md)."""
    try:
        _check_mixer(cls, getattr(cls, "__name__", str(cls)), int(d_model), bool(causal),
                     tuple(sorted(dict(options).items())))
    except ContractError as e:
        raise ConfigError(str(e)) from None


def build_backbone(model_cfg) -> Backbone:
    """The residual stack of `model_cfg` (`config.model`, with `vocab_size`/`max_length` filled
    or not: the backbone needs neither): `backbone(x[B, L, d_model], mask[B, L] | None, *,
    deterministic) -> [B, L, d_model]`. Its parameters are an sptlib model's `backbone`
    collection, so `load_backbone`'s output fits it."""
    c = model_cfg if isinstance(model_cfg, ml_collections.ConfigDict) else \
        ml_collections.ConfigDict(model_cfg)
    return Backbone(layer_specs(c), block_config(c), c.get("scan_layers", True),
                    c.get("remat", False), False, c.get("scan_unroll", 1),
                    c.get("remat_policy", "full"))


def load_backbone(path, which: str = "best"):
    """`(params, model_cfg)` of the backbone in an sptlib run's checkpoint.

    Args:
      path: a stage folder (`<workdir>/pretrain`), its `checkpoints/` folder, or one step folder.
      which: best (the highest validation score) | latest.

    Returns:
      params: the `backbone` parameter tree as NumPy arrays (`{"params": params}` is what
        `build_backbone(model_cfg).apply` takes); model_cfg: the stage's `config.model` (a
        ConfigDict, from the stage's `config.json`, with the stage's `causal`).
    """
    import numpy as np
    import orbax.checkpoint as ocp
    from etils import epath
    from sptlib.train import transfer  # deferred: checkpoints only (orbax)
    step_dir = transfer.resolve_init_checkpoint(str(path), None, which)
    with ocp.PyTreeCheckpointer() as ckptr:
        meta = ckptr.metadata(step_dir / "state")
        tree = dict(getattr(getattr(meta, "item_metadata", meta), "tree", meta))
        wanted = {"params": {"backbone": _skeleton(tree["params"]["backbone"])}}
        restored = ckptr.restore(step_dir / "state", args=ocp.args.PyTreeRestore(
            item=wanted, restore_args={"params": {"backbone": _numpy_restore_args(
                tree["params"]["backbone"])}}, partial_restore=True))
    params = _to_numpy(restored["params"]["backbone"], np)
    stage_dir = epath.Path(step_dir).parent.parent
    from sptlib.train.results import read_text_no_link  # a planted link is refused, not read
    config = json.loads(read_text_no_link(stage_dir / "config.json"))
    model_cfg = ml_collections.ConfigDict(config["model"])
    stage = config.get("stages", {}).get(stage_dir.name, {})
    if stage.get("causal") is not None:  # a stage's mask overrides the model's (causal SPT)
        model_cfg.causal = bool(stage["causal"])
    return params, model_cfg


def _skeleton(tree):
    if isinstance(tree, dict):
        return {k: _skeleton(v) for k, v in tree.items()}
    return 0


def _numpy_restore_args(tree):
    import numpy as np
    import orbax.checkpoint as ocp
    if isinstance(tree, dict):
        return {k: _numpy_restore_args(v) for k, v in tree.items()}
    return ocp.RestoreArgs(restore_type=np.ndarray)


def _to_numpy(tree, np):
    if isinstance(tree, dict):
        return {k: _to_numpy(v, np) for k, v in tree.items()}
    return np.asarray(tree)
