"""Hyena (Poli et al. 2023, "Hyena Hierarchy"): long convolutions with implicit filters, gated.

For order N (2) and width D, with `x[batch, length, D]`:

    (v, x_1, ..., x_N) = split(ShortConv_3(in_proj(x)))       in_proj: D -> (N+1)·D,
                                                               ShortConv_3: causal depthwise
    z_1 = v;   z_{n+1} = x_n ⊙ (h_n * z_n + b_n ⊙ z_n)        n = 1..N (the paper's recurrence)
    y = out_proj(z_{N+1})

Each long filter h_n `[D, length]` is implicit: a small FFN (Dense -> sin -> Dense -> sin ->
Dense -> sin -> Dense, learned sin frequencies) of positional features of t — t/L and the
real / imaginary parts of exp(-i f_k 2π t / L) for `(emb_dim - 1) / 2` bands f_k — times an
exponential-decay window exp(-|δ_d| t/L) whose rates δ_d span the channels from a slow to a fast
decay (the `ExponentialModulation` of HazyResearch/safari). The long convolution runs on
`sptlib.kernels.conv.fft_conv`; bidirectional (`causal=False`) each filter has a second,
anti-causal half applied to the reversed input (`fft_conv_bidirectional`, as the SSMs do), from
the same FFN's second set of output channels. b_n is the per-channel skip ("bias" in safari).

safari's `HyenaOperator` with `order=2` gates before the filter and uses N-1 filters
(`y = x_0 ⊙ (h * (x_1 ⊙ v))`); here it is the paper's definition above, N filters.

Padding: the input is zeroed at padded positions and every long convolution's input is zeroed
there again, so what the padding holds never reaches a real position.

State: Hyena has no finite recurrent state. It offers no `step` (the conformance check then has
no step = parallel rule to run); `state_elements(max_length)` is the cache an exact step would
need: the N long convolutions' inputs over `max_length` positions plus the short convolution's
window — it grows with the length, like attention's KV cache.

`direct(x, mask=...)` computes the same function with the long convolutions as explicit
Toeplitz sums in the parameters' dtype: the float64 reference of the conformance check
(`conformance_reference`) and of the tests.
"""

import math
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from sptlib.kernels import conv
from sptlib.layers.initializers import boxed


def positional_features(length, emb_dim, dtype=jnp.float32):
    """`[length, emb_dim]`: t/(L-1) in [0, 1], then Re / Im of exp(-i f_k 2π t / L) for
    `(emb_dim - 1) // 2` bands f_k = linspace(1e-4, bands - 1, bands) (safari
    `PositionalEmbedding`)."""
    bands = (emb_dim - 1) // 2
    t = jnp.linspace(0.0, 1.0, length, dtype=dtype)[:, None]
    w = (2 * math.pi * jnp.arange(length, dtype=dtype) / length)[:, None]
    f = jnp.linspace(1e-4, bands - 1, bands, dtype=dtype)[None]
    return jnp.concatenate([t, jnp.cos(f * w), -jnp.sin(f * w)], axis=-1)


def decay_rates(channels, fast_decay_pct=0.3, slow_decay_pct=1.5, target=1e-2):
    """`[channels]` rates δ: the window exp(-δ t) (t in [0, 1]) reaches `target` at
    `fast_decay_pct` of the length for the fastest channel, `slow_decay_pct` for the slowest."""
    fast = math.log(1 / target) / fast_decay_pct
    slow = math.log(1 / target) / slow_decay_pct
    return jnp.linspace(slow, fast, channels)


def _toeplitz_conv(u, k, k_bwd=None):
    """Direct convolution `sum_s k[:, t-s] u_s` (+ `k_bwd[:, s-t-1] u_s` for s > t): u
    `[batch, length, channels]`, k `[channels, length]`, any float dtype (the reference path)."""
    length = u.shape[1]
    t = jnp.arange(length)[:, None]
    s = jnp.arange(length)[None, :]
    fwd = jnp.where(t >= s, k[:, jnp.clip(t - s, 0, length - 1)], 0)  # [channels, t, s]
    if k_bwd is not None:
        fwd = fwd + jnp.where(s > t, k_bwd[:, jnp.clip(s - t - 1, 0, length - 1)], 0)
    return jnp.einsum("hts,bsh->bth", fwd, u)


class HyenaMixer(nn.Module):
    """Hyena operator (registered as mixer ``hyena``): `[batch, length, d_model]` -> same.

    Attributes:
      order: N, the number of gated long convolutions (2).
      filter_order: width of the implicit filter's FFN (64).
      emb_dim: positional features (odd: t plus (emb_dim-1)/2 bands of Re / Im; 33).
      short_kernel: width of the causal depthwise short convolution (3).
      sin_freq: initial frequency of the FFN's sin activations (1; safari's `w`).
      fast_decay_pct, slow_decay_pct, decay_target: the exponential window (`decay_rates`).
      dtype: compute dtype of the dense projections (the filters and FFTs run in float32).
    """
    d_model: int
    causal: bool = False
    dropout: float = 0.0
    order: int = 2
    filter_order: int = 64
    emb_dim: int = 33
    short_kernel: int = 3
    sin_freq: float = 1.0
    fast_decay_pct: float = 0.3
    slow_decay_pct: float = 1.5
    decay_target: float = 1e-2
    dtype: Any = jnp.float32

    conformance_reference = "direct"  # sptlib.layers.contract: the float64 reference

    @property
    def n_dir(self):
        return 1 if self.causal else 2

    def setup(self):
        if self.order < 1:
            raise ValueError(f"hyena: order={self.order} must be >= 1")
        if self.emb_dim < 3 or self.emb_dim % 2 == 0:
            raise ValueError(f"hyena: emb_dim={self.emb_dim} must be odd and >= 3 (t plus "
                             f"(emb_dim-1)/2 bands of Re / Im)")
        d, n = self.d_model, self.order
        init = nn.initializers.lecun_normal()
        zeros = nn.initializers.zeros
        dense = lambda features, names, name, bias=True: nn.Dense(
            features, use_bias=bias, dtype=self.dtype, kernel_init=boxed(init, names),
            bias_init=boxed(zeros, names[-1:]), name=name)
        self.in_proj = dense((n + 1) * d, ("embed", "mlp"), "in_proj")
        self.out_proj = dense(d, ("mlp", "embed"), "out_proj")
        self.short_w = self.param("short_w", boxed(nn.initializers.normal(0.5), (None, "mlp")),
                                  (self.short_kernel, (n + 1) * d))
        self.short_b = self.param("short_b", boxed(zeros, ("mlp",)), ((n + 1) * d,))
        f = self.filter_order
        self.filter_in = nn.Dense(f, name="filter_in")
        self.filter_hidden = [nn.Dense(f, name=f"filter_hidden_{i}") for i in range(2)]
        self.filter_out = nn.Dense(self.n_dir * n * d, use_bias=False, name="filter_out")
        self.sin_w = self.param("sin_w", lambda k, s: jnp.full(s, self.sin_freq), (3, f))
        self.bias = self.param("bias", boxed(nn.initializers.normal(1.0), (None, "embed")),
                               (n, d))
        self.drop = nn.Dropout(self.dropout)

    def filters(self, length, dtype=jnp.float32):
        """Implicit filters `[n_dir, order, d_model, length]` (decay-windowed FFN of positions)."""
        z = positional_features(length, self.emb_dim, dtype)
        h = jnp.sin(self.sin_w[0].astype(dtype) * self.filter_in(z))
        for i, layer in enumerate(self.filter_hidden):
            h = jnp.sin(self.sin_w[i + 1].astype(dtype) * layer(h))
        k = self.filter_out(h)  # [length, n_dir * order * d]
        k = k.reshape(length, self.n_dir, self.order, self.d_model)
        t = jnp.linspace(0.0, 1.0, length, dtype=dtype)
        rates = decay_rates(self.d_model, self.fast_decay_pct, self.slow_decay_pct,
                            self.decay_target).astype(dtype)
        window = jnp.exp(-t[:, None] * rates[None])  # [length, d]
        return jnp.transpose(k * window[:, None, None], (1, 2, 3, 0))

    def _gates(self, x, mask):
        """Zeroed input -> in_proj -> causal short conv -> (v, [x_1..x_N]) `[b, l, d]` each."""
        if mask is not None:
            x = jnp.where(mask[..., None], x, 0)
        u = self.in_proj(x.astype(self.dtype)).astype(jnp.float32)
        w = self.short_w.astype(u.dtype)
        kw = self.short_kernel
        padded = jnp.pad(u, ((0, 0), (kw - 1, 0), (0, 0)))
        u = sum(padded[:, j:j + u.shape[1]] * w[kw - 1 - j] for j in range(kw)) + self.short_b
        parts = jnp.split(u, self.order + 1, axis=-1)
        return parts[0], parts[1:]

    def _mix(self, x, mask, deterministic, long_conv, dtype):
        in_dtype = x.dtype
        v, gates = self._gates(x, mask)
        v = v.astype(dtype)
        k = self.filters(x.shape[1], dtype)
        bias = self.bias.astype(dtype)
        for n in range(self.order):
            if mask is not None:
                v = jnp.where(mask[..., None], v, 0)  # padding never enters a long convolution
            conv_v = long_conv(v, k[0, n], None if self.causal else k[1, n])
            v = gates[n].astype(dtype) * (conv_v + bias[n] * v)
        v = self.drop(v, deterministic=deterministic)
        y = self.out_proj(v.astype(self.dtype))
        if mask is not None:
            y = jnp.where(mask[..., None], y, 0)
        return y.astype(in_dtype)

    def __call__(self, x, *, mask=None, deterministic=True):
        """x `[batch, length, d_model]`, mask `[batch, length]` (True = real) -> same shape."""
        def fft(u, k, k_bwd):
            return conv.fft_conv(u, k) if k_bwd is None else conv.fft_conv_bidirectional(
                u, k, k_bwd)
        return self._mix(x, mask, deterministic, fft, jnp.float32)

    def direct(self, x, *, mask=None, deterministic=True):
        """The same function with direct (Toeplitz) long convolutions in the parameters' dtype:
        the O(L^2) reference (float64 under `jax.enable_x64`)."""
        dtype = self.bias.dtype
        return self._mix(x, mask, deterministic, _toeplitz_conv, dtype)

    def state_elements(self, max_length=None):
        """The cache an exact causal step would carry per sequence (no finite state): the N
        long convolutions' inputs over `max_length` positions, N x d_model x max_length, plus
        the short convolution's last `short_kernel - 1` inputs of (N+1) x d_model channels."""
        if not max_length:
            raise ValueError("hyena has no finite state: state_elements needs max_length (its "
                             "cache grows with the sequence, like attention's KV cache)")
        d, n = self.d_model, self.order
        return n * d * int(max_length) + (self.short_kernel - 1) * (n + 1) * d


__all__ = ["HyenaMixer", "positional_features", "decay_rates"]
