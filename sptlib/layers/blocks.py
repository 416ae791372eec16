"""Norms, feed-forward and residual blocks shared by every backbone.

A residual block wraps any sequence mixer of `sptlib.layers.MIXERS`:

    pre-norm:   x = x + Dropout(mixer(Norm(x)));  x = x + Dropout(FFN(Norm(x)))
    post-norm:  x = Norm(x + Dropout(mixer(x)));  x = Norm(x + Dropout(FFN(x)))

The FFN sub-block (GELU MLP, or SwiGLU with `ffn="swiglu"`) is dropped when `ffn_mult == 0`
(S4-style blocks); norms are layer, batch or RMS norm. Padding positions are
zeroed before the mixer, and batch norm computes its statistics over real positions only, so outputs
at real positions never depend on padding.
"""

import dataclasses
from typing import Any, Tuple

import flax.linen as nn
import jax.numpy as jnp

from sptlib.kernels import linear
from sptlib.layers import get_mixer
from sptlib.layers import initializers as inits
from sptlib.layers.initializers import boxed as _boxed

NORMS = ("layer", "batch", "rms")
FFNS = ("gelu", "swiglu")


class Norm(nn.Module):
    """Layer norm, RMS norm or (padding-aware) batch norm over the feature axis.

    `y = norm(x[batch, length, features], *, mask[batch, length] | None, deterministic)`.
    Batch norm normalises with statistics over batch and length (real positions only); in training
    (`deterministic=False`) it updates the `batch_stats` collection, which must then be mutable.
    """
    kind: str = "layer"
    epsilon: float = 1e-5
    momentum: float = 0.9
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, *, mask=None, deterministic=True):
        scale_init = _boxed(nn.initializers.ones, ("norm",))
        bias_init = _boxed(nn.initializers.zeros, ("norm",))
        if self.kind == "layer":
            return nn.LayerNorm(epsilon=self.epsilon, dtype=self.dtype, scale_init=scale_init,
                                bias_init=bias_init, name="layer_norm")(x)
        if self.kind == "rms":  # x / rms(x) * scale, no centring and no bias
            return nn.RMSNorm(epsilon=self.epsilon, dtype=self.dtype, scale_init=scale_init,
                              name="rms_norm")(x)
        if self.kind == "batch":
            bn_mask = None if mask is None else jnp.broadcast_to(mask[..., None], x.shape)
            return nn.BatchNorm(use_running_average=deterministic, momentum=self.momentum,
                                epsilon=self.epsilon, dtype=self.dtype, scale_init=scale_init,
                                bias_init=bias_init, name="batch_norm")(x, mask=bn_mask)
        raise ValueError(f"norm {self.kind!r} not in {NORMS}")


class FeedForward(nn.Module):
    """Position-wise MLP: `[..., d_model] -> Dense(mult·d_model) -> GELU -> Dropout -> Dense`."""
    d_model: int
    mult: float = 2
    dropout: float = 0.0
    dtype: Any = jnp.float32
    init_scheme: str = "linen"  # linen | torch (sptlib.layers.initializers)
    gelu_approximate: bool = True  # tanh GELU (False: exact erf GELU, as torch's nn.GELU)

    @nn.compact
    def __call__(self, x, *, deterministic=True):
        hidden = int(self.mult * self.d_model)
        k_in, b_in = inits.dense(self.init_scheme, x.shape[-1])
        k_out, b_out = inits.dense(self.init_scheme, hidden)
        h = nn.Dense(hidden, dtype=self.dtype, kernel_init=_boxed(k_in, ("embed", "mlp")),
                     bias_init=_boxed(b_in, ("mlp",)), name="wi",
                     dot_general=linear.dot_general)(x)
        h = nn.gelu(h, approximate=self.gelu_approximate)
        h = nn.Dropout(self.dropout)(h, deterministic=deterministic)
        return nn.Dense(self.d_model, dtype=self.dtype, kernel_init=_boxed(k_out, ("mlp", "embed")),
                        bias_init=_boxed(b_out, ("embed",)), name="wo",
                        dot_general=linear.dot_general)(h)


class SwiGLU(nn.Module):
    """Gated feed-forward (Shazeer 2020): `[..., d_model] -> SiLU(x W_gate) * (x W_up)
    [..., mult·d_model] -> Dropout -> W_down -> [..., d_model]`."""
    d_model: int
    mult: float = 2
    dropout: float = 0.0
    dtype: Any = jnp.float32
    init_scheme: str = "linen"

    @nn.compact
    def __call__(self, x, *, deterministic=True):
        hidden = int(self.mult * self.d_model)
        k_in, b_in = inits.dense(self.init_scheme, x.shape[-1])
        k_out, b_out = inits.dense(self.init_scheme, hidden)
        dense = lambda name: nn.Dense(hidden, dtype=self.dtype,
                                      kernel_init=_boxed(k_in, ("embed", "mlp")),
                                      bias_init=_boxed(b_in, ("mlp",)), name=name,
                                      dot_general=linear.dot_general)(x)
        h = nn.silu(dense("wi_gate")) * dense("wi_up")
        h = nn.Dropout(self.dropout)(h, deterministic=deterministic)
        return nn.Dense(self.d_model, dtype=self.dtype, kernel_init=_boxed(k_out, ("mlp", "embed")),
                        bias_init=_boxed(b_out, ("embed",)), name="wo",
                        dot_general=linear.dot_general)(h)


def mixer_class(name):
    """Mixer class by registry name (import deferred: SSM modules load only when used)."""
    return get_mixer(name)


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    """The options every block of a backbone shares (frozen, so it is a hashable module attribute).

    Built from `config.model` in one place, `sptlib.models.build.block_config`.

    Attributes:
      d_model: block width (features in and out).
      causal, dropout: passed to the mixer; dropout also on both residual branches.
      norm: ``layer`` | ``batch`` | ``rms``.  prenorm: pre-norm (True) or post-norm (False).
      ffn_mult: FFN width multiplier; 0 = no FFN sub-block.
      ffn: ``gelu`` (`FeedForward`) | ``swiglu`` (`SwiGLU`).
      dtype: compute dtype of the FFN and norms.
      init_scheme: linen | torch initialisation of the FFN (`sptlib.layers.initializers`); attention
        mixers take theirs from their options.
      gelu_approximate: tanh (True) or exact (False) GELU in the FFN.
      tie_dropout: residual dropout masks shared over the length axis (state-spaces/s4).
    """
    d_model: int = 64
    causal: bool = False
    dropout: float = 0.0
    norm: str = "layer"
    prenorm: bool = True
    ffn_mult: float = 2
    dtype: Any = jnp.float32
    init_scheme: str = "linen"
    gelu_approximate: bool = True
    tie_dropout: bool = False
    ffn: str = "gelu"


class ResidualBlock(nn.Module):
    """Sequence mixer + optional FFN, each in a pre- or post-norm residual branch.

    `y = block(x[batch, length, d_model], *, mask[batch, length] | None, deterministic)`.

    Attributes:
      mixer: mixer name in `sptlib.layers.MIXERS`.
      mixer_options: `((key, value), ...)` keyword arguments of the mixer constructor
        (a tuple so the module stays hashable).
      config: the shared block options (`BlockConfig`).
    """
    mixer: str
    mixer_options: Tuple[Tuple[str, Any], ...] = ()
    config: BlockConfig = BlockConfig()

    @nn.compact
    def __call__(self, x, *, mask=None, deterministic=True):
        c = self.config
        mixer = mixer_class(self.mixer)(d_model=c.d_model, causal=c.causal, dropout=c.dropout,
                                        **dict(self.mixer_options), name="mixer")
        branches = [("mixer", lambda h: mixer(h, mask=mask, deterministic=deterministic))]
        if c.ffn not in FFNS:
            raise ValueError(f"config.model.ffn={c.ffn!r} not in {FFNS}")
        if c.ffn_mult and c.ffn == "swiglu":
            ffn = SwiGLU(c.d_model, c.ffn_mult, c.dropout, c.dtype, c.init_scheme, name="ffn")
            branches.append(("ffn", lambda h: ffn(h, deterministic=deterministic)))
        elif c.ffn_mult:
            ffn = FeedForward(c.d_model, c.ffn_mult, c.dropout, c.dtype, c.init_scheme,
                              c.gelu_approximate, name="ffn")
            branches.append(("ffn", lambda h: ffn(h, deterministic=deterministic)))
        for name, branch in branches:
            norm = Norm(c.norm, dtype=c.dtype, name=f"{name}_norm")
            h = norm(x, mask=mask, deterministic=deterministic) if c.prenorm else x
            if mask is not None:
                h = jnp.where(mask[..., None], h, 0)  # padding never reaches a mixer
            h = nn.Dropout(c.dropout, broadcast_dims=(1,) if c.tie_dropout else ())(
                branch(h), deterministic=deterministic)
            x = x + h
            if not c.prenorm:
                # The residual stream keeps its dtype (float32 under mixed precision), also
                # through a post-norm in the compute dtype.
                x = norm(x, mask=mask, deterministic=deterministic).astype(x.dtype)
        return x
