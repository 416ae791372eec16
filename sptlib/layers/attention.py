"""Multi-head self-attention: plain, exact memory-efficient (chunked), and local (banded).

All three implementations compute the same function — softmax attention restricted by a key-padding
mask, an optional causal mask and an optional band `|q - k| <= window` (`0 <= q - k <= window` when
causal) — and differ only in memory:

- ``plain``: one `[batch, heads, length, length]` score matrix; fastest for short sequences (on CPU a
  hand einsum softmax ran ~1.45× faster than `jax.nn.dot_product_attention` at L=2048, with
  identical outputs).
- ``chunked``: exact online softmax over query and key chunks (Rabe & Staats 2021) with the
  FlashAttention-2 backward (a `jax.custom_vjp` that saves only the output and per-row softmax
  statistics and recomputes probabilities block by block), so forward *and* backward memory grow
  linearly with length.
- ``local``: the chunked kernel visiting only the key chunks that intersect the band, so time and
  memory are O(length · window) — for PathX (16,384) and PathX-256 (65,536).

Positions: ``rotary`` (applied to queries and keys, so scores depend on relative position only) or
``none`` (absolute positions, if any, are added by the encoder: `config.model.positions`).
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from sptlib.layers import inits

# A large finite negative score: exp() of it underflows to exactly 0, and unlike -inf it never yields
# inf - inf = NaN in the online softmax (fully masked chunks, fully masked padding rows).
MASK_VALUE = -1e30

IMPLS = ("plain", "chunked", "local")
POSITIONS = ("none", "rotary")


# ---------------------------------------------------------------------------------------------
# Positions
# ---------------------------------------------------------------------------------------------

def rotary_embedding(x, positions, base=10000.0):
    """Rotates feature pairs of `x` by position-dependent angles (RoFormer, half-split layout).

    Args:
      x: `[..., head_dim]` queries or keys (head_dim even).
      positions: integer/float positions broadcastable to `x.shape[:-1]`, e.g. `[length, 1]` for
        `x[batch, length, heads, head_dim]`, or a scalar for one decoding step `x[batch, heads, hd]`.
      base: wavelength base of the angle frequencies.
    Returns:
      Array like `x`; `<rot(q, i), rot(k, j)>` depends on `i - j` only.
    """
    half = x.shape[-1] // 2
    if 2 * half != x.shape[-1]:
        raise ValueError(f"rotary positions need an even head_dim, got {x.shape[-1]}")
    freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = jnp.asarray(positions, jnp.float32)[..., None] * freq
    sin, cos = jnp.sin(angles), jnp.cos(angles)
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


# ---------------------------------------------------------------------------------------------
# Attention kernels: q, k, v are [batch, length, heads, head_dim]; q is already scaled.
# ---------------------------------------------------------------------------------------------

def _allowed(q_pos, k_pos, causal, window):
    """Boolean `[len_q, len_k]` of (query, key) pairs allowed by the causal mask and the band."""
    diff = q_pos[:, None] - k_pos[None, :]
    allowed = jnp.ones(diff.shape, bool)
    if causal:
        allowed &= diff >= 0
    if window:
        allowed &= (diff <= window) if causal else (jnp.abs(diff) <= window)
    return allowed


def dot_product_attention(q, k, v, key_mask=None, *, causal=False, window=0):
    """Plain softmax attention with one full score matrix.

    Args:
      q, k, v: `[batch, length, heads, head_dim]` (q pre-scaled by 1/sqrt(head_dim)).
      key_mask: bool `[batch, length]`, True at real keys; padding keys get weight exactly 0.
      causal: query i sees keys j <= i only.
      window: if > 0, query i sees keys with |i - j| <= window (0 <= i - j <= window if causal).
    Returns:
      `[batch, length, heads, head_dim]` in v's dtype.
    """
    length = q.shape[1]
    # Head-major operands ([b, h, l, d]) make both products plain batched matmuls; on XLA:CPU
    # this was ~4% of the quickstart Transformer's train step (CPU time, interleaved A/B).
    q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32)
    # Only the masks that apply, each broadcast where it is used.
    if causal or window:
        pos = jnp.arange(length)
        scores = jnp.where(_allowed(pos, pos, causal, window), scores, MASK_VALUE)
    if key_mask is not None:
        scores = jnp.where(key_mask[:, None, None, :], scores, MASK_VALUE)
    weights = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhqk,bhkd->bqhd", weights.astype(v.dtype), v,
                      preferred_element_type=jnp.float32).astype(v.dtype)


def chunked_attention(q, k, v, key_mask=None, *, causal=False, window=0, chunk_size=512):
    """Exact softmax attention by an online softmax over query and key chunks.

    Equal to `dot_product_attention` (up to float rounding) for the same arguments. The forward is
    the online softmax of Rabe & Staats (2021); the backward is FlashAttention-2's (a
    `jax.custom_vjp`): only the output and the per-row softmax statistics (running max and
    normaliser, `[batch, heads, length]`) are saved, the probabilities are recomputed one
    `[chunk, chunk]` block at a time, dK/dV are accumulated per key chunk and dQ per query chunk.
    Forward and backward memory are therefore O(length · head_dim) plus one score block per head,
    not O(length²).

    With `window > 0` only the `2·ceil(window/chunk)+1` key chunks around each query chunk (the
    `ceil(window/chunk)+1` at and before it when causal) are visited: O(length · window) time.
    Key chunks wholly in the future of a causal query chunk are skipped (`lax.cond`), in the forward
    and in the backward.
    Lengths that are not a multiple of `chunk_size` are padded internally with masked keys.

    Args and return value as `dot_product_attention`, plus
      chunk_size: queries and keys per chunk.
    """
    batch, length, heads, head_dim = q.shape
    c = max(1, min(chunk_size, length))
    n = -(-length // c)
    padded = n * c
    if key_mask is None:
        key_mask = jnp.ones((batch, length), bool)
    if padded != length:
        pad = [(0, 0), (0, padded - length), (0, 0), (0, 0)]
        q, k, v = jnp.pad(q, pad), jnp.pad(k, pad), jnp.pad(v, pad)
        key_mask = jnp.pad(key_mask, [(0, 0), (0, padded - length)])
    # [n, batch, heads, c, head_dim]: chunk axis first (scanned / indexed), then batch-major
    # matrices so every block product is a plain batched matmul.
    split = lambda a: a.reshape(batch, n, c, heads, head_dim).transpose(1, 0, 3, 2, 4)
    mc = key_mask.reshape(batch, n, c).swapaxes(0, 1)
    out = _flash_attention(split(q), split(k), split(v), mc, causal, int(window))
    out = out.transpose(1, 0, 3, 2, 4).reshape(batch, padded, heads, head_dim)
    return out[:, :length]


def _chunk_plan(n, c, causal, window):
    """Key-chunk offsets visited per query chunk and whether they are relative to it."""
    if window:
        reach = -(-window // c)  # key chunks needed on each side of the query chunk
        return jnp.arange(-reach, 1 if causal else reach + 1), True
    return jnp.arange(n), False  # every key chunk, by absolute index


def _block_allowed(i, j, valid, m_j, c, causal, window):
    """Bool `[batch, 1, c, c]`: allowed (query, key) pairs of query chunk i and key chunk j."""
    pos = jnp.arange(c)
    allowed = _allowed(i * c + pos, j * c + pos, causal, window)
    # A clamped out-of-range chunk index must count for nothing (never visited anyway: lax.cond).
    return (allowed & valid)[None, None] & m_j[:, None, None, :]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _flash_attention(qc, kc, vc, mc, causal, window):
    """Chunked attention on `[n, batch, heads, c, head_dim]` chunks; `mc` bool `[n, batch, c]`."""
    return _flash_forward(qc, kc, vc, mc, causal, window)[0]


def _flash_forward(qc, kc, vc, mc, causal, window):
    """Online-softmax forward. Returns the output chunks and the row statistics (max, sum)."""
    n, batch, heads, c, head_dim = qc.shape
    offsets, relative = _chunk_plan(n, c, causal, window)

    def query_chunk(_, xs):
        q_i, i = xs

        def update(j, valid, carry):
            acc, m, l = carry
            k_j, v_j, m_j = (lax.dynamic_index_in_dim(a, j, keepdims=False) for a in (kc, vc, mc))
            s = jnp.einsum("bhqd,bhkd->bhqk", q_i, k_j, preferred_element_type=jnp.float32)
            s = jnp.where(_block_allowed(i, j, valid, m_j, c, causal, window), s, MASK_VALUE)
            m_new = jnp.maximum(m, s.max(axis=-1))
            correction = jnp.exp(m - m_new)
            p = jnp.exp(s - m_new[..., None])
            l = l * correction + p.sum(axis=-1)
            acc = acc * correction[..., None] + jnp.einsum(
                "bhqk,bhkd->bhqd", p.astype(v_j.dtype), v_j, preferred_element_type=jnp.float32)
            return acc, m_new, l

        def step(carry, offset):
            j = i + offset if relative else offset
            valid = (j >= 0) & (j < n)
            # Chunks out of range or wholly in the future are skipped (half the work when causal).
            needed = valid & (j <= i) if causal else valid
            jc = jnp.clip(j, 0, n - 1)
            return lax.cond(needed, functools.partial(update, jc, valid),
                            lambda carry: carry, carry), None

        init = (jnp.zeros((batch, heads, c, head_dim), jnp.float32),
                jnp.full((batch, heads, c), MASK_VALUE, jnp.float32),
                jnp.zeros((batch, heads, c), jnp.float32))
        # Every query chunk visits its own chunk, whose max contributes exp(0) = 1: l >= 1.
        (acc, m, l), _ = lax.scan(step, init, offsets)
        return None, ((acc / l[..., None]).astype(vc.dtype), m, l)

    _, (out, m, l) = lax.scan(query_chunk, None, (qc, jnp.arange(n)))
    return out, m, l


def _flash_fwd(qc, kc, vc, mc, causal, window):
    out, m, l = _flash_forward(qc, kc, vc, mc, causal, window)
    return out, (qc, kc, vc, mc, out, m, l)


def _flash_bwd(causal, window, residuals, d_out):
    """FlashAttention-2 backward: one pass over key chunks, each over the query chunks it meets.

    Per (query chunk i, key chunk j) block, with `p = exp(s - m) / l` recomputed and
    `delta = rowsum(dO * O)`: `dV_j += pᵀ dO_i`, `ds = p * (dO_i V_jᵀ - delta)`, `dK_j += dsᵀ Q_i`,
    `dQ_i += ds K_j`. dK/dV live in the inner loop's carry. dQ (float32, kept transposed as
    `[n, batch, heads, head_dim, c]` until the end) is summed in the outer carry: without a
    window each key chunk emits the dQ of all query chunks (stacked, then added); with a window
    only the few chunks around j are met, so they are updated in place.
    """
    qc, kc, vc, mc, out, m, l = residuals
    n, batch, heads, c, head_dim = qc.shape
    offsets, relative = _chunk_plan(n, c, causal, window)
    d_out = d_out.astype(jnp.float32)
    delta = jnp.sum(d_out * out.astype(jnp.float32), axis=-1)  # [n, batch, heads, c]
    inv_l = 1.0 / l
    do_c = d_out.astype(vc.dtype)  # matmul operands in the input dtype, products in float32
    zero = jnp.zeros((batch, heads, c, head_dim), jnp.float32)
    zero_t = jnp.zeros((batch, heads, head_dim, c), jnp.float32)

    def key_chunk(dq, xs):
        k_j, v_j, m_j, j = xs

        def block(i, valid, dk, dv):
            """Adds block (i, j) to dK_j, dV_j; returns them and its dQ_iᵀ contribution."""
            q_i, do_i, m_i, inv_l_i, delta_i = (lax.dynamic_index_in_dim(a, i, keepdims=False)
                                                for a in (qc, do_c, m, inv_l, delta))
            # Key-major blocks ([.., key, query]) so that every product contracts the last axis
            # of its left operand: XLA:CPU runs the other dot forms several times slower.
            s = jnp.einsum("bhkd,bhqd->bhkq", k_j, q_i, preferred_element_type=jnp.float32)
            allowed = _block_allowed(i, j, valid, m_j, c, causal, window).swapaxes(-1, -2)
            s = jnp.where(allowed, s, MASK_VALUE)
            p = jnp.exp(s - m_i[..., None, :]) * inv_l_i[..., None, :]
            dv = dv + jnp.einsum("bhkq,bhqd->bhkd", p.astype(do_i.dtype), do_i,
                                 preferred_element_type=jnp.float32)
            dp = jnp.einsum("bhkd,bhqd->bhkq", v_j, do_i, preferred_element_type=jnp.float32)
            # Masked scores get no gradient (they were replaced by a constant), even in a fully
            # masked row where p is uniform rather than 0.
            ds = jnp.where(allowed, p * (dp - delta_i[..., None, :]), 0.0)
            dk = dk + jnp.einsum("bhkq,bhqd->bhkd", ds.astype(q_i.dtype), q_i,
                                 preferred_element_type=jnp.float32)
            dq_t = jnp.einsum("bhkd,bhkq->bhdq", k_j,
                              ds.astype(k_j.dtype), preferred_element_type=jnp.float32)
            return dk, dv, dq_t

        def step(carry, offset):
            # The query chunks that visited key chunk j in the forward (same skipping rule).
            i = j - offset if relative else offset
            valid = (i >= 0) & (i < n)
            needed = valid & (j <= i) if causal else valid
            ic = jnp.clip(i, 0, n - 1)
            if not relative:  # i = offset: emit dQ_i, stacked in query-chunk order
                dk, dv, dq_i = lax.cond(needed, lambda dk, dv: block(ic, valid, dk, dv),
                                        lambda dk, dv: (dk, dv, zero_t), *carry)
                return (dk, dv), dq_i

            def update(carry):
                dk, dv, dq = carry
                dk, dv, dq_i = block(ic, valid, dk, dv)
                dq_i = dq_i + lax.dynamic_index_in_dim(dq, ic, keepdims=False)
                return dk, dv, lax.dynamic_update_index_in_dim(dq, dq_i, ic, 0)

            return lax.cond(needed, update, lambda carry: carry, carry), None

        if relative:
            (dk, dv, dq), _ = lax.scan(step, (zero, zero, dq), offsets)
        else:
            (dk, dv), dq_j = lax.scan(step, (zero, zero), offsets)
            dq = dq + dq_j
        return dq, (dk.astype(kc.dtype), dv.astype(vc.dtype))

    dq, (dk, dv) = lax.scan(key_chunk, jnp.zeros((n, batch, heads, head_dim, c), jnp.float32),
                            (kc, vc, mc, jnp.arange(n)))
    return dq.swapaxes(-1, -2).astype(qc.dtype), dk, dv, None


_flash_attention.defvjp(_flash_fwd, _flash_bwd)


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
      impl: ``plain`` | ``chunked`` | ``local`` (see the module docstring).
      window: band half-width; 0 = unlimited (required > 0 for ``local``).
      chunk_size: chunk length of the chunked/local kernels.
      rotary_base: wavelength base of rotary positions.
      dtype: compute dtype of projections (scores and softmax always run in float32).
      init_scheme: ``linen`` | ``torch`` kernel initialisation (`sptlib.layers.inits`).
    """
    d_model: int
    causal: bool = False
    dropout: float = 0.0
    n_heads: int = 4
    head_dim: int = 0
    positions: str = "none"
    impl: str = "plain"
    window: int = 0
    chunk_size: int = 512
    rotary_base: float = 10000.0
    dtype: Any = jnp.float32
    init_scheme: str = "linen"

    def setup(self):
        if self.impl not in IMPLS:
            raise ValueError(f"attention impl {self.impl!r} not in {IMPLS}")
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
        in_init = inits.attention_in(self.init_scheme, self.d_model, self.n_heads * hd)
        out_init, _ = inits.dense(self.init_scheme, self.n_heads * hd, in_axis=(0, 1), out_axis=2)
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
        q, k, v = (jnp.einsum("...d,dhk->...hk", x, w.astype(self.dtype)) + b.astype(self.dtype)
                   for w, b in ((self.w_query, self.b_query), (self.w_key, self.b_key),
                                (self.w_value, self.b_value)))
        return q * (self._head_dim ** -0.5), k, v

    def _output(self, o, deterministic):
        """Attended values `[..., heads, head_dim]` -> `[..., d_model]`."""
        o = self.drop(o, deterministic=deterministic)
        y = jnp.einsum("...hk,hkd->...d", o, self.w_out.astype(self.dtype))
        return y + self.b_out.astype(self.dtype)

    def __call__(self, x, *, mask=None, deterministic=True):
        """x `[batch, length, d_model]`, mask bool `[batch, length]` -> `[batch, length, d_model]`."""
        q, k, v = self._project(x)
        if self.positions == "rotary":
            pos = jnp.arange(x.shape[1])[:, None]  # broadcasts over heads
            q = rotary_embedding(q, pos, self.rotary_base)
            k = rotary_embedding(k, pos, self.rotary_base)
        if self.impl == "plain":
            o = dot_product_attention(q, k, v, mask, causal=self.causal, window=self.window)
        else:
            o = chunked_attention(q, k, v, mask, causal=self.causal, window=self.window,
                                  chunk_size=self.chunk_size)
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
        allowed = _allowed(index[None], jnp.arange(keys.shape[1]), True, self.window)[0]
        scores = jnp.where(allowed, scores, MASK_VALUE)
        weights = jax.nn.softmax(scores, axis=-1)
        o = jnp.einsum("bhm,bmhd->bhd", weights.astype(values.dtype), values,
                       preferred_element_type=jnp.float32).astype(self.dtype)
        y = self._output(o, deterministic=True)
        return y, dict(key=keys, value=values, index=index + 1)
