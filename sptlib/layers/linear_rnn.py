r"""Linear-attention / delta-rule mixers (Flax Linen): GLA, RetNet, DeltaNet, Gated DeltaNet,
mLSTM and RWKV-7, on the chunked kernels of `sptlib.kernels.linear_rnn`.

Every mixer keeps, per head, a matrix state S `[d_k, d_v]` read by its query, o_t = S_tᵀ q_t:

    GLA             S_t = diag(α_t) S_{t-1} + k_t v_tᵀ,  log α_t = logsigmoid(W₂W₁x_t + b) / 16
    RetNet          S_t = γ_h S_{t-1} + k_t v_tᵀ,        γ_h = 1 − 2^(−5−h) (fixed per head)
    DeltaNet        S_t = (I − β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ,  β_t = σ(W_β x_t)
    Gated DeltaNet  S_t = α_t (I − β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ,
                    log α_t = −exp(A_log) · softplus(W_α x_t + dt_bias)   (Mamba-2's gate)
    mLSTM           C_t = f_t C_{t-1} + i_t k_t v_tᵀ, n_t = f_t n_{t-1} + i_t k_t,
                    h_t = C_tᵀ q_t / max(|n_tᵀ q_t|, 1),  i = exp(ĩ), f = σ(f̃) (max-stabilised)
    RWKV-7          S_t = (diag(w_t) − (κ̂_t ⊙ a_t) κ̂_tᵀ) S_{t-1} + k_t v_tᵀ,
                    w_t = exp(−e^{−1/2} σ(·)), κ̂ the L2-normalised removal key, a the
                    in-context learning rate

The layer designs follow fla-org/flash-linear-attention's `fla/layers` (GLA, DeltaNet, Gated
DeltaNet, multiscale retention, RWKV-7) and NX-AI/xlstm's mLSTM layer; as zoology does "for a fair
comparison", q, k and v pass a short causal depthwise convolution + SiLU by default
(`use_short_conv`; RWKV-7 has its own token shift instead, mLSTM convolves its q/k branch as in
xLSTM). The queries are scaled by d_k^-1/2 (mLSTM: the keys), the delta rules L2-normalise q and k.
Outputs: a per-head RMSNorm (mLSTM and RWKV-7: per-head layer / group norm), an output gate
(SiLU(W_g x); RWKV-7: a sigmoid low-rank gate), the out projection. Not implemented: RetNet's
xPos rotary positions, RWKV-7's value residual to the first layer (`v_first`: it crosses layers,
outside the mixer contract) and its layer-dependent initialisation (the middle layer's is used).

Parameter groups: the decay parameters are "ssm" (own learning rate, no weight decay;
`sptlib.layers.param_groups`): GLA's gate bias, Gated DeltaNet's A_log and dt_bias, mLSTM's gate
biases, RWKV-7's decay bias. Everything else is "default"; the dense projections follow
`init_scheme` (linen | torch).

Bidirectional (`causal=False`; the classification encoders), as `sptlib.layers.mamba` does it: the
q/k/v/gate and out projections and the output norm are shared; each direction has its own short
convolution and gate / decay parameters (a leading axis n_dir = 2) and runs the recurrence on
its own order of the sequence (the second on the reversed one). The two read-outs are summed
before the norm (mLSTM: and the two skips; RWKV-7 sums the two gated, normed outputs before
its out projection).

Padding (`mask` False) is the identity on every state in both directions: inputs are zeroed
before the projections, and at padding k = v = 0, log-decays 0 (α = γ = w = 1), β = 0 and a = 0,
mLSTM's input gate −∞ and forget gate 1; outputs are zero there.

Recurrent form (causal only): `initial_state(batch_size, max_length=None)` -> a dict of zero
arrays ("conv": the last d_conv − 1 convolution inputs, or "shift": RWKV-7's previous input;
"rnn": the state `[batch, heads, d_k, d_v]`; mLSTM "C", "n", "m"), `step(x_t[batch, features],
state) -> (y_t, state)`, and `state_elements(max_length=None)`: recurrent state elements per
sequence (the leaves of `initial_state(1)`; bidirectional: both directions').
"""

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sptlib.kernels import linear_rnn as lr
from sptlib.kernels import selective as sel
from sptlib.layers import initializers
from sptlib.layers.initializers import boxed, const, symmetric_uniform
from sptlib.layers.mamba import dt_bias_init, uniform_log_init
from sptlib.layers.param_groups import ssm_group

# mLSTM's input-gate pre-activation at padding: exp(ĩ − m) underflows to exactly 0 for any
# stabiliser m a real step can reach; its forget-gate pre-activation there: log σ(f̃) = 0.
_GATE_OFF, _FORGET_KEEP = -1e30, 1e4


def _flip(x):
    return None if x is None else jnp.flip(x, axis=1)


def _where(mask, x, fill=0.0):
    """x with `fill` at padding; mask `[batch, length]` broadcast over x's trailing axes."""
    if mask is None:
        return x
    return jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 2)), x, fill)


def _l2norm(x, eps=1e-6):
    return x * jax.lax.rsqrt(jnp.sum(jnp.square(x), -1, keepdims=True) + eps)


def _shapes_size(shapes):
    return int(sum(math.prod(s) for s in shapes.values()))


class _LinearRNN(nn.Module):
    """Fields and machinery shared by the family: heads, dims, projections, the short
    convolution, per-direction parameters, masks, norms, the recurrent form."""
    d_model: int
    causal: bool = False
    dropout: float = 0.0
    norm_eps: float = 1e-5
    chunk_size: int = 64
    dtype: Any = jnp.float32
    init_scheme: str = "linen"  # of the dense projections: linen | torch

    _kind = ""  # the registry name, for messages (a class constant, not an option)

    # -- dims -------------------------------------------------------------------------------------

    @property
    def n_dir(self):
        return 1 if self.causal else 2

    def _dim(self, expand, what):
        dim = int(self.d_model * expand)
        if dim <= 0 or dim != self.d_model * expand or dim % self.n_heads:
            raise ValueError(f"{self._kind}: d_model {self.d_model} x {what} {expand} = "
                             f"{self.d_model * expand} must be a positive integer divisible by "
                             f"n_heads {self.n_heads}")
        return dim

    # -- parameters -------------------------------------------------------------------------------

    def _w(self, name, fan_in, features, axes=("embed", "mlp"), lead=()):
        """A dense kernel `[*lead, fan_in, features]` initialised by `init_scheme`."""
        kernel, _ = initializers.dense(self.init_scheme, fan_in)
        if lead:  # per-direction kernels, each initialised as one
            return self._dir_p(name, kernel, (fan_in, features), axes)
        return self.param(name, boxed(kernel, axes), (fan_in, features), jnp.float32)

    def _dir_p(self, name, init, shape, axes, group=False):
        """A per-direction parameter `[n_dir, *shape]`, each direction initialised by `init`
        of `shape` ("ssm" group when `group`)."""
        def stacked(key, full, dtype=jnp.float32):
            return jnp.stack([init(k, full[1:], dtype) for k in jax.random.split(key, full[0])])
        axes = (None,) + tuple(axes)
        box = ssm_group(stacked, axes) if group else boxed(stacked, axes)
        return self.param(name, box, (self.n_dir,) + tuple(shape), jnp.float32)

    def _conv_param(self, channels):
        bound = 1.0 / math.sqrt(self.d_conv)  # PyTorch Conv1d default, fan_in = d_conv
        return self._dir_p("conv_w", symmetric_uniform(bound), (self.d_conv, channels),
                           (None, "ssm_channels"))

    def _mm(self, x, w):
        """x @ w in the compute dtype, float32 out."""
        return (x.astype(self.dtype) @ w.astype(self.dtype)).astype(jnp.float32)

    # -- pieces of the forward pass ---------------------------------------------------------------

    def _short_conv(self, u, w, conv_state):
        """SiLU(causal depthwise conv) of u `[batch, length, C]` with kernel w `[d_conv, C]`; with
        `conv_state` (step form, length 1) the last d_conv − 1 inputs. Returns (y, new state)."""
        if conv_state is None:
            return jax.nn.silu(sel.causal_depthwise_conv(u, w)), None
        y, conv_state = sel.conv_step(conv_state, u[:, 0], w)
        return jax.nn.silu(y)[:, None], conv_state

    def _heads(self, x, dim):
        return x.reshape(x.shape[:-1] + (self.n_heads, dim))

    def _rms_heads(self, o):
        """RMSNorm over each head's d_v channels, one learned scale `[d_v]` shared by heads
        (fla's `RMSNorm(head_v_dim)`). o `[batch, length, heads, d_v]`."""
        o = o * jax.lax.rsqrt(jnp.mean(jnp.square(o), -1, keepdims=True) + self.norm_eps)
        return o * self.norm_scale

    def _both(self, fn, *xs, mask=None, state=None):
        """`fn(direction, *xs_d, mask_d, state_d) -> (outputs, state_d)` for each direction (the
        second on the reversed sequence), outputs summed in the forward order."""
        out, new = fn(0, *xs, mask, state)
        if self.n_dir == 1:
            return out, new
        rev, _ = fn(1, *(_flip(x) for x in xs), _flip(mask), None)
        return jax.tree.map(lambda a, b: a + _flip(b), out, rev), None

    def _finish(self, y, mask, deterministic, in_dtype):
        """Dropout, out projection, zero at padding. y `[batch, length, value_dim]`."""
        y = self.drop(y, deterministic=deterministic)
        out = self._mm(y, self.out_proj)
        return _where(mask, out).astype(in_dtype)

    # -- the contract -----------------------------------------------------------------------------

    def __call__(self, x, *, mask=None, deterministic=True):
        """x `[batch, length, d_model]`, mask `[batch, length]` (True = real) -> same shape."""
        in_dtype = x.dtype
        y, _ = self._forward(_where(mask, x.astype(jnp.float32)), mask, None)
        return self._finish(y, mask, deterministic, in_dtype)

    def _require_causal(self):
        if not self.causal:
            raise ValueError(f"{self._kind}: the step form needs causal=True")

    def _state_shapes(self, batch_size):
        """name -> shape of one direction's recurrent state."""
        raise NotImplementedError

    def initial_state(self, batch_size, max_length=None):
        """Zero state: a dict of float32 arrays (see `_state_shapes`)."""
        del max_length  # the recurrence does not depend on the length
        self._require_causal()
        return {k: jnp.zeros(s, jnp.float32) for k, s in self._state_shapes(batch_size).items()}

    def state_elements(self, max_length=None):
        """Recurrent state elements per sequence: the leaves of `initial_state(1)`, times the
        number of directions (bidirectional mixers keep one state per direction)."""
        del max_length
        return self.n_dir * _shapes_size(self._state_shapes(1))

    def step(self, x_t, state):
        """One recurrent step: x_t `[batch, d_model]` -> (y_t `[batch, d_model]`, state)."""
        self._require_causal()
        y, state = self._forward(x_t.astype(jnp.float32)[:, None], None, state)
        out = self._mm(y, self.out_proj)[:, 0]
        return out.astype(x_t.dtype), state


class _QKVMixer(_LinearRNN):
    """GLA / RetNet / DeltaNet / Gated DeltaNet: q, k, v (and the gate g) projections of x, the
    short convolution per direction, a kernel per direction, RMSNorm per head, output gate."""
    n_heads: int = 4
    expand_k: float = 1.0
    expand_v: float = 1.0
    use_short_conv: bool = True
    d_conv: int = 4
    use_output_gate: bool = True

    @property
    def key_dim(self):
        return self._dim(self.expand_k, "expand_k")

    @property
    def value_dim(self):
        return self._dim(self.expand_v, "expand_v")

    @property
    def head_k(self):
        return self.key_dim // self.n_heads

    @property
    def head_v(self):
        return self.value_dim // self.n_heads

    @property
    def conv_dim(self):
        """Channels of the short convolution (q | k | v)."""
        return 2 * self.key_dim + self.value_dim

    qk_l2norm = False  # the delta rules normalise q and k (class constant, not an option)

    def setup(self):
        d = self.d_model
        self.q_proj = self._w("q_proj", d, self.key_dim)
        self.k_proj = self._w("k_proj", d, self.key_dim)
        self.v_proj = self._w("v_proj", d, self.value_dim)
        if self.use_output_gate:
            self.g_proj = self._w("g_proj", d, self.value_dim)
        if self.use_short_conv:
            self.conv_w = self._conv_param(self.conv_dim)
        self.norm_scale = self.param("norm_scale", boxed(nn.initializers.ones, ("norm",)),
                                     (self.head_v,), jnp.float32)
        self.drop = nn.Dropout(self.dropout)
        self.out_proj = self._w("out_proj", self.value_dim, d, ("mlp", "embed"))
        self._gate_setup()

    def _gate_setup(self):
        """Per-direction gate / decay parameters of the mixer."""

    def _gates(self, d, x, mask):
        """Keyword arguments of the kernel for direction d (its gates; identity at padding)."""
        raise NotImplementedError

    def _kernel(self, q, k, v, state, **gates):
        raise NotImplementedError

    def _direction(self, d, qkv, x, mask, state):
        conv = None if state is None else state.get("conv")
        if self.use_short_conv:
            qkv, conv = self._short_conv(qkv, self.conv_w[d], conv)
        else:
            qkv = jax.nn.silu(qkv)  # fla's activation of q, k, v without the convolution
        qkv = _where(mask, qkv)
        q, k, v = jnp.split(qkv, [self.key_dim, 2 * self.key_dim], axis=-1)
        q, k, v = self._heads(q, self.head_k), self._heads(k, self.head_k), self._heads(
            v, self.head_v)
        if self.qk_l2norm:
            q, k = _l2norm(q), _l2norm(k)
        o, rnn = self._kernel(q * self.head_k ** -0.5, k, v,
                              None if state is None else state["rnn"], **self._gates(d, x, mask))
        new = {"rnn": rnn}
        if conv is not None:
            new["conv"] = conv
        return o, new

    def _forward(self, x, mask, state):
        qkv = jnp.concatenate([self._mm(x, self.q_proj), self._mm(x, self.k_proj),
                               self._mm(x, self.v_proj)], axis=-1)
        o, state = self._both(self._direction, qkv, x, mask=mask, state=state)
        o = self._rms_heads(o)
        o = o.reshape(o.shape[:-2] + (self.value_dim,))
        if self.use_output_gate:
            o = o * jax.nn.silu(self._mm(x, self.g_proj))
        return o, state

    def _state_shapes(self, batch_size):
        shapes = {"rnn": (batch_size, self.n_heads, self.head_k, self.head_v)}
        if self.use_short_conv:
            shapes["conv"] = (batch_size, self.d_conv - 1, self.conv_dim)
        return shapes


def _run(chunked, step, q, k, v, state, chunk_size, *gates):
    """The chunked kernel over a sequence (state None: from zero) or, with a state, one step on
    the length-1 inputs. Returns (o `[batch, length, heads, d_v]`, state)."""
    if state is None:
        return chunked(q, k, v, *gates, chunk_size=chunk_size)
    o, state = step(q[:, 0], k[:, 0], v[:, 0], *(None if g is None else g[:, 0] for g in gates),
                    state)
    return o[:, None], state


class GLAMixer(_QKVMixer):
    """Gated Linear Attention (Yang et al. 2024). Fields: n_heads (4), expand_k (0.5), expand_v
    (1), gate_low_rank_dim (16), gate_logit_normalizer (16), use_short_conv (True), d_conv (4),
    use_output_gate (True), norm_eps, chunk_size, dtype, init_scheme.

    Gate per key channel: log α = logsigmoid(W₂ W₁ x + b) / gate_logit_normalizer, W₁ `[d, r]`,
    W₂ `[r, d_k]` per direction (gk_w1, gk_w2 default group; gk_b "ssm").
    """
    expand_k: float = 0.5
    gate_low_rank_dim: int = 16
    gate_logit_normalizer: float = 16.0
    _kind = "gla"

    def _gate_setup(self):
        d, r, dk = self.d_model, self.gate_low_rank_dim, self.key_dim
        self.gk_w1 = self._w("gk_w1", d, r, ("embed", None), lead=(self.n_dir,))
        self.gk_w2 = self._w("gk_w2", r, dk, (None, "mlp"), lead=(self.n_dir,))
        _, bias = initializers.dense(self.init_scheme, r)
        self.gk_b = self._dir_p("gk_b", bias, (dk,), ("mlp",), group=True)

    def _gates(self, d, x, mask):
        gk = self._mm(self._mm(x, self.gk_w1[d]), self.gk_w2[d]) + self.gk_b[d]
        gk = jax.nn.log_sigmoid(gk) / self.gate_logit_normalizer
        return {"log_decay": _where(mask, self._heads(gk, self.head_k))}

    def _kernel(self, q, k, v, state, log_decay):
        return _run(lr.gated_linear_attention, lr.gated_linear_attention_step, q, k, v, state,
                    self.chunk_size, log_decay)


class RetNetMixer(_QKVMixer):
    """Retention (RetNet, Sun et al. 2023), multi-scale: head h decays by the fixed
    γ_h = 1 − 2^(−5−h). Fields: n_heads (8), expand_k (1), expand_v (2), use_short_conv (True),
    d_conv (4), use_output_gate (True: SiLU gate), norm_eps, chunk_size, dtype, init_scheme.
    No xPos rotary positions (the short convolution carries local order)."""
    n_heads: int = 8
    expand_v: float = 2.0
    _kind = "retnet"

    def _gates(self, d, x, mask):
        gamma = 1.0 - 2.0 ** (-5.0 - np.arange(self.n_heads, dtype=np.float64))
        log_decay = jnp.broadcast_to(jnp.asarray(np.log(gamma), jnp.float32),
                                     x.shape[:2] + (self.n_heads,))
        return {"log_decay": _where(mask, log_decay)}

    def _kernel(self, q, k, v, state, log_decay):
        return _run(lr.gated_linear_attention, lr.gated_linear_attention_step, q, k, v, state,
                    self.chunk_size, log_decay)


class DeltaNetMixer(_QKVMixer):
    """DeltaNet (Schlag et al. 2021; chunked as in Yang et al. 2024): the delta rule with
    β = sigmoid(W_β x) per head; q, k SiLU then L2-normalised. Fields: n_heads (4), expand_k
    (1), expand_v (1), use_short_conv (True), d_conv (4), use_output_gate (False: fla's default;
    True adds the SiLU gate), norm_eps, chunk_size, dtype, init_scheme. b_proj per direction."""
    use_output_gate: bool = False
    _kind = "deltanet"
    qk_l2norm = True

    def _gate_setup(self):
        self.b_proj = self._w("b_proj", self.d_model, self.n_heads, ("embed", "heads"),
                              lead=(self.n_dir,))

    def _beta(self, d, x, mask):
        return _where(mask, jax.nn.sigmoid(self._mm(x, self.b_proj[d])))

    def _gates(self, d, x, mask):
        return {"beta": self._beta(d, x, mask)}

    def _kernel(self, q, k, v, state, beta):
        return _run(lr.delta_rule, lr.delta_rule_step, q, k, v, state, self.chunk_size, beta,
                    None)


class GatedDeltaNetMixer(DeltaNetMixer):
    """Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025): the delta rule with a scalar decay α per
    head, log α = −exp(A_log) · softplus(W_α x + dt_bias) (Mamba-2's). Fields: n_heads (4),
    expand_k (0.75), expand_v (1.5) (fla's allocation: 0.75 d for q and k, 1.5 d for v and the
    gate), use_short_conv (True), d_conv (4), use_output_gate (True), allow_neg_eigval (False:
    True doubles β, eigenvalues of the transition in [−1, 1]), A_init_min / A_init_max (1, 16),
    dt_min / dt_max / dt_init_floor, norm_eps, chunk_size, dtype, init_scheme.
    b_proj, a_proj per direction (default); A_log, dt_bias per direction ("ssm")."""
    expand_k: float = 0.75
    expand_v: float = 1.5
    use_output_gate: bool = True
    allow_neg_eigval: bool = False
    A_init_min: float = 1.0
    A_init_max: float = 16.0
    dt_min: float = 1e-3
    dt_max: float = 1e-1
    dt_init_floor: float = 1e-4
    _kind = "gated_deltanet"

    def _gate_setup(self):
        super()._gate_setup()
        h = self.n_heads
        self.a_proj = self._w("a_proj", self.d_model, h, ("embed", "heads"), lead=(self.n_dir,))
        self.A_log = self._dir_p("A_log", uniform_log_init(self.A_init_min, self.A_init_max),
                                 (h,), ("heads",), group=True)
        self.dt_bias = self._dir_p("dt_bias", dt_bias_init(self.dt_min, self.dt_max,
                                                           self.dt_init_floor),
                                   (h,), ("heads",), group=True)

    def _gates(self, d, x, mask):
        beta = self._beta(d, x, mask) * (2.0 if self.allow_neg_eigval else 1.0)
        dt = jax.nn.softplus(self._mm(x, self.a_proj[d]) + self.dt_bias[d])
        return {"beta": beta, "log_alpha": _where(mask, -jnp.exp(self.A_log[d]) * dt)}

    def _kernel(self, q, k, v, state, beta, log_alpha):
        return _run(lr.delta_rule, lr.delta_rule_step, q, k, v, state, self.chunk_size, beta,
                    log_alpha)


class MLSTMMixer(_LinearRNN):
    """mLSTM (xLSTM, Beck et al. 2024), the pre-up-projection block: x_up, z = W_up x
    (d_inner = expand · d_model each); c = SiLU(conv(x_up)); q = W_q c, k = W_k c, v = W_v x_up;
    ĩ, f̃ = W_if [q, k, v] + b per head; h = mLSTM(q, k / √d_h, v, ĩ, f̃); h = LayerNorm_head(h)
    + skip ⊙ c; out = W_down(h ⊙ SiLU(z)). Fields: n_heads (4), expand (2), use_short_conv
    (True; False: c = SiLU(x_up)), d_conv (4), norm_eps, chunk_size, dtype, init_scheme.

    q/k/v are dense (xLSTM uses block-diagonal ones of block 4). Gate weights start at zero, the
    input-gate bias ~ N(0, 0.1), the forget-gate bias linspace(3, 6) over the heads (xLSTM's);
    both biases "ssm". Per direction: conv_w, skip, gate weights and biases.
    """
    n_heads: int = 4
    expand: float = 2.0
    use_short_conv: bool = True
    d_conv: int = 4
    _kind = "mlstm"

    @property
    def d_inner(self):
        return self._dim(self.expand, "expand")

    @property
    def head_k(self):
        return self.d_inner // self.n_heads

    head_v = head_k

    def setup(self):
        d, di, h = self.d_model, self.d_inner, self.n_heads
        self.up_proj = self._w("up_proj", d, 2 * di)
        self.q_proj = self._w("q_proj", di, di, ("mlp", None))
        self.k_proj = self._w("k_proj", di, di, ("mlp", None))
        self.v_proj = self._w("v_proj", di, di, ("mlp", None))
        if self.use_short_conv:
            self.conv_w = self._conv_param(di)
        self.gate_w = self._dir_p("gate_w", nn.initializers.zeros, (3 * di, 2 * h),
                                  ("mlp", "heads"))
        ig = lambda key, shape, dtype=jnp.float32: 0.1 * jax.random.normal(key, shape, dtype)
        self.igate_b = self._dir_p("igate_b", ig, (h,), ("heads",), group=True)
        self.fgate_b = self._dir_p("fgate_b", const(np.linspace(3.0, 6.0, h)), (h,), ("heads",),
                                   group=True)
        self.skip = self._dir_p("skip", nn.initializers.ones, (di,), ("mlp",))
        self.norm_scale = self.param("norm_scale", boxed(nn.initializers.ones, ("norm",)),
                                     (di,), jnp.float32)
        self.drop = nn.Dropout(self.dropout)
        self.out_proj = self._w("out_proj", di, d, ("mlp", "embed"))

    def _direction(self, d, x_up, mask, state):
        conv = None if state is None else state.get("conv")
        if self.use_short_conv:
            c, conv = self._short_conv(x_up, self.conv_w[d], conv)
        else:
            c = jax.nn.silu(x_up)
        c = _where(mask, c)
        q, k, v = self._mm(c, self.q_proj), self._mm(c, self.k_proj), self._mm(x_up,
                                                                              self.v_proj)
        ifg = self._mm(jnp.concatenate([q, k, v], -1), self.gate_w[d])
        i_pre, f_pre = jnp.split(ifg, 2, axis=-1)
        i_pre = _where(mask, i_pre + self.igate_b[d], _GATE_OFF)
        f_pre = _where(mask, f_pre + self.fgate_b[d], _FORGET_KEEP)
        hk = self.head_k
        q, k, v = (self._heads(a, hk) for a in (q, k, v))
        k = k * hk ** -0.5
        if state is None:
            h, _ = lr.mlstm(q, k, v, i_pre, f_pre, chunk_size=self.chunk_size)
            new = None
        else:
            h, rnn = lr.mlstm_step(q[:, 0], k[:, 0], v[:, 0], i_pre[:, 0], f_pre[:, 0],
                                   (state["C"], state["n"], state["m"]))
            h = h[:, None]
            new = dict(zip(("C", "n", "m"), rnn))
            if conv is not None:
                new["conv"] = conv
        return (h, c * self.skip[d]), new

    def _forward(self, x, mask, state):
        x_up, z = jnp.split(self._mm(x, self.up_proj), 2, axis=-1)
        (h, skip), state = self._both(self._direction, _where(mask, x_up), mask=mask,
                                      state=state)
        # LayerNorm per head (xLSTM's MultiHeadLayerNorm: no bias), one scale over d_inner.
        mu = jnp.mean(h, -1, keepdims=True)
        h = (h - mu) * jax.lax.rsqrt(jnp.var(h, -1, keepdims=True) + self.norm_eps)
        h = h.reshape(h.shape[:-2] + (self.d_inner,)) * self.norm_scale + skip
        return h * jax.nn.silu(z), state

    def _state_shapes(self, batch_size):
        b, h, dh = batch_size, self.n_heads, self.head_k
        shapes = {"C": (b, h, dh, dh), "n": (b, h, dh), "m": (b, h)}
        if self.use_short_conv:
            shapes["conv"] = (b, self.d_conv - 1, self.d_inner)
        return shapes


def _lora_rank(d_model, mult, factor=1.0):
    """fla's default low-rank width: max(32, round(mult · √d · factor / 32) · 32)."""
    return max(32, int(round(mult * d_model ** 0.5 * factor / 32) * 32))


class RWKV7Mixer(_LinearRNN):
    """RWKV-7 "Goose" time mixing (Peng et al. 2025). Heads of width head_dim (64; must divide
    d_model); key and value width d_model.

    Token shift: x_* = x + (x_{t−1} − x_t) ⊙ μ_* for * in r, w, k, v, a, g; r, k, v = W x_*;
    w = exp(−e^{−1/2} σ(LoRA_w(x_w))) per key channel; a = σ(LoRA_a(x_a)) the in-context
    learning rate; κ̂ = L2norm_head(k ⊙ k_k); k ← k ⊙ (1 + (a − 1) ⊙ k_a); the state update in
    the module docstring (the kernel's a = −κ̂ reads, b = κ̂ ⊙ a writes); o = GroupNorm_head(Sᵀ r)
    + (Σ r ⊙ k ⊙ r_k) v per head, times g = σ(LoRA_g(x_g)), then W_o.
    Fields: head_dim (64), decay_low_rank_dim / a_low_rank_dim / gate_low_rank_dim (0 = fla's
    default max(32, round(c · √d / 32) · 32), c = 2.5, 2.5, 5), norm_eps, chunk_size, dtype,
    init_scheme. Per direction (the reversed pass shifts in x_{t+1}): μ, the LoRAs, k_k, k_a,
    r_k; the decay bias w_b is "ssm".
    """
    head_dim: int = 64
    decay_low_rank_dim: int = 0
    a_low_rank_dim: int = 0
    gate_low_rank_dim: int = 0
    _kind = "rwkv7"

    @property
    def n_rwkv_heads(self):
        if self.d_model % self.head_dim:
            raise ValueError(f"rwkv7: head_dim {self.head_dim} does not divide d_model "
                             f"{self.d_model}")
        return self.d_model // self.head_dim

    def _rank(self, given, mult):
        return given or _lora_rank(self.d_model, mult, self.head_dim / 64)

    def setup(self):
        d, hd, h = self.d_model, self.head_dim, self.n_rwkv_heads
        nd = self.n_dir
        # Initial values: fla's at the middle of a deep stack (ratio_0_to_1 = 0.5,
        # ratio_1_to_almost0 = 0.5), since a mixer does not know its depth.
        n = np.arange(d)
        ddd = n / d
        linear = n / max(d - 1, 1) - 0.5
        zig = ((n % hd) - (hd - 1) / 2) / max((hd - 1) / 2, 1e-9)
        zig = zig * np.abs(zig)
        www = -6 + 6 * (n / max(d - 1, 1)) ** (1 + 0.5 ** 0.3)
        mu = np.stack([1 - ddd ** (p * 0.5) for p in (0.2, 0.9, 0.7, 0.7, 0.9, 0.2)])
        self.mu = self._dir_p("mu", const(mu), (6, d), (None, "embed"))
        rw, ra = self._rank(self.decay_low_rank_dim, 2.5), self._rank(self.a_low_rank_dim, 2.5)
        rg = self.gate_low_rank_dim or _lora_rank(d, 5)
        z = nn.initializers.zeros
        self.w_a = self._dir_p("w_a", z, (d, rw), ("embed", None))
        self.w_b_ = self._w("w_b_proj", rw, d, (None, "mlp"), lead=(nd,))
        self.w_bias = self._dir_p("w_bias", const(www + 0.5 + zig * 2.5), (d,), ("mlp",),
                                  group=True)
        self.a_a = self._dir_p("a_a", z, (d, ra), ("embed", None))
        self.a_b = self._w("a_b_proj", ra, d, (None, "mlp"), lead=(nd,))
        self.a_bias = self._dir_p("a_bias", const(-0.19 + zig * 0.3 + linear * 0.4), (d,),
                                  ("mlp",))
        self.g_a = self._dir_p("g_a", z, (d, rg), ("embed", None))
        self.g_b = self._w("g_b_proj", rg, d, (None, "mlp"), lead=(nd,))
        self.k_k = self._dir_p("k_k", const(0.71 - linear * 0.1), (d,), ("mlp",))
        self.k_a = self._dir_p("k_a", const(np.full(d, 1.02)), (d,), ("mlp",))
        self.r_k = self._dir_p("r_k", const(np.full((h, hd), -0.04)), (h, hd), ("heads", None))
        self.r_proj = self._w("r_proj", d, d)
        self.k_proj = self._w("k_proj", d, d)
        self.v_proj = self._w("v_proj", d, d)
        self.norm_scale = self.param("norm_scale", boxed(nn.initializers.ones, ("norm",)),
                                     (d,), jnp.float32)
        self.norm_bias = self.param("norm_bias", boxed(nn.initializers.zeros, ("norm",)),
                                    (d,), jnp.float32)
        self.drop = nn.Dropout(self.dropout)
        self.out_proj = self._w("out_proj", d, d, ("mlp", "embed"))

    def _lora(self, x, a, b, act):
        """b(act(x a)): fla's LoRA without the bias (added by the caller)."""
        return self._mm(act(self._mm(x, a)), b)

    def _direction(self, d, x, mask, state):
        prev = None if state is None else state["shift"]
        if prev is None:
            shifted = jnp.pad(x, ((0, 0), (1, 0), (0, 0)))[:, :-1]
        else:
            shifted = prev[:, None]
        mix = x[:, :, None] + (shifted - x)[:, :, None] * self.mu[d]  # [b, l, 6, d]
        xr, xw, xk, xv, xa, xg = (mix[:, :, i] for i in range(6))
        r, k, v = self._mm(xr, self.r_proj), self._mm(xk, self.k_proj), self._mm(xv,
                                                                                self.v_proj)
        log_w = -math.exp(-0.5) * jax.nn.sigmoid(
            self._lora(xw, self.w_a[d], self.w_b_[d], jnp.tanh) + self.w_bias[d])
        a = jax.nn.sigmoid(self._lora(xa, self.a_a[d], self.a_b[d], lambda t: t) +
                           self.a_bias[d])
        g = self._lora(xg, self.g_a[d], self.g_b[d], jax.nn.sigmoid)
        kk = _l2norm(self._heads_rw(k * self.k_k[d]))
        k = k * (1 + (a - 1) * self.k_a[d])
        r, k, v, a, log_w = (self._heads_rw(t) for t in (r, k, v, a, log_w))
        k, v = _where(mask, k), _where(mask, v)
        # the kernel's S_t = (diag(w_t) + b_t a_tᵀ) S_{t-1} + k_t v_tᵀ: a = −κ̂ reads the state,
        # b = κ̂ ⊙ a writes it back (fla's convention)
        read, write = _where(mask, -kk), _where(mask, kk * a)
        log_w = _where(mask, log_w)
        o, rnn = _run(lr.rwkv7, lr.rwkv7_step, r, k, v, None if state is None else
                      state["rnn"], self.chunk_size, log_w, read, write)
        # GroupNorm with one group per head (eps head_dim · norm_eps, as fla), the "bonus"
        # r·(r_k ⊙ k) v of the current token, the gate.
        mu = jnp.mean(o, -1, keepdims=True)
        o = (o - mu) * jax.lax.rsqrt(jnp.var(o, -1, keepdims=True) +
                                     self.head_dim * self.norm_eps)
        o = o.reshape(o.shape[:-2] + (self.d_model,)) * self.norm_scale + self.norm_bias
        bonus = jnp.sum(r * k * self.r_k[d], -1, keepdims=True) * v
        new = None if state is None else {"shift": x[:, -1], "rnn": rnn}
        return (o + bonus.reshape(o.shape)) * g, new

    def _heads_rw(self, t):
        return t.reshape(t.shape[:-1] + (self.n_rwkv_heads, self.head_dim))

    def _forward(self, x, mask, state):
        return self._both(self._direction, x, mask=mask, state=state)

    def _state_shapes(self, batch_size):
        h, hd = self.n_rwkv_heads, self.head_dim
        return {"shift": (batch_size, self.d_model), "rnn": (batch_size, h, hd, hd)}


__all__ = ["GLAMixer", "RetNetMixer", "DeltaNetMixer", "GatedDeltaNetMixer", "MLSTMMixer",
           "RWKV7Mixer"]
