"""AdamW with warmup + constant/cosine schedules and a separate group for SSM parameters.

The SSM parameters (A, B/C where structured, log Δ) take their own learning rate and no weight
decay (S4 / SPT practice). The SSM layers create them in the "ssm" group, the step sizes log Δ in
its own "ssm_dt" group (`sptlib.layers.param_groups`: a box type set by the module, not a leaf
name), and `param_labels(params)` reads the `"ssm_dt"` / `"ssm"` / `"default"` labels off it.
log Δ takes `ssm_dt_lr` (None = `ssm_lr`; the paper code's S4 configs give it the global lr).
Everything else gets plain AdamW.
Gradient clipping (by global norm over *all* parameters) happens before the split.
"""

import jax
import ml_collections
import optax

from sptlib.layers import param_groups
from sptlib.train import resolve


def optim_config():
    """Returns the default `config.stages.<name>.optim`."""
    c = ml_collections.ConfigDict()
    # Peak learning rate of AdamW for all non-SSM parameters.
    c.lr = 1e-3
    # Peak learning rate of the SSM parameters (None = same as lr).
    c.ssm_lr = 1e-3
    # Peak learning rate of the SSM step sizes log dt (None = ssm_lr). No weight decay either.
    c.ssm_dt_lr = ml_collections.config_dict.placeholder(float)
    # Decoupled weight decay (multiplied by the learning rate, as torch/optax AdamW).
    c.weight_decay = 0.05
    # Weight decay of the SSM parameters.
    c.ssm_weight_decay = 0.0
    # Exclude 1-D parameters (biases, norm scales) from weight decay.
    c.no_decay_1d = False
    # Linear warmup from 0 to the peak over this many steps.
    c.warmup_steps = 0
    # After warmup: constant | cosine (to min_lr_ratio * peak at the last step).
    c.schedule = "cosine"
    c.min_lr_ratio = 0.0
    # Cosine horizon in steps, warmup included (the paper code's `num_training_steps`); 0 = the
    # stage's number of steps, so the lr reaches its floor at the last step.
    c.decay_steps = 0
    # Adam moments.
    c.b1 = 0.9
    c.b2 = 0.999
    c.eps = 1e-8
    # Clip gradients to this global L2 norm (0 = no clipping).
    c.grad_clip = 0.0
    return c


def make_schedule(peak, cfg, total_steps):
    """Learning rate as a function of the step: linear warmup, then constant or cosine.

    Args:
      peak: peak learning rate.
      cfg: optimizer config (`warmup_steps`, `schedule`, `min_lr_ratio`).
      total_steps: number of optimizer steps of the stage (cosine reaches its floor there,
        unless `cfg.decay_steps` sets another horizon).

    Returns:
      An `optax.Schedule`.
    """
    warmup = int(cfg.warmup_steps)
    if cfg.schedule == "constant":
        after = optax.constant_schedule(peak)
    elif cfg.schedule == "cosine":
        horizon = int(cfg.decay_steps or 0) or int(total_steps)
        decay_steps = max(horizon - warmup, 1)
        after = optax.cosine_decay_schedule(peak, decay_steps, alpha=float(cfg.min_lr_ratio))
    else:
        raise ValueError(f"Unknown schedule {cfg.schedule!r}; expected constant | cosine")
    if warmup <= 0:
        return after
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, warmup), after], boundaries=[warmup])


def learning_rates(cfg, total_steps, peaks=None):
    """Schedules by group: `{"default": ..., "ssm": ..., "ssm_dt": ...}`, from `peaks`
    (`{group: peak lr}`; default: what `sptlib.train.resolve.peak_learning_rates` decides for
    `cfg`, as a resolved stage carries them)."""
    if peaks is None:
        peaks = {group: peak for group, (peak, _) in resolve.peak_learning_rates(cfg).items()}
    return {group: make_schedule(peak, cfg, total_steps) for group, peak in peaks.items()}


def param_labels(params):
    """`"ssm_dt"` / `"ssm"` / `"default"` label per parameter, from the module that created it.

    `params`: boxed (`model.init` before `nn.unbox`) or abstract from
    `sptlib.train.steps.state_logical_specs`; see `sptlib.layers.param_groups`.
    """
    return param_groups.param_labels(params)


def make_optimizer(cfg, params, total_steps, peaks=None):
    """Builds the optimizer.

    Args:
      cfg: optimizer config (see `optim_config`).
      params: the boxed parameter pytree, or its abstract shapes from
        `sptlib.train.steps.state_logical_specs` (only structure and groups are used).
      total_steps: steps of the stage (for the cosine schedule).
      peaks: `{group: peak lr}` (a resolved stage's `learning_rates`); default: from `cfg`.

    Returns:
      An `optax.GradientTransformation`: optional global-norm clipping, then
      `optax.multi_transform` of AdamW for the `"default"`, `"ssm"` and `"ssm_dt"` groups.
    """
    lrs = learning_rates(cfg, total_steps, peaks)
    labels = param_labels(params)

    def decay_mask(p):
        if not cfg.no_decay_1d:
            return jax.tree.map(lambda _: True, p)
        return jax.tree.map(lambda x: len(getattr(x, "shape", ())) > 1, p)

    def adamw(lr, wd):
        return optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=wd,
                           mask=decay_mask)

    groups = {"default": adamw(lrs["default"], cfg.weight_decay),
              "ssm": adamw(lrs["ssm"], cfg.ssm_weight_decay),
              "ssm_dt": adamw(lrs["ssm_dt"], cfg.ssm_weight_decay)}
    tx = optax.multi_transform(groups, labels)
    if cfg.grad_clip and cfg.grad_clip > 0:
        tx = optax.chain(optax.clip_by_global_norm(cfg.grad_clip), tx)
    return tx
