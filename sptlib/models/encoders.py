"""Input encoders: token ids or continuous features -> `[batch, length, d_model]`.

Both keep the input interface fixed between self-pretraining and finetuning so an SPT checkpoint's
encoder transfers unchanged: the token vocabulary keeps `<pad>`=0 and `<mask>`=1 (`sptlib.vocab`),
and the linear encoder of a model with `mask_channel` always takes `d_input + 1` features (the
objective appends the mask indicator, zeros when finetuning).
"""

import math
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from sptlib.kernels import linear
from sptlib.layers import initializers

POSITIONS = ("none", "sinusoidal", "learned")


def sinusoidal_positions(length, d_model):
    """Fixed sin/cos position table `[length, d_model]` (Vaswani et al.; sin and cos halves)."""
    half = d_model // 2
    freq = jnp.exp(-math.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / max(half, 1))
    angles = jnp.arange(length, dtype=jnp.float32)[:, None] * freq
    table = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
    return jnp.pad(table, [(0, 0), (0, d_model - 2 * half)])


class AddPositions(nn.Module):
    """Adds absolute positions to `x[batch, length, d_model]`: none | sinusoidal | learned."""
    kind: str = "none"
    max_length: int = 0

    @nn.compact
    def __call__(self, x):
        length, d_model = x.shape[-2:]
        if self.kind == "none":
            return x
        if self.kind == "sinusoidal":
            return x + sinusoidal_positions(length, d_model).astype(x.dtype)
        if self.kind == "learned":
            if length > self.max_length:
                raise ValueError(f"length {length} > max_length {self.max_length} of learned "
                                 "positions (set config.model.max_length)")
            table = self.param("positions", nn.with_logical_partitioning(
                nn.initializers.normal(0.02), ("length", "embed")), (self.max_length, d_model))
            return x + table[:length].astype(x.dtype)
        raise ValueError(f"positions {self.kind!r} not in {POSITIONS}")


class TokenEncoder(nn.Module):
    """Embedding of token ids `[batch, length]` (int) -> `[batch, length, d_model]`.

    `dtype` is the embedding's output dtype; sptlib models keep it float32 (the residual stream
    of mixed precision: a lookup has no matmul to speed up)."""
    vocab_size: int
    d_model: int
    positions: str = "none"
    max_length: int = 0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, inputs):
        if inputs.ndim != 2 or not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise ValueError(f"token encoder expects int ids [batch, length], got {inputs.dtype}"
                             f"{list(inputs.shape)}")
        embed = nn.Embed(self.vocab_size, self.d_model, dtype=self.dtype,
                         embedding_init=nn.with_logical_partitioning(
                             nn.initializers.normal(1.0), ("vocab", "embed")), name="embed")
        return AddPositions(self.positions, self.max_length, name="positions")(embed(inputs))


class LinearEncoder(nn.Module):
    """Linear map of continuous features `[batch, length, d_features]` -> `[batch, length, d_model]`.

    `d_features` is `d_input`, plus 1 when the model carries a mask-indicator channel.
    """
    d_features: int
    d_model: int
    positions: str = "none"
    max_length: int = 0
    dtype: Any = jnp.float32
    init_scheme: str = "linen"  # linen | torch (sptlib.layers.initializers)

    @nn.compact
    def __call__(self, inputs):
        if inputs.ndim != 3 or inputs.shape[-1] != self.d_features:
            raise ValueError(f"linear encoder expects [batch, length, {self.d_features}] "
                             f"(d_input + mask channel), got {list(inputs.shape)}")
        kernel_init, bias_init = initializers.dense(self.init_scheme, self.d_features)
        x = nn.Dense(self.d_model, dtype=self.dtype,
                     kernel_init=nn.with_logical_partitioning(kernel_init, (None, "embed")),
                     bias_init=nn.with_logical_partitioning(bias_init, ("embed",)),
                     name="dense", dot_general=linear.dot_general)(inputs.astype(self.dtype))
        # The residual stream stays float32 whatever the compute dtype (mixed precision).
        x = x.astype(jnp.float32)
        return AddPositions(self.positions, self.max_length, name="positions")(x)
