"""Multi-head self-attention: plain, exact memory-efficient (chunked), and local (banded).

All three algorithms compute the same function — softmax attention restricted by a key-padding
mask, an optional causal mask and an optional band `|q - k| <= window` (`0 <= q - k <= window` when
causal) — and differ in the memory of their jnp reference:

- ``plain``: one `[batch, heads, length, length]` score matrix; fastest for short sequences.
- ``chunked``: exact online softmax over query and key chunks (Rabe & Staats 2021) with the
  FlashAttention-2 backward, so forward *and* backward memory grow linearly with length.
- ``local``: the chunked kernel visiting only the key chunks that intersect the band, so time and
  memory are O(length · window) — for PathX (16,384) and PathX-256 (65,536).

The kernel behind the algorithm is chosen by the platform the step runs on
(`sptlib.kernels.platform`): a fused CPU kernel for ``plain`` on CPU, cuDNN flash attention
(half precision) or a Pallas (Triton) band kernel on CUDA GPUs, Pallas splash attention on TPU,
else the jnp reference. `kernel="reference"` forces the reference (benchmarks, tests).

Positions: ``rotary`` (applied to queries and keys, so scores depend on relative position only) or
``none`` (absolute positions, if any, are added by the encoder: `config.model.positions`).
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from sptlib.kernels import linear, platform
from sptlib.kernels.attention import (MASK_VALUE, allowed_pairs, chunked_attention,
                                      dot_product_attention, rotary_embedding)
from sptlib.layers import initializers

IMPLS = platform.ALGORITHMS
# Backend names earlier configs used as `impl`, and the algorithm that replaces each.
RETIRED_IMPLS = {"fused": "plain"}
# Logical axes of q, k, v `[batch, length, heads, head_dim]` (for kernels that run per shard).
QKV_AXES = ("batch", "length", "heads", "kv")
POSITIONS = ("none", "rotary")

__all__ = ["MultiHeadAttention", "chunked_attention", "dot_product_attention",
           "rotary_embedding", "IMPLS", "POSITIONS"]


# ---------------------------------------------------------------------------------------------
# The mixer
# ---------------------------------------------------------------------------------------------



class MultiHeadAttention(nn.Module):
    """Multi-head self-attention sequence mixer (registered as mixer ``attention``).

    `y = mha(x[batch, length, d_model], *, mask[batch, length] (True = real) | None,
    deterministic) -> [batch, length, d_model]`. Padding keys are never attended to and outputs at
    padding positions are zero. Causal instances also offer `initial_state` / `step` (KV cache).

    Attributes:
      d_model: model width (input and output features).
      causal: query i attends to keys j <= i only.
      dropout: dropout rate on the attended values (before the output projection); applied the
        same way in every impl, unlike dropout on the weights, which the chunked kernel never forms.
      n_heads: number of heads.
      head_dim: features per head; 0 = d_model // n_heads (set it to keep head width fixed when the
        head count changes, e.g. wide attention, or GSS-Hybrid's 8 heads of 128).
      positions: ``none`` | ``rotary``.
      impl: the algorithm, ``plain`` | ``chunked`` | ``local`` (see the module docstring).
      kernel: ``auto`` (the platform's fused kernel where one applies) | ``reference`` (jnp).
      window: band half-width; 0 = unlimited (required > 0 for ``local``).
      chunk_size: chunk length of the chunked/local kernels.
      rotary_base: wavelength base of rotary positions.
      dtype: compute dtype of projections (scores and softmax always run in float32).
      init_scheme: ``linen`` | ``torch`` kernel initialisation (`sptlib.layers.initializers`).
    """
    d_model: int
    causal: bool = False
    dropout: float = 0.0
    n_heads: int = 4
    head_dim: int = 0
    positions: str = "none"
    impl: str = "plain"
    kernel: str = "auto"
    window: int = 0
    chunk_size: int = 512
    rotary_base: float = 10000.0
    dtype: Any = jnp.float32
    init_scheme: str = "linen"

    def setup(self):
        if self.impl in RETIRED_IMPLS:
            raise ValueError(
                f"attention impl {self.impl!r} named a backend and is gone: set "
                f"model.attention.impl={RETIRED_IMPLS[self.impl]!r} (the algorithm); the platform's "
                "fused kernel is chosen automatically (sptlib.kernels.platform)")
        if self.impl not in IMPLS:
            raise ValueError(f"attention impl {self.impl!r} not in {IMPLS}")
        if self.kernel not in platform.KERNELS:
            raise ValueError(f"attention kernel {self.kernel!r} not in {platform.KERNELS}")
        if self.positions not in POSITIONS:
            raise ValueError(f"attention positions {self.positions!r} not in {POSITIONS} "
                             "(absolute positions belong to the encoder: config.model.positions)")
        if self.impl == "local" and self.window <= 0:
            raise ValueError("impl='local' needs window > 0")
        if not self.head_dim and self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} not divisible by n_heads={self.n_heads}")
        hd = self.head_dim or self.d_model // self.n_heads
        shape = (self.d_model, self.n_heads, hd)
        names = ("embed", "heads", "kv")
        in_init = initializers.attention_in(self.init_scheme, self.d_model, self.n_heads * hd)
        out_init, _ = initializers.dense(self.init_scheme, self.n_heads * hd, in_axis=(0, 1),
                                         out_axis=2)
        proj = lambda name: self.param(
            name, nn.with_logical_partitioning(in_init, names), shape)
        bias = lambda name: self.param(
            name, nn.with_logical_partitioning(nn.initializers.zeros, ("heads", "kv")),
            (self.n_heads, hd))
        self.w_query, self.w_key, self.w_value = proj("query"), proj("key"), proj("value")
        self.b_query, self.b_key, self.b_value = bias("query_bias"), bias("key_bias"), bias(
            "value_bias")
        self.w_out = self.param(
            "out", nn.with_logical_partitioning(out_init, ("heads", "kv", "embed")),
            (self.n_heads, hd, self.d_model))
        self.b_out = self.param(
            "out_bias", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
            (self.d_model,))
        self.drop = nn.Dropout(self.dropout)

    @property
    def _head_dim(self):
        return self.head_dim or self.d_model // self.n_heads

    def _project(self, x):
        """x `[..., d_model]` -> scaled q, k, v `[..., heads, head_dim]`."""
        x = x.astype(self.dtype)
        # linear.project: "...d,dhk->...hk", with the CPU kernel's weight gradient on CPU.
        q, k, v = (linear.project(x, w.astype(self.dtype)) + b.astype(self.dtype)
                   for w, b in ((self.w_query, self.b_query), (self.w_key, self.b_key),
                                (self.w_value, self.b_value)))
        return q * (self._head_dim ** -0.5), k, v

    def _output(self, o, deterministic):
        """Attended values `[..., heads, head_dim]` -> `[..., d_model]`."""
        o = self.drop(o, deterministic=deterministic)
        y = linear.project(o, self.w_out.astype(self.dtype), 2)  # "...hk,hkd->...d"
        return y + self.b_out.astype(self.dtype)

    def __call__(self, x, *, mask=None, deterministic=True):
        """x `[batch, length, d_model]`, mask bool `[batch, length]` -> `[batch, length, d_model]`."""
        q, k, v = self._project(x)
        if self.positions == "rotary":
            pos = jnp.arange(x.shape[1])[:, None]  # broadcasts over heads
            q = rotary_embedding(q, pos, self.rotary_base)
            k = rotary_embedding(k, pos, self.rotary_base)
        o = platform.attention(q, k, v, mask, causal=self.causal, window=self.window,
                               algorithm=self.impl, chunk_size=self.chunk_size,
                               kernel=self.kernel, spec=nn.logical_to_mesh_axes(QKV_AXES))
        y = self._output(o, deterministic)
        if mask is not None:
            y = jnp.where(mask[..., None], y, 0)
        return y

    # -- recurrent (decoding) form --------------------------------------------------------------

    def initial_state(self, batch_size, max_length=None):
        """Empty KV cache: `{'key', 'value': [batch, max_length, heads, head_dim], 'index': ()}`."""
        if not self.causal:
            raise ValueError("the step form needs causal=True")
        if not max_length:
            raise ValueError("attention's KV cache needs max_length")
        shape = (batch_size, max_length, self.n_heads, self._head_dim)
        return dict(key=jnp.zeros(shape, self.dtype), value=jnp.zeros(shape, self.dtype),
                    index=jnp.zeros((), jnp.int32))

    def state_elements(self, max_length=None):
        """KV cache per sequence at `max_length` positions: 2 x heads x head_dim x max_length
        (`sptlib.layers.state`; the shared position counter is not per sequence)."""
        if not max_length:
            raise ValueError("attention's state is its KV cache: state_elements needs max_length "
                             "(the sequence length)")
        return 2 * self.n_heads * self._head_dim * int(max_length)

    def step(self, x_t, state):
        """One decoding step: x_t `[batch, d_model]` at position `state['index']` -> (y_t, state).

        Equals row `index` of the causal parallel form (same rotary position, same band).
        """
        if not self.causal:
            raise ValueError("the step form needs causal=True")
        index = state["index"]
        q, k, v = self._project(x_t)  # [batch, heads, head_dim]
        if self.positions == "rotary":
            q = rotary_embedding(q, index, self.rotary_base)
            k = rotary_embedding(k, index, self.rotary_base)
        keys = lax.dynamic_update_slice_in_dim(state["key"], k[:, None].astype(state["key"].dtype),
                                               index, axis=1)
        values = lax.dynamic_update_slice_in_dim(state["value"],
                                                 v[:, None].astype(state["value"].dtype),
                                                 index, axis=1)
        scores = jnp.einsum("bhd,bmhd->bhm", q, keys, preferred_element_type=jnp.float32)
        allowed = allowed_pairs(index[None], jnp.arange(keys.shape[1]), True, self.window)[0]
        scores = jnp.where(allowed, scores, MASK_VALUE)
        weights = jax.nn.softmax(scores, axis=-1)
        o = jnp.einsum("bhm,bmhd->bhd", weights.astype(values.dtype), values,
                       preferred_element_type=jnp.float32).astype(self.dtype)
        y = self._output(o, deterministic=True)
        return y, dict(key=keys, value=values, index=index + 1)
