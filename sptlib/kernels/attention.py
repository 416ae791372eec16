"""Attention kernels (pure jnp): plain, exact memory-efficient (chunked), local (banded), rotary.

`q, k, v` are `[batch, length, heads, head_dim]` with `q` already scaled; `key_mask` is
`[batch, length]` (True = real). Every function computes the same softmax attention restricted
by the key mask, an optional causal mask and an optional band `|q - k| <= window`
(`0 <= q - k <= window` when causal); they differ in memory (see `sptlib.layers.attention`).
The Linen mixer is `sptlib.layers.attention.MultiHeadAttention`.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax

# A large finite negative score: exp() of it underflows to exactly 0, and unlike -inf it never yields
# inf - inf = NaN in the online softmax (fully masked chunks, fully masked padding rows).
MASK_VALUE = -1e30



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

def allowed_pairs(q_pos, k_pos, causal, window):
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
        scores = jnp.where(allowed_pairs(pos, pos, causal, window), scores, MASK_VALUE)
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
    allowed = allowed_pairs(i * c + pos, j * c + pos, causal, window)
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
