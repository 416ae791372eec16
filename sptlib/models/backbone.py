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
import jax.numpy as jnp

from sptlib.layers import get_mixer
from sptlib.layers.blocks import Norm, ResidualBlock

ACTIVATION_AXES = ("batch", "length", "embed")


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
    """One backbone layer: a `ResidualBlock` around `mixer`, or a GSS block when `mixer == 'gss'`."""
    mixer: str
    mixer_options: Tuple[Tuple[str, Any], ...]
    d_model: int
    causal: bool = False
    dropout: float = 0.0
    norm: str = "layer"
    prenorm: bool = True
    ffn_mult: float = 2
    dtype: Any = jnp.float32
    init_scheme: str = "linen"
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
            block = get_mixer("gss")(d_model=self.d_model, causal=self.causal,
                                     dropout=self.dropout, **dict(self.mixer_options), name="block")
        else:
            block = ResidualBlock(self.mixer, self.mixer_options, self.d_model, self.causal,
                                  self.dropout, self.norm, self.prenorm, self.ffn_mult, self.dtype,
                                  self.init_scheme, name="block")
        if not self.bypass_mixer:
            return _constrain(block(x, mask=mask, deterministic=deterministic))
        with nn.intercept_methods(_zero_mixer):
            return _constrain(block(x, mask=mask, deterministic=deterministic))


class _ScanLayer(nn.Module):
    """`Layer` in scan form: `(x, mask) -> (x, None)`; `deterministic` is static."""
    layer_kwargs: Tuple[Tuple[str, Any], ...]
    deterministic: bool = True

    @nn.compact
    def __call__(self, x, mask):
        return Layer(**dict(self.layer_kwargs), name="layer")(x, mask, self.deterministic), None


class Backbone(nn.Module):
    """Stack of layers: `y = backbone(x[batch, length, d_model], mask[batch, length] | None, *,
    deterministic) -> [batch, length, d_model]`; padding rows of y are zero.

    Attributes:
      layers: `((mixer name, ((option, value), ...)), ...)`, one entry per layer.
      d_model, causal, dropout, norm, prenorm, ffn_mult, dtype: shared by all layers.
      scan_layers: run a stack of identical layers with `nn.scan` (parameters get a leading
        `layers` axis, logical name ``layers``).
      remat: rematerialise each layer in the backward pass.
      init_scheme: linen | torch initialisation of the FFNs (`sptlib.layers.inits`).
      bypass_mixers: every mixer outputs zeros (a per-token network; see the module docstring).
    """
    layers: Tuple[Tuple[str, Tuple[Tuple[str, Any], ...]], ...]
    d_model: int
    causal: bool = False
    dropout: float = 0.0
    norm: str = "layer"
    prenorm: bool = True
    ffn_mult: float = 2
    scan_layers: bool = True
    remat: bool = False
    dtype: Any = jnp.float32
    init_scheme: str = "linen"
    bypass_mixers: bool = False

    def _layer_kwargs(self, spec):
        mixer, options = spec
        return dict(mixer=mixer, mixer_options=options, d_model=self.d_model, causal=self.causal,
                    dropout=self.dropout, norm=self.norm, prenorm=self.prenorm,
                    ffn_mult=self.ffn_mult, dtype=self.dtype, init_scheme=self.init_scheme,
                    bypass_mixer=self.bypass_mixers)

    @nn.compact
    def __call__(self, x, mask=None, *, deterministic=True):
        x = _constrain(x)
        identical = len(set(self.layers)) == 1
        if self.scan_layers and identical and len(self.layers) > 1:
            cls = nn.remat(_ScanLayer, prevent_cse=False) if self.remat else _ScanLayer
            scanned = nn.scan(cls, variable_axes={"params": 0, "batch_stats": 0},
                              split_rngs={"params": True, "dropout": True},
                              in_axes=nn.broadcast, length=len(self.layers),
                              metadata_params={nn.PARTITION_NAME: "layers"})
            kwargs = tuple(sorted(self._layer_kwargs(self.layers[0]).items()))
            x, _ = scanned(kwargs, deterministic, name="layers")(x, mask)
        else:
            cls = nn.remat(Layer, static_argnums=(3,)) if self.remat else Layer
            for i, spec in enumerate(self.layers):
                x = cls(**self._layer_kwargs(spec), name=f"layer_{i}")(x, mask, deterministic)
        if self.prenorm:
            x = Norm(self.norm, dtype=self.dtype, name="final_norm")(
                x, mask=mask, deterministic=deterministic)
        if mask is not None:
            x = jnp.where(mask[..., None], x, 0)
        return _constrain(x)
