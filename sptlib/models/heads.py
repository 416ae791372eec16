"""Task heads on backbone features `[batch, length, d_model]` (padding rows ignored).

- `ClassifyHead`: pooled (mean / max / last real position) -> logits `[batch, num_classes]`
  (optionally through a hidden layer: the bag-of-words control's MLP head);
- `TokenHead`: per-position logits `[batch, length, num_outputs]` (masked-token reconstruction,
  causal LM) or a regression value `[batch, length, d_input]`;
- `PixelHead`: 256-way logits per pixel channel `[batch, length, d_input, 256]`;
- `RetrievalHead`: dual encoder, MLP on `[u, v, u·v, u−v]` of the two pooled documents.
"""


import flax.linen as nn
import jax.numpy as jnp

from sptlib.layers import initializers

POOLING = ("mean", "max", "last")


def pool(x, mask=None, kind="mean"):
    """Pools `x[batch, length, features]` over real positions -> `[batch, features]`.

    mean: average of real rows; max: feature-wise max of real rows; last: the row at the last real
    position (the position of the last True in `mask`, so any padding layout works).
    """
    batch, length = x.shape[:2]
    if mask is None:
        mask = jnp.ones((batch, length), bool)
    m = mask[..., None]
    if kind == "mean":
        total = jnp.sum(jnp.where(m, x, 0), axis=1)
        return total / jnp.maximum(jnp.sum(m, axis=1), 1).astype(x.dtype)
    if kind == "max":
        return jnp.max(jnp.where(m, x, jnp.finfo(x.dtype).min), axis=1)
    if kind == "last":
        last = length - 1 - jnp.argmax(mask[:, ::-1], axis=1)
        return jnp.take_along_axis(x, last[:, None, None], axis=1)[:, 0]
    raise ValueError(f"pooling {kind!r} not in {POOLING}")


def _dense(features, names, name, fan_in, init_scheme="linen", dtype=jnp.float32):
    kernel_init, bias_init = initializers.dense(init_scheme, fan_in)
    return nn.Dense(features, dtype=dtype, name=name,
                    kernel_init=nn.with_logical_partitioning(kernel_init, names),
                    bias_init=nn.with_logical_partitioning(bias_init, names[-1:]))


class ClassifyHead(nn.Module):
    """`[batch, length, d_model]`, mask -> pooled logits `[batch, num_classes]`; with `d_hidden`
    > 0 an MLP (Dense -> GELU -> Dense) on the pooled features, else one linear map."""
    num_classes: int
    pooling: str = "mean"
    init_scheme: str = "linen"
    d_hidden: int = 0
    activation: str = "gelu"  # of the hidden layer: gelu (tanh) | relu

    @nn.compact
    def __call__(self, x, mask=None):
        pooled = pool(x, mask, self.pooling).astype(jnp.float32)
        if self.d_hidden:
            act = {"gelu": nn.gelu, "relu": nn.relu}[self.activation]
            pooled = act(_dense(self.d_hidden, ("embed", "mlp"), "hidden", pooled.shape[-1],
                                self.init_scheme)(pooled))
        return _dense(self.num_classes, ("embed", "classes"), "logits", pooled.shape[-1],
                      self.init_scheme)(pooled)


class TokenHead(nn.Module):
    """Per-position linear map `[batch, length, d_model] -> [batch, length, num_outputs]`."""
    num_outputs: int
    axis_name: str = "vocab"
    init_scheme: str = "linen"

    @nn.compact
    def __call__(self, x, mask=None):
        del mask  # per-position outputs; the objective masks its loss
        return _dense(self.num_outputs, ("embed", self.axis_name), "logits", x.shape[-1],
                      self.init_scheme)(x.astype(jnp.float32))


class PixelHead(nn.Module):
    """256-way logits per channel: `[batch, length, d_model] -> [batch, length, d_input, 256]`."""
    d_input: int
    levels: int = 256
    init_scheme: str = "linen"

    @nn.compact
    def __call__(self, x, mask=None):
        del mask
        y = _dense(self.d_input * self.levels, ("embed", "vocab"), "logits", x.shape[-1],
                   self.init_scheme)(x.astype(jnp.float32))
        return y.reshape(*x.shape[:2], self.d_input, self.levels)


class RetrievalHead(nn.Module):
    """Dual-encoder matching: pooled u, v -> MLP([u, v, u·v, u−v]) -> `[batch, num_classes]`."""
    num_classes: int
    pooling: str = "mean"
    d_hidden: int = 0  # 0 = the feature width
    init_scheme: str = "linen"
    gelu_approximate: bool = True  # False: exact GELU (the paper code's)

    @nn.compact
    def __call__(self, x1, mask1, x2, mask2):
        u = pool(x1, mask1, self.pooling).astype(jnp.float32)
        v = pool(x2, mask2, self.pooling).astype(jnp.float32)
        h = jnp.concatenate([u, v, u * v, u - v], axis=-1)
        h = nn.gelu(_dense(self.d_hidden or u.shape[-1], ("mlp", "embed"), "hidden", h.shape[-1],
                           self.init_scheme)(h), approximate=self.gelu_approximate)
        return _dense(self.num_classes, ("embed", "classes"), "logits", h.shape[-1],
                      self.init_scheme)(h)
