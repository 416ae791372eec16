"""Backbone: a stack of residual blocks, `[batch, length, d_model] -> same`.

A backbone is described by its layer list — one `(mixer name, options)` per layer — so every pattern
of `config.model.pattern` is a list (see `sptlib.models.build.layer_specs`):

- uniform: `n_layers` × the same mixer;
- gss_hybrid: GSS blocks with an attention (Transformer) block at layers 1, 5, 9, … (zero-based);
- wide_attention: one attention block with `n_layers · n_heads` heads.

A mixer named ``gss`` is `sptlib.layers.gss.GSSBlock`, a whole residual block with its own shortcut
and norm, used as is; every other mixer goes into a `sptlib.layers.blocks.ResidualBlock`.
With `bypass_mixers` every residual block's sequence mixer is replaced by a zero-output residual
(the mixer is never called, so it has no parameters): a per-token network whose parameter tree is
the full model's minus the `.../mixer/...` subtrees — stage 1 of the `mlpinit` regime.

A stack of identical layers is run with `nn.scan` (parameters stacked on a leading `layers` axis),
optionally rematerialised per layer — on CPU this cut a Transformer step at L=1024 from 8.4 to 2.3 GB
(rematerialising an unrolled Python loop of layers saved nothing there); otherwise layers are named `layer_0`, `layer_1`, ….
"""

from typing import Any, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from sptlib.layers import get_mixer
from sptlib.layers.blocks import BlockConfig, Norm, ResidualBlock

ACTIVATION_AXES = ("batch", "length", "embed")
# What a rematerialised layer keeps for its backward pass (`model.remat_policy`): full = only
# the layer's input (everything recomputed); dots = also the outputs of matmuls without batch
# dimensions (the dense projections: cheap to keep, expensive to recompute), so the backward
# recomputes only elementwise ops, norms and attention.
REMAT_POLICIES = {"full": None,
                  "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


def _constrain(x):
    return nn.with_logical_constraint(x, ACTIVATION_AXES)


def _zero_mixer(next_fun, args, kwargs, context):
    """Method interceptor: a residual block's submodule named `mixer` neither sets up (setup-style
    mixers such as attention create their parameters there) nor runs: its call returns zeros
    `[batch, length, d_model]`, so it has no parameters. Every other module runs as is."""
    if context.module.name == "mixer" and context.method_name in ("setup", "__call__"):
        return jnp.zeros_like(args[0]) if context.method_name == "__call__" else None
    return next_fun(*args, **kwargs)


class Layer(nn.Module):
    """One backbone layer: a `ResidualBlock` around `mixer`, or a GSS block when `mixer == 'gss'`.

    `y = layer(x[batch, length, d_model], mask[batch, length] | None, deterministic)`.
    """
    mixer: str
    mixer_options: Tuple[Tuple[str, Any], ...]
    config: BlockConfig
    bypass_mixer: bool = False

    @nn.compact
    def __call__(self, x, mask=None, deterministic=True):
        if mask is not None:
            x = jnp.where(mask[..., None], x, 0)  # padding content never enters a layer
        if self.mixer == "gss":
            if self.bypass_mixer:
                raise ValueError("bypass_mixers: a GSS block's SSM sits inside its gated block, "
                                 "not in a residual mixer branch; mlpinit supports attention and "
                                 "residual SSM mixers (s4, s4d, dss, dlr, s5)")
            # GSS is a whole residual block (own shortcut and norm): not wrapped again.
            c = self.config
            block = get_mixer("gss")(d_model=c.d_model, causal=c.causal, dropout=c.dropout,
                                     **dict(self.mixer_options), name="block")
        else:
            block = ResidualBlock(self.mixer, self.mixer_options, self.config, name="block")
        if not self.bypass_mixer:
            return _constrain(block(x, mask=mask, deterministic=deterministic))
        with nn.intercept_methods(_zero_mixer):
            return _constrain(block(x, mask=mask, deterministic=deterministic))


class _ScanLayer(nn.Module):
    """`Layer` in scan form: `(x, mask) -> (x, None)`; `deterministic` is static."""
    mixer: str
    mixer_options: Tuple[Tuple[str, Any], ...]
    config: BlockConfig
    bypass_mixer: bool
    deterministic: bool = True

    @nn.compact
    def __call__(self, x, mask):
        layer = Layer(self.mixer, self.mixer_options, self.config, self.bypass_mixer, name="layer")
        return layer(x, mask, self.deterministic), None


class Backbone(nn.Module):
    """Stack of layers: `y = backbone(x[batch, length, d_model], mask[batch, length] | None, *,
    deterministic) -> [batch, length, d_model]`; padding rows of y are zero.

    Attributes:
      layers: `((mixer name, ((option, value), ...)), ...)`, one entry per layer.
      config: the block options shared by all layers (`sptlib.layers.blocks.BlockConfig`).
      scan_layers: run a stack of identical layers with `nn.scan` (parameters get a leading
        `layers` axis, logical name ``layers``).
      remat: rematerialise each layer in the backward pass.
      remat_policy: what a rematerialised layer saves (`REMAT_POLICIES`).
      bypass_mixers: every mixer outputs zeros (a per-token network; see the module docstring).
      scan_unroll: layers per iteration of the scanned loop (`lax.scan`'s `unroll`; the
        parameters, their layout and the random streams do not change with it). On XLA:CPU a
        fully unrolled 2-layer Transformer step is ~1.1x faster: the loop's stacked residual
        buffers are zero-filled every step and its loop-invariant mask broadcasts are hoisted
        and materialised at `[batch, heads, length, length]`.
    """
    layers: Tuple[Tuple[str, Tuple[Tuple[str, Any], ...]], ...]
    config: BlockConfig
    scan_layers: bool = True
    remat: bool = False
    bypass_mixers: bool = False
    scan_unroll: int = 1
    remat_policy: str = "full"

    @nn.compact
    def __call__(self, x, mask=None, *, deterministic=True):
        x = _constrain(x)
        if not isinstance(self.scan_unroll, int) or self.scan_unroll < 1:
            raise ValueError(f"model.scan_unroll must be an integer >= 1, got {self.scan_unroll!r}")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"model.remat_policy {self.remat_policy!r} not in "
                             f"{tuple(REMAT_POLICIES)}")
        policy = REMAT_POLICIES[self.remat_policy]
        identical = len(set(self.layers)) == 1
        if self.scan_layers and identical and len(self.layers) > 1:
            cls = (nn.remat(_ScanLayer, prevent_cse=False, policy=policy) if self.remat
                   else _ScanLayer)
            scanned = nn.scan(cls, variable_axes={"params": 0, "batch_stats": 0},
                              split_rngs={"params": True, "dropout": True},
                              in_axes=nn.broadcast, length=len(self.layers),
                              unroll=min(self.scan_unroll, len(self.layers)),
                              metadata_params={nn.PARTITION_NAME: "layers"})
            mixer, options = self.layers[0]
            x, _ = scanned(mixer, options, self.config, self.bypass_mixers, deterministic,
                           name="layers")(x, mask)
        else:
            cls = nn.remat(Layer, static_argnums=(3,), policy=policy) if self.remat else Layer
            for i, (mixer, options) in enumerate(self.layers):
                x = cls(mixer, options, self.config, self.bypass_mixers, name=f"layer_{i}")(
                    x, mask, deterministic)
        if self.config.prenorm:
            x = Norm(self.config.norm, dtype=self.config.dtype, name="final_norm")(
                x, mask=mask, deterministic=deterministic)
        if mask is not None:
            x = jnp.where(mask[..., None], x, 0)
        return _constrain(x)
