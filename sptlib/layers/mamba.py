"""Selective state-space mixers (Flax Linen): Mamba (Gu & Dao 2023) and Mamba-2 (Dao & Gu 2024).

Mamba block (state-spaces/mamba `Mamba`), d_inner = expand · d_model:

    x, z = in_proj(x);  u = SiLU(causal depthwise conv(x));  Δ, B, C = projections of u
    y = selective_scan(u, Δ, A, B, C) + D u;  out = out_proj(y ⊙ SiLU(z))

Mamba-2 block (`Mamba2`): heads of width `head_dim`, a scalar A per head, B and C shared by
the heads of a group:

    z, xBC, dt = in_proj(x);  x, B, C = SiLU(conv(xBC));  y = SSD(x, softplus(dt + dt_bias), A, B, C)
    + D x;  out = out_proj(RMSNorm_grouped(y ⊙ SiLU(z)))

The scans are `sptlib.kernels.selective` (chunked associative scan; chunked SSD).
Initialisation as in the reference code: A_log = log(1..N) per channel (S4D-real, Mamba) or
log U[A_init_min, A_init_max] per head (Mamba-2); Δ's bias the inverse softplus of dt drawn
log-uniformly in [dt_min, dt_max] (floored at dt_init_floor); D = 1; the depthwise convolution
and Mamba's x_proj as PyTorch's defaults (U(±1/√fan_in)), dt_proj's weight U(±dt_rank^-1/2).
A_log, D and the Δ bias are in the "ssm" optimiser group (no weight decay;
`sptlib.layers.param_groups`); everything else is "default".

Bidirectional (`causal=False`, the LRA encoders; as Vision Mamba's bidirectional block): the
in/out projections and the gate are shared, and a second set of per-direction parameters (conv,
Δ/B/C projections, A_log, D, Δ bias: a leading axis of size 2) runs the scan on the reversed
sequence; the two outputs are summed before the gate.

Padding (`mask` False): inputs are zeroed, and after the convolution u and Δ are zeroed there,
so a padded step is the identity on the state (decay exp(0) = 1, no input) in both directions:
nothing of the padding reaches a real position. Outputs are zero at padding.

Recurrent form (causal only): `initial_state(batch_size, max_length=None)` -> {"conv": last
d_conv-1 conv inputs, "ssm": the state}, and `step(x_t, state) -> (y_t, state)`.
"""

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from sptlib.kernels import selective as sel
from sptlib.layers import initializers
from sptlib.layers.initializers import boxed, symmetric_uniform
from sptlib.layers.param_groups import ssm_group


def dt_bias_init(dt_min, dt_max, floor):
    """Mamba's Δ bias: inverse softplus of dt ~ log-uniform [dt_min, dt_max], floored."""
    def init(key, shape, dtype=jnp.float32):
        u = jax.random.uniform(key, shape, jnp.float32)
        dt = jnp.exp(u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = jnp.maximum(dt, floor)
        return (dt + jnp.log(-jnp.expm1(-dt))).astype(dtype)  # softplus^{-1}(dt)
    return init


def s4d_real_log_init(key, shape, dtype=jnp.float32):
    """A_log = log(1..N) along the last axis (S4D-real: A_n = -n)."""
    del key
    return jnp.broadcast_to(jnp.log(jnp.arange(1, shape[-1] + 1, dtype=dtype)), shape)


def uniform_log_init(low, high):
    """log of U[low, high] (Mamba-2's per-head A)."""
    def init(key, shape, dtype=jnp.float32):
        return jnp.log(jax.random.uniform(key, shape, dtype, low, high))
    return init


def _flip(x):
    return None if x is None else jnp.flip(x, axis=1)


class _Selective(nn.Module):
    """What both mixers share: fields, dense projections, per-direction stacking, masks."""
    d_model: int
    causal: bool = False
    dropout: float = 0.0
    d_state: int = 16
    expand: int = 2
    d_conv: int = 4
    dt_min: float = 1e-3
    dt_max: float = 1e-1
    dt_init_floor: float = 1e-4
    chunk_size: int = 64
    dtype: Any = jnp.float32
    init_scheme: str = "linen"  # of in_proj / out_proj: linen | torch (sptlib.layers.initializers)

    @property
    def n_dir(self):
        return 1 if self.causal else 2

    @property
    def d_inner(self):
        return self.expand * self.d_model

    def _dense(self, features, name, axes, fan_in):
        # in_proj / out_proj follow `config.model.init_scheme` like every other block's dense
        # projections: "torch" is the reference code's nn.Linear default (U(+-1/sqrt(fan_in)),
        # 1/sqrt(3) of linen's spread); no bias in either, as in the reference.
        kernel, _ = initializers.dense(self.init_scheme, fan_in)
        return nn.Dense(features, use_bias=False, dtype=self.dtype, name=name,
                        kernel_init=boxed(kernel, axes))

    def _conv_params(self, channels):
        bound = 1.0 / math.sqrt(self.d_conv)  # PyTorch Conv1d default, fan_in = d_conv
        w = self.param("conv_w", boxed(symmetric_uniform(bound), (None, None, "ssm_channels")),
                       (self.n_dir, self.d_conv, channels), jnp.float32)
        b = self.param("conv_b", boxed(symmetric_uniform(bound), (None, "ssm_channels")),
                       (self.n_dir, channels), jnp.float32)
        return w, b

    def _ssm_p(self, name, init, shape, axes):
        return self.param(name, ssm_group(init, axes), shape, jnp.float32)

    def _both(self, fn, params, *xs, mask=None):
        """`fn(params_d, *xs_d, mask_d)` for each direction (reversed inputs for the second),
        summed in the forward order. `params`: arrays with a leading direction axis."""
        if self.n_dir == 1:
            return fn(jax.tree.map(lambda p: p[0], params), *xs, mask)
        ys = jax.vmap(fn)(params, *(jnp.stack([x, _flip(x)]) for x in xs),
                          None if mask is None else jnp.stack([mask, _flip(mask)]))
        return ys[0] + _flip(ys[1])

    def _require_causal(self):
        if not self.causal:
            raise ValueError(f"{type(self).__name__}: the step form needs causal=True")

    def _finish(self, y, mask, deterministic, in_dtype):
        y = self.drop(y, deterministic=deterministic)
        out = self.out_proj(y.astype(self.dtype))
        if mask is not None:
            out = jnp.where(mask[..., None], out, 0)
        return out.astype(in_dtype)


def _masked(x, mask):
    return x if mask is None else jnp.where(mask[..., None], x, 0.0)


class MambaMixer(_Selective):
    """Mamba (S6) mixer. Fields: d_state (N, 16), expand (2), d_conv (4), dt_rank (0 =
    ceil(d_model / 16)), dt_min / dt_max / dt_init_floor, chunk_size (of the scan), dtype (of the
    projections; the scan runs in float32).

    Parameters: in_proj, out_proj, conv_w, conv_b, x_proj, dt_proj [default]; A_log, D,
    dt_bias [ssm]. Per-direction ones have a leading axis n_dir.
    """
    dt_rank: int = 0

    @property
    def rank(self):
        return self.dt_rank or math.ceil(self.d_model / 16)

    def setup(self):
        di, n, r, nd = self.d_inner, self.d_state, self.rank, self.n_dir
        self.in_proj = self._dense(2 * di, "in_proj", ("embed", "mlp"), self.d_model)
        self.conv_w, self.conv_b = self._conv_params(di)
        self.x_proj = self.param(
            "x_proj", boxed(symmetric_uniform(1.0 / math.sqrt(di)), (None, "ssm_channels", None)),
            (nd, di, r + 2 * n), jnp.float32)
        self.dt_proj = self.param(
            "dt_proj", boxed(symmetric_uniform(r ** -0.5), (None, None, "ssm_channels")),
            (nd, r, di), jnp.float32)
        self.dt_bias = self._ssm_p("dt_bias", dt_bias_init(self.dt_min, self.dt_max,
                                                           self.dt_init_floor),
                                   (nd, di), (None, "ssm_channels"))
        self.A_log = self._ssm_p("A_log", s4d_real_log_init, (nd, di, n),
                                 (None, "ssm_channels", "ssm_state"))
        self.D = self._ssm_p("D", nn.initializers.ones, (nd, di), (None, "ssm_channels"))
        self.drop = nn.Dropout(self.dropout)
        self.out_proj = self._dense(self.d_model, "out_proj", ("mlp", "embed"), di)

    def _params(self):
        return dict(conv_w=self.conv_w, conv_b=self.conv_b, x_proj=self.x_proj,
                    dt_proj=self.dt_proj, dt_bias=self.dt_bias, A_log=self.A_log, D=self.D)

    def _projections(self, p, u):
        """Δ (softplus applied), B, C from u `[..., d_inner]`."""
        r, n = self.rank, self.d_state
        xdbl = u @ p["x_proj"]
        dt, b, c = jnp.split(xdbl, [r, r + n], axis=-1)
        return jax.nn.softplus(dt @ p["dt_proj"] + p["dt_bias"]), b, c

    def _direction(self, p, xi, mask):
        u = _masked(jax.nn.silu(sel.causal_depthwise_conv(xi, p["conv_w"], p["conv_b"])), mask)
        delta, b, c = self._projections(p, u)
        delta = _masked(delta, mask)
        return sel.selective_scan(u, delta, -jnp.exp(p["A_log"]), b, c, p["D"],
                                  chunk_size=self.chunk_size)

    def __call__(self, x, *, mask=None, deterministic=True):
        """x `[batch, length, d_model]`, mask `[batch, length]` (True = real) -> same shape."""
        in_dtype = x.dtype
        x = _masked(x, mask)
        xi, z = jnp.split(self.in_proj(x.astype(self.dtype)).astype(jnp.float32), 2, axis=-1)
        y = self._both(self._direction, self._params(), xi, mask=mask)
        return self._finish(y * jax.nn.silu(z), mask, deterministic, in_dtype)

    def initial_state(self, batch_size, max_length=None):
        """Zero state: {"conv": `[batch, d_conv-1, d_inner]`, "ssm": `[batch, d_inner, N]`}."""
        del max_length  # the recurrence does not depend on the length
        self._require_causal()
        return {"conv": jnp.zeros((batch_size, self.d_conv - 1, self.d_inner), jnp.float32),
                "ssm": jnp.zeros((batch_size, self.d_inner, self.d_state), jnp.float32)}

    def state_elements(self, max_length=None):
        """Per sequence: the short convolution's last d_conv-1 inputs `[d_conv-1, d_inner]` and
        the SSM state `[d_inner, N]` (`sptlib.layers.state`); independent of the length."""
        del max_length
        return (self.d_conv - 1) * self.d_inner + self.d_inner * self.d_state

    def step(self, x_t, state):
        """One recurrent step: x_t `[batch, d_model]` -> (y_t `[batch, d_model]`, state)."""
        self._require_causal()
        in_dtype = x_t.dtype
        p = jax.tree.map(lambda a: a[0], self._params())
        xi, z = jnp.split(self.in_proj(x_t.astype(self.dtype)).astype(jnp.float32), 2, axis=-1)
        u, conv = sel.conv_step(state["conv"], xi, p["conv_w"], p["conv_b"])
        u = jax.nn.silu(u)
        delta, b, c = self._projections(p, u)
        y, h = sel.selective_step(state["ssm"], u, delta, -jnp.exp(p["A_log"]), b, c, p["D"])
        out = self.out_proj((y * jax.nn.silu(z)).astype(self.dtype))
        return out.astype(in_dtype), {"conv": conv, "ssm": h}


class Mamba2Mixer(_Selective):
    """Mamba-2 (SSD) mixer. Fields: d_state (N, 64), expand (2), head_dim (P, 64; must divide
    expand · d_model), n_groups (G, 1), d_conv (4), chunk_size (T of SSD, 64), A_init_min /
    A_init_max (1, 16), dt_min / dt_max / dt_init_floor, norm_eps, dtype.

    Parameters: in_proj, out_proj, conv_w, conv_b, norm_scale [default]; A_log, D, dt_bias
    [ssm]; per-direction ones with a leading axis n_dir.
    """
    d_state: int = 64
    head_dim: int = 64
    n_groups: int = 1
    A_init_min: float = 1.0
    A_init_max: float = 16.0
    norm_eps: float = 1e-5

    @property
    def n_heads(self):
        if self.d_inner % self.head_dim:
            raise ValueError(f"mamba2: head_dim {self.head_dim} does not divide d_inner "
                             f"{self.d_inner} (= expand x d_model)")
        return self.d_inner // self.head_dim

    @property
    def conv_dim(self):
        return self.d_inner + 2 * self.n_groups * self.d_state

    def setup(self):
        di, h, nd = self.d_inner, self.n_heads, self.n_dir
        if h % self.n_groups:
            raise ValueError(f"mamba2: {h} heads do not split into {self.n_groups} groups")
        self.in_proj = self._dense(di + self.conv_dim + h, "in_proj", ("embed", "mlp"),
                                   self.d_model)
        self.conv_w, self.conv_b = self._conv_params(self.conv_dim)
        self.dt_bias = self._ssm_p("dt_bias", dt_bias_init(self.dt_min, self.dt_max,
                                                           self.dt_init_floor),
                                   (nd, h), (None, "heads"))
        self.A_log = self._ssm_p("A_log", uniform_log_init(self.A_init_min, self.A_init_max),
                                 (nd, h), (None, "heads"))
        self.D = self._ssm_p("D", nn.initializers.ones, (nd, h), (None, "heads"))
        self.norm_scale = self.param("norm_scale", boxed(nn.initializers.ones, ("norm",)),
                                     (di,), jnp.float32)
        self.drop = nn.Dropout(self.dropout)
        self.out_proj = self._dense(self.d_model, "out_proj", ("mlp", "embed"), di)

    def _params(self):
        return dict(conv_w=self.conv_w, conv_b=self.conv_b, dt_bias=self.dt_bias,
                    A_log=self.A_log, D=self.D)

    def _split_xbc(self, xbc):
        gn = self.n_groups * self.d_state
        xs, b, c = jnp.split(xbc, [self.d_inner, self.d_inner + gn], axis=-1)
        lead = xs.shape[:-1]
        return (xs.reshape(lead + (self.n_heads, self.head_dim)),
                b.reshape(lead + (self.n_groups, self.d_state)),
                c.reshape(lead + (self.n_groups, self.d_state)))

    def _direction(self, p, xbc, dt, mask):
        xbc = _masked(jax.nn.silu(sel.causal_depthwise_conv(xbc, p["conv_w"], p["conv_b"])),
                      mask)
        dt = _masked(jax.nn.softplus(dt + p["dt_bias"]), mask)
        xs, b, c = self._split_xbc(xbc)
        y = sel.ssd(xs, dt, -jnp.exp(p["A_log"]), b, c, p["D"], chunk_size=self.chunk_size)
        return y.reshape(y.shape[:-2] + (self.d_inner,))

    def _gated_norm(self, y, z):
        """RMSNorm over each group's d_inner / G channels of y ⊙ SiLU(z) (norm_before_gate
        False, as in the reference)."""
        g = y * jax.nn.silu(z)
        gs = g.reshape(g.shape[:-1] + (self.n_groups, -1))
        gs = gs * jax.lax.rsqrt(jnp.mean(jnp.square(gs), axis=-1, keepdims=True) + self.norm_eps)
        return gs.reshape(g.shape) * self.norm_scale

    def _in(self, x):
        zxd = self.in_proj(x.astype(self.dtype)).astype(jnp.float32)
        return jnp.split(zxd, [self.d_inner, self.d_inner + self.conv_dim], axis=-1)

    def __call__(self, x, *, mask=None, deterministic=True):
        """x `[batch, length, d_model]`, mask `[batch, length]` (True = real) -> same shape."""
        in_dtype = x.dtype
        z, xbc, dt = self._in(_masked(x, mask))
        y = self._both(self._direction, self._params(), xbc, dt, mask=mask)
        return self._finish(self._gated_norm(y, z), mask, deterministic, in_dtype)

    def initial_state(self, batch_size, max_length=None):
        """Zero state: {"conv": `[batch, d_conv-1, conv_dim]`, "ssm": `[batch, H, P, N]`}."""
        del max_length
        self._require_causal()
        return {"conv": jnp.zeros((batch_size, self.d_conv - 1, self.conv_dim), jnp.float32),
                "ssm": jnp.zeros((batch_size, self.n_heads, self.head_dim, self.d_state),
                                 jnp.float32)}

    def state_elements(self, max_length=None):
        """Per sequence: the short convolution's window `[d_conv-1, conv_dim]` and the SSD state
        `[H, P, N]` (`sptlib.layers.state`); independent of the length."""
        del max_length
        return (self.d_conv - 1) * self.conv_dim + self.n_heads * self.head_dim * self.d_state

    def step(self, x_t, state):
        """One recurrent step: x_t `[batch, d_model]` -> (y_t `[batch, d_model]`, state)."""
        self._require_causal()
        in_dtype = x_t.dtype
        p = jax.tree.map(lambda a: a[0], self._params())
        z, xbc, dt = self._in(x_t)
        xbc, conv = sel.conv_step(state["conv"], xbc, p["conv_w"], p["conv_b"])
        xs, b, c = self._split_xbc(jax.nn.silu(xbc))
        dt = jax.nn.softplus(dt + p["dt_bias"])
        y, h = sel.ssd_step(state["ssm"], xs, dt, -jnp.exp(p["A_log"]), b, c, p["D"])
        y = self._gated_norm(y.reshape(y.shape[:-2] + (self.d_inner,)), z)
        out = self.out_proj(y.astype(self.dtype))
        return out.astype(in_dtype), {"conv": conv, "ssm": h}


__all__ = ["MambaMixer", "Mamba2Mixer", "dt_bias_init", "s4d_real_log_init"]
