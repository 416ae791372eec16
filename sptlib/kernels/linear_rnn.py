"""Linear RNNs with a matrix state, pure jnp: gated linear attention, the (gated) delta rule,
RWKV-7's generalised delta rule and the xLSTM mLSTM, each in chunkwise-parallel form.

One layout for all of them, per head h:

    q, k `[batch, length, heads, d_k]`, v `[batch, length, heads, d_v]`,
    state S `[batch, heads, d_k, d_v]`,   output o_t = S_tᵀ q_t  (o[b, t, h] = q[b, t, h] @ S_t[b, h]).

The recurrences (α = exp(log α) etc.; all gates are *log* gates, <= 0 where they are decays):

    GLA / RetNet / linear attention   S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ
    delta rule (Gated DeltaNet)       S_t = α_t (I - β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ
    RWKV-7                            S_t = (diag(w_t) + b_t a_tᵀ) S_{t-1} + k_t v_tᵀ
    mLSTM                             C_t = f_t C_{t-1} + i_t k_t v_tᵀ,  n_t = f_t n_{t-1} + i_t k_t,
                                      h_t = C_tᵀ q_t / max(|n_tᵀ q_t|, 1)   (stabilised, see `mlstm`)

Chunkwise-parallel form (GLA, Yang et al. 2024; DeltaNet, Yang et al. 2024; Gated DeltaNet,
Yang et al. 2025): the sequence is cut into chunks of `chunk_size` steps. Within a chunk every
pairwise decay is exp(B_t - B_j) with B the chunk-local cumulative log gate, formed as a
difference of log gates masked to j <= t *before* the exp, so every exponent is <= 0 and
nothing overflows at any length or decay strength (products that underflow are ones whose
true value underflows). Per-key-dimension decays use secondary chunking (`_decayed_scores`):
between sub-chunks the factors are split at a reference point between the two sub-chunks
(both factors <= 1, so again no overflow), inside a sub-chunk the pairwise difference is formed
directly. The delta rules resolve the intra-chunk dependence with the UT / WY representation
(one unit-lower-triangular inverse per chunk, as log2(chunk) doubling matmuls); a `lax.scan`
over chunks carries the state.

Every function returns `(o, final_state)` with `o` float32 `[batch, length, heads, d_v]`
(float64 when the inputs are float64; bfloat16 inputs are computed in float32), takes
`initial_state=None` (zeros) and `chunk_size=64`. A length that is not a multiple of the chunk
is padded with identity steps (k = v = 0, log gates 0, β = 0, mLSTM input gate -inf), which
leave the state unchanged. No scale is applied (the mixer scales q). Each kernel has a one-step
form `*_step(..., state) -> (o_t, state)` (the recurrence, for decoding) and a sequential
reference `*_reference` (a `lax.scan` of the step; used by the tests).
"""

import math

import jax
import jax.numpy as jnp


# --------------------------------------------------------------------------- helpers

def _dtype(*xs):
    """float32 for bfloat16/float16/float32 inputs, float64 for float64 inputs."""
    return jnp.promote_types(jnp.result_type(*[x for x in xs if x is not None]), jnp.float32)


def _check_chunk(chunk_size):
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")


def _check_qkv(name_q, q, k, v):
    if q.ndim != 4 or k.shape != q.shape:
        raise ValueError(f"{name_q} and k must both be [batch, length, heads, d_k], got "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    if v.ndim != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be [batch, length, heads, d_v] with the batch, length and "
                         f"heads of {name_q} {tuple(q.shape)}, got {tuple(v.shape)}")


def _check_gate(name, g, q, per_dim):
    shapes = [q.shape[:3]] + ([q.shape] if per_dim else [])
    if tuple(g.shape) not in [tuple(s) for s in shapes]:
        want = " or ".join(str(tuple(s)) for s in shapes)
        raise ValueError(f"{name} must have shape {want} ([batch, length, heads]"
                         f"{' or [batch, length, heads, d_k]' if per_dim else ''}), "
                         f"got {tuple(g.shape)}")


def _state(initial_state, shape, dt, name="initial_state"):
    if initial_state is None:
        return jnp.zeros(shape, dt)
    if tuple(initial_state.shape) != tuple(shape):
        raise ValueError(f"{name} must be [batch, heads, d_k, d_v] = {tuple(shape)}, got "
                         f"{tuple(initial_state.shape)}")
    return initial_state.astype(dt)


def _chunk(x, c, dt, fill=0.0):
    """[batch, length, heads, ...] -> [batch, heads, n_chunks, c, ...], padded with `fill`."""
    b, l = x.shape[:2]
    n = -(-l // c)
    x = x.astype(dt)
    if n * c != l:
        x = jnp.pad(x, [(0, 0), (0, n * c - l)] + [(0, 0)] * (x.ndim - 2),
                    constant_values=fill)
    return jnp.moveaxis(x.reshape(b, n, c, *x.shape[2:]), 3, 1)


def _unchunk(o, length):
    """[batch, heads, n_chunks, c, d] -> [batch, length, heads, d]."""
    o = jnp.moveaxis(o, 1, 3)
    b, n, c = o.shape[:3]
    return o.reshape(b, n * c, *o.shape[3:])[:, :length]


def _tril(c, strict=False):
    i = jnp.arange(c)
    return i[:, None] > i[None, :] if strict else i[:, None] >= i[None, :]


def _pair_decay(cum, strict=False):
    """exp(cum_t - cum_j) masked to j <= t (j < t if strict), zero elsewhere: `[..., c, c]`.

    The difference is masked before the exp, so with non-increasing `cum` every exponent is
    <= 0; the masked (positive) ones never reach exp, nor its gradient."""
    c = cum.shape[-1]
    d = cum[..., :, None] - cum[..., None, :]
    return jnp.exp(jnp.where(_tril(c, strict), d, -jnp.inf))


def _sub_size(c):
    """The largest divisor of c not above ceil(sqrt(c)): balances the two parts' memory."""
    r = math.isqrt(c)
    r += r * r < c
    return next(s for s in range(min(r, c), 0, -1) if c % s == 0)


def _decayed_scores(x, y, px, qy, strict=False):
    """s[..., t, j] = Σ_d x[t, d] y[j, d] exp(px[t, d] - qy[j, d]) for j <= t (j < t if strict).

    x, px `[..., c, d]`, y, qy `[..., c, d]` -> `[..., c, c]`; zero above the diagonal.
    Requires px[t] <= qy[m] <= qy[j] for j <= m < t (cumulative sums of log decays <= 0, with px
    the inclusive or exclusive sum), so every factor formed below is <= 1.

    Secondary chunking: the chunk is split into sub-chunks of s steps. For a key sub-chunk J
    before a query sub-chunk I the decay factors at r_I = qy at the last step before I:
    exp(px_t - r_I) exp(r_I - qy_j), both <= 1, and the block is one matmul. Inside a sub-chunk
    the pairwise difference is formed (an `[s, s, d]` tensor per sub-chunk)."""
    *lead, c, d = x.shape
    if len(lead) != 1:
        # one leading axis: XLA:CPU (jax 0.10.2) segfaults running the float32 gradient of the
        # contractions below with leading axes (1, 2, 2); (4,) and (2, 2) run
        flat = [z.reshape(-1, c, d) for z in (x, y, px, qy)]
        return _decayed_scores(*flat, strict=strict).reshape(*lead, c, c)
    s = _sub_size(c)
    n = c // s
    xs, ys, pxs, qys = (z.reshape(*lead, n, s, d) for z in (x, y, px, qy))
    e = jnp.where(_tril(s, strict)[:, :, None], pxs[..., :, None, :] - qys[..., None, :, :],
                  -jnp.inf)
    diag = jnp.einsum("...td,...jd,...tjd->...tj", xs, ys, jnp.exp(e))  # [..., n, s, s]
    if n == 1:
        return diag.reshape(*lead, c, c)
    r = qys[..., :-1, -1, :]  # [..., n-1, d]: reference of query sub-chunk I = 1..n-1
    xt = xs[..., 1:, :, :] * jnp.exp(pxs[..., 1:, :, :] - r[..., :, None, :])
    before = jnp.arange(n - 1)[None, :] < jnp.arange(1, n)[:, None]  # key J < query I
    ee = jnp.where(before[:, :, None, None],
                   r[..., :, None, None, :] - qys[..., None, :-1, :, :], -jnp.inf)
    yt = ys[..., None, :-1, :, :] * jnp.exp(ee)  # [..., I, J, s, d]
    off = jnp.einsum("...itd,...ijsd->...itjs", xt, yt)  # [..., n-1, s, n-1, s]
    full = jnp.zeros((*lead, n, s, n, s), x.dtype).at[..., 1:, :, :-1, :].set(off)
    full = full + diag[..., :, :, None, :] * jnp.eye(n, dtype=x.dtype)[:, None, :, None]
    return full.reshape(*lead, c, c)


def _scan_time(step, xs, state):
    """lax.scan of `step(x_t..., state) -> (o_t, state)` over axis 1 (time) of every x."""
    def body(s, x):
        o, s = step(*x, s)
        return s, o
    state, o = jax.lax.scan(body, state, [None if x is None else jnp.moveaxis(x, 1, 0)
                                           for x in xs])
    return jnp.moveaxis(o, 0, 1), state


def _scan_chunks(body, carry, xs):
    """lax.scan over the chunk axis (2) of `[batch, heads, n, ...]` arrays."""
    carry, ys = jax.lax.scan(body, carry, [jnp.moveaxis(x, 2, 0) for x in xs])
    return carry, jax.tree.map(lambda y: jnp.moveaxis(y, 0, 2), ys)


def _mm(a, b):  # [..., i, j] @ [..., j, k]
    return jnp.einsum("...ij,...jk->...ik", a, b)


# --------------------------------------------------------------------------- GLA

def gated_linear_attention_step(q_t, k_t, v_t, log_decay_t, state):
    """One step of S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ, o_t = S_tᵀ q_t.

    Args:
      q_t, k_t: `[batch, heads, d_k]`; v_t: `[batch, heads, d_v]`.
      log_decay_t: `[batch, heads, d_k]`, `[batch, heads]` or None (no decay).
      state: `[batch, heads, d_k, d_v]`.

    Returns:
      (o_t `[batch, heads, d_v]`, state).
    """
    dt = _dtype(q_t, k_t, v_t, log_decay_t, state)
    q_t, k_t, v_t, state = (x.astype(dt) for x in (q_t, k_t, v_t, state))
    if log_decay_t is not None:
        g = jnp.exp(log_decay_t.astype(dt))
        state = state * (g[..., None] if g.ndim == q_t.ndim else g[..., None, None])
    state = state + k_t[..., :, None] * v_t[..., None, :]
    return jnp.einsum("bhk,bhkv->bhv", q_t, state), state


def gated_linear_attention_reference(q, k, v, log_decay=None, *, initial_state=None):
    """Sequential scan of `gated_linear_attention_step` (tests only): same contract as
    `gated_linear_attention`."""
    _check_qkv("q", q, k, v)
    if log_decay is not None:
        _check_gate("log_decay", log_decay, q, per_dim=True)
    dt = _dtype(q, k, v, log_decay)
    b, _, h, dk = q.shape
    s0 = _state(initial_state, (b, h, dk, v.shape[-1]), dt)
    if log_decay is None:
        return _scan_time(lambda q_t, k_t, v_t, s: gated_linear_attention_step(
            q_t, k_t, v_t, None, s), [q, k, v], s0)
    return _scan_time(gated_linear_attention_step, [q, k, v, log_decay], s0)


def gated_linear_attention(q, k, v, log_decay=None, *, chunk_size=64, initial_state=None):
    """Gated linear attention, chunkwise parallel: S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ,
    o_t = S_tᵀ q_t.

    One kernel for the decay family: `log_decay` `[batch, length, heads, d_k]` is GLA's
    data-dependent gate per key dimension; `[batch, length, heads]` a scalar per step and head
    (Mamba-2-like; RetNet's fixed per-head decay is a constant log γ_h broadcast over batch
    and length); None is plain causal linear attention. Log decays must be <= 0 (decays in
    (0, 1]): the chunk-local cumulative sums are then non-increasing and every exponent the
    kernel forms is <= 0, finite at any length and decay strength.

    Args:
      q, k: `[batch, length, heads, d_k]`; v: `[batch, length, heads, d_v]`.
      log_decay: see above, or None.
      chunk_size: steps per chunk (any positive int; the length is padded to a multiple).
      initial_state: `[batch, heads, d_k, d_v]` or None (zeros).

    Returns:
      (o `[batch, length, heads, d_v]`, final state `[batch, heads, d_k, d_v]`), float32
      (float64 for float64 inputs).
    """
    _check_chunk(chunk_size)
    _check_qkv("q", q, k, v)
    if log_decay is not None:
        _check_gate("log_decay", log_decay, q, per_dim=True)
    dt = _dtype(q, k, v, log_decay)
    b, l, h, dk = q.shape
    s0 = _state(initial_state, (b, h, dk, v.shape[-1]), dt)
    c = chunk_size
    qc, kc, vc = (_chunk(x, c, dt) for x in (q, k, v))  # [b, h, n, c, d]
    if log_decay is None:
        a = jnp.einsum("...td,...jd->...tj", qc, kc) * _tril(c)
        q_in, k_out = qc, kc
        decay = jnp.ones(qc.shape[:3] + (1,), dt)
    elif log_decay.ndim == 3:
        cum = jnp.cumsum(_chunk(log_decay, c, dt), axis=-1)  # [b, h, n, c]
        a = jnp.einsum("...td,...jd->...tj", qc, kc) * _pair_decay(cum)
        q_in = qc * jnp.exp(cum)[..., None]
        k_out = kc * jnp.exp(cum[..., -1:] - cum)[..., None]
        decay = jnp.exp(cum[..., -1])[..., None]  # [b, h, n, 1]
    else:
        cum = jnp.cumsum(_chunk(log_decay, c, dt), axis=-2)  # [b, h, n, c, d_k]
        a = _decayed_scores(qc, kc, cum, cum)
        q_in = qc * jnp.exp(cum)
        k_out = kc * jnp.exp(cum[..., -1:, :] - cum)
        decay = jnp.exp(cum[..., -1, :])  # [b, h, n, d_k]
    ds = jnp.einsum("...ck,...cv->...kv", k_out, vc)  # each chunk's own contribution

    def body(s, x):
        dec, d = x
        return dec[..., None] * s + d, s

    s_end, s_start = _scan_chunks(body, s0, [decay, ds])
    o = _mm(q_in, s_start) + _mm(a, vc)
    return _unchunk(o, l), s_end


# --------------------------------------------------------------------------- delta rule

def delta_rule_step(q_t, k_t, v_t, beta_t, log_alpha_t, state):
    """One step of S_t = α_t (I - β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ, o_t = S_tᵀ q_t.

    Args:
      q_t, k_t: `[batch, heads, d_k]`; v_t: `[batch, heads, d_v]`.
      beta_t: `[batch, heads]`; log_alpha_t: `[batch, heads]` or None (α = 1, DeltaNet).
      state: `[batch, heads, d_k, d_v]`.

    Returns:
      (o_t `[batch, heads, d_v]`, state).
    """
    dt = _dtype(q_t, k_t, v_t, beta_t, log_alpha_t, state)
    q_t, k_t, v_t, beta_t, state = (x.astype(dt) for x in (q_t, k_t, v_t, beta_t, state))
    if log_alpha_t is not None:
        state = state * jnp.exp(log_alpha_t.astype(dt))[..., None, None]
    # S - β k (kᵀ S) + β k vᵀ = S + β k (v - Sᵀ k)ᵀ: the delta-rule correction.
    err = v_t - jnp.einsum("bhk,bhkv->bhv", k_t, state)
    state = state + (beta_t[..., None] * k_t)[..., :, None] * err[..., None, :]
    return jnp.einsum("bhk,bhkv->bhv", q_t, state), state


def _check_delta(q, k, v, beta, log_alpha):
    _check_qkv("q", q, k, v)
    _check_gate("beta", beta, q, per_dim=False)
    if log_alpha is not None:
        _check_gate("log_alpha", log_alpha, q, per_dim=False)


def delta_rule_reference(q, k, v, beta, log_alpha=None, *, initial_state=None):
    """Sequential scan of `delta_rule_step` (tests only): same contract as `delta_rule`."""
    _check_delta(q, k, v, beta, log_alpha)
    dt = _dtype(q, k, v, beta, log_alpha)
    b, _, h, dk = q.shape
    s0 = _state(initial_state, (b, h, dk, v.shape[-1]), dt)
    if log_alpha is None:
        return _scan_time(lambda q_t, k_t, v_t, b_t, s: delta_rule_step(
            q_t, k_t, v_t, b_t, None, s), [q, k, v, beta], s0)
    return _scan_time(delta_rule_step, [q, k, v, beta, log_alpha], s0)


def _unit_lower_solve(m, rhs):
    """(I - m)^-1 rhs for strictly lower-triangular m `[..., c, c]`, rhs `[..., c, n]`.

    m is nilpotent (m^c = 0), so (I - m)^-1 = sum_k m^k = prod_j (I + m^(2^j)) over the
    ceil(log2 c) squarings: matmuls only (the MXU's work on TPU), no sequential substitution.
    It replaces `lax.linalg.triangular_solve`, whose gradient deadlocked XLA:CPU (jax 0.10.2)
    on its second execution at batch 16, one head of 64, L 128 (the RWKV-7 probe run hung).
    """
    x = rhs + _mm(m, rhs)
    p = m
    for _ in range(max(0, math.ceil(math.log2(m.shape[-1])) - 1)):
        p = _mm(p, p)
        x = x + _mm(p, x)
    return x


def delta_rule(q, k, v, beta, log_alpha=None, *, chunk_size=64, initial_state=None):
    """The delta rule (DeltaNet) and the gated delta rule (Gated DeltaNet), chunkwise parallel:
    S_t = α_t (I - β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ, o_t = S_tᵀ q_t.

    UT / WY form (Yang et al. 2024, 2025). Writing S_t = α_t S_{t-1} + k_t u_tᵀ with the
    pseudo-values u_t = β_t (v_t - α_t S_{t-1}ᵀ k_t), within a chunk with cumulative log gate B
    and start state S_0:

        (I + L) U = diag(β) (V - diag(e^B) K S_0),  L = strictly_lower(diag(β) (K Kᵀ ⊙ Γ)),
        Γ_tj = exp(B_t - B_j),

    so with T = (I + L)⁻¹ diag(β) (one unit-lower-triangular inverse per chunk,
    `_unit_lower_solve`, in parallel over chunks), W = T diag(e^B) K and U' = T V: U = U' - W S_0, then
    O = diag(e^B) Q S_0 + (Q Kᵀ ⊙ Γ ⊙ M) U and S_end = e^{B_c} S_0 + (diag(e^{B_c - B}) K)ᵀ U;
    the chunk scan only does the last two matmuls and U' - W S_0.

    Keys are expected L2-normalised per head (the mixer does it, as DeltaNet does, so that
    I - β k kᵀ is a contraction for β in [0, 2]); the kernel is exact for any keys.

    Args:
      q, k: `[batch, length, heads, d_k]`; v: `[batch, length, heads, d_v]`.
      beta: `[batch, length, heads]` writing strength (sigmoid in DeltaNet).
      log_alpha: `[batch, length, heads]` log decay <= 0 (Gated DeltaNet), or None (DeltaNet).
      chunk_size: steps per chunk (any positive int; the length is padded to a multiple).
      initial_state: `[batch, heads, d_k, d_v]` or None (zeros).

    Returns:
      (o `[batch, length, heads, d_v]`, final state `[batch, heads, d_k, d_v]`), float32
      (float64 for float64 inputs).
    """
    _check_chunk(chunk_size)
    _check_delta(q, k, v, beta, log_alpha)
    dt = _dtype(q, k, v, beta, log_alpha)
    b, l, h, dk = q.shape
    s0 = _state(initial_state, (b, h, dk, v.shape[-1]), dt)
    c = chunk_size
    qc, kc, vc = (_chunk(x, c, dt) for x in (q, k, v))
    bc = _chunk(beta, c, dt)  # [b, h, n, c]
    if log_alpha is None:
        cum = jnp.zeros_like(bc)
    else:
        cum = jnp.cumsum(_chunk(log_alpha, c, dt), axis=-1)
    gam = _pair_decay(cum)  # [b, h, n, c, c], incl. diagonal
    kk = jnp.einsum("...td,...jd->...tj", kc, kc)
    lower = jnp.where(_tril(c, strict=True), bc[..., :, None] * kk * gam, 0.0)
    rhs = bc[..., None] * jnp.concatenate([jnp.exp(cum)[..., None] * kc, vc], axis=-1)
    wu = _unit_lower_solve(-lower, rhs)
    w, u0 = wu[..., :dk], wu[..., dk:]
    k_out = kc * jnp.exp(cum[..., -1:] - cum)[..., None]
    decay = jnp.exp(cum[..., -1])  # [b, h, n]

    def body(s, x):
        w_n, u_n, k_n, dec = x
        u = u_n - _mm(w_n, s)
        return dec[..., None, None] * s + jnp.einsum("...ck,...cv->...kv", k_n, u), (u, s)

    s_end, (u, s_start) = _scan_chunks(body, s0, [w, u0, k_out, decay])
    a = jnp.einsum("...td,...jd->...tj", qc, kc) * gam
    o = _mm(qc * jnp.exp(cum)[..., None], s_start) + _mm(a, u)
    return _unchunk(o, l), s_end


# --------------------------------------------------------------------------- RWKV-7

def rwkv7_step(r_t, k_t, v_t, log_w_t, a_t, b_t, state):
    """One step of S_t = (diag(w_t) + b_t a_tᵀ) S_{t-1} + k_t v_tᵀ, o_t = S_tᵀ r_t.

    Args:
      r_t, k_t, log_w_t, a_t, b_t: `[batch, heads, d_k]`; v_t: `[batch, heads, d_v]`.
      state: `[batch, heads, d_k, d_v]`.

    Returns:
      (o_t `[batch, heads, d_v]`, state).
    """
    dt = _dtype(r_t, k_t, v_t, log_w_t, a_t, b_t, state)
    r_t, k_t, v_t, log_w_t, a_t, b_t, state = (
        x.astype(dt) for x in (r_t, k_t, v_t, log_w_t, a_t, b_t, state))
    sa = jnp.einsum("bhk,bhkv->bhv", a_t, state)  # a_tᵀ S_{t-1}: what the state holds at a
    state = (jnp.exp(log_w_t)[..., None] * state + b_t[..., :, None] * sa[..., None, :]
             + k_t[..., :, None] * v_t[..., None, :])
    return jnp.einsum("bhk,bhkv->bhv", r_t, state), state


def _check_rwkv7(r, k, v, log_w, a, b):
    _check_qkv("r", r, k, v)
    for name, x in (("log_w", log_w), ("a", a), ("b", b)):
        if tuple(x.shape) != tuple(r.shape):
            raise ValueError(f"{name} must be [batch, length, heads, d_k] = {tuple(r.shape)}, "
                             f"got {tuple(x.shape)}")


def rwkv7_reference(r, k, v, log_w, a, b, *, initial_state=None):
    """Sequential scan of `rwkv7_step` (tests only): same contract as `rwkv7`."""
    _check_rwkv7(r, k, v, log_w, a, b)
    dt = _dtype(r, k, v, log_w, a, b)
    bs, _, h, dk = r.shape
    s0 = _state(initial_state, (bs, h, dk, v.shape[-1]), dt)
    return _scan_time(rwkv7_step, [r, k, v, log_w, a, b], s0)


def rwkv7(r, k, v, log_w, a, b, *, chunk_size=64, initial_state=None):
    """RWKV-7's generalised delta rule, chunkwise parallel (diagonal plus rank one):
    S_t = (diag(w_t) + b_t a_tᵀ) S_{t-1} + k_t v_tᵀ = diag(w_t) S_{t-1} + b_t (a_tᵀ S_{t-1})
    + k_t v_tᵀ, o_t = S_tᵀ r_t, with w_t = exp(log_w_t) per key dimension.

    Mapping to RWKV-7 (Peng et al. 2025, "Goose"): the paper keeps the state as
    wkv `[d_v, d_k]` with row vectors, wkv_t = wkv_{t-1} (diag(w_t) - κ̂_tᵀ (a_t ⊙ κ̂_t))
    + v_tᵀ k̃_t, output wkv_t r_tᵀ. Here S = wkvᵀ `[d_k, d_v]`, so the transition acts from the
    left as its transpose, diag(w_t) - (a_t ⊙ κ̂_t) κ̂_tᵀ: call with `a = -κ̂` (the vector
    that reads the state) and `b = κ̂ ⊙ a_icl` (the in-context learning rate times κ̂, which
    writes it back), `k = k̃`. This is fla's convention (`fla/ops/rwkv7`, the DPLR naive
    recurrence `S += b (aᵀ S)` with a = -kk, b = kk * a), so their (r, k, v, a, b) carry over.
    The bonus term (r ⊙ u ⊙ k) v and the group norm belong to the mixer.

    Chunked by the UT form generalised to a ≠ k: with B (inclusive) and B⁻ = B - log w
    (exclusive) the cumulative log decays in a chunk, the reads u_t = a_tᵀ S_{t-1} satisfy
    (I - L_ab) U = diag(e^{B⁻}) A S_0 + L_ak V, L_xy[t, j] = Σ_d x_td y_jd e^{B⁻_td - B_jd}
    (j < t); one unit-lower-triangular inverse per chunk (`_unit_lower_solve`) gives U = W S_0 + U'.

    Args:
      r, k, log_w, a, b: `[batch, length, heads, d_k]` (log_w <= 0); v `[batch, length, heads,
        d_v]`.
      chunk_size: steps per chunk (any positive int; the length is padded to a multiple).
      initial_state: `[batch, heads, d_k, d_v]` or None (zeros).

    Returns:
      (o `[batch, length, heads, d_v]`, final state `[batch, heads, d_k, d_v]`), float32
      (float64 for float64 inputs).
    """
    _check_chunk(chunk_size)
    _check_rwkv7(r, k, v, log_w, a, b)
    dt = _dtype(r, k, v, log_w, a, b)
    bs, l, h, dk = r.shape
    s0 = _state(initial_state, (bs, h, dk, v.shape[-1]), dt)
    c = chunk_size
    rc, kc, vc, ac, bc, lw = (_chunk(x, c, dt) for x in (r, k, v, a, b, log_w))
    cum = jnp.cumsum(lw, axis=-2)  # inclusive [b, h, n, c, d_k]
    cum_x = cum - lw  # exclusive: the decay before step t's own
    l_ab = _decayed_scores(ac, bc, cum_x, cum, strict=True)
    l_ak = _decayed_scores(ac, kc, cum_x, cum, strict=True)
    rhs = jnp.concatenate([ac * jnp.exp(cum_x), _mm(l_ak, vc)], axis=-1)
    wu = _unit_lower_solve(l_ab, rhs)
    w, u0 = wu[..., :dk], wu[..., dk:]
    out = jnp.exp(cum[..., -1:, :] - cum)
    b_out, k_out = bc * out, kc * out
    decay = jnp.exp(cum[..., -1, :])  # [b, h, n, d_k]
    dkv = jnp.einsum("...ck,...cv->...kv", k_out, vc)

    def body(s, x):
        w_n, u_n, b_n, dkv_n, dec = x
        u = _mm(w_n, s) + u_n
        return (dec[..., None] * s + jnp.einsum("...ck,...cv->...kv", b_n, u) + dkv_n,
                (u, s))

    s_end, (u, s_start) = _scan_chunks(body, s0, [w, u0, b_out, dkv, decay])
    a_rb = _decayed_scores(rc, bc, cum, cum)
    a_rk = _decayed_scores(rc, kc, cum, cum)
    o = _mm(rc * jnp.exp(cum), s_start) + _mm(a_rb, u) + _mm(a_rk, vc)
    return _unchunk(o, l), s_end


# --------------------------------------------------------------------------- mLSTM

def _log_forget(f_pre, forget):
    if forget == "sigmoid":
        return jax.nn.log_sigmoid(f_pre)
    if forget == "exp":
        return f_pre
    raise ValueError(f"forget must be 'sigmoid' or 'exp', got {forget!r}")


def mlstm_step(q_t, k_t, v_t, i_pre_t, f_pre_t, state, *, forget="sigmoid"):
    """One stabilised mLSTM step (Beck et al. 2024):

        m_t = max(log f_t + m_{t-1}, log i_t),  log i_t = i_pre_t,
        log f_t = logsigmoid(f_pre_t) (forget="sigmoid") or f_pre_t (forget="exp"),
        C_t = exp(log f_t + m_{t-1} - m_t) C_{t-1} + exp(log i_t - m_t) k_t v_tᵀ,
        n_t = exp(log f_t + m_{t-1} - m_t) n_{t-1} + exp(log i_t - m_t) k_t,
        h_t = C_tᵀ q_t / max(|n_tᵀ q_t|, exp(-m_t)).

    C, n are the unstabilised states times exp(-m_t), so h_t = C_tᵀ q_t / max(|n_tᵀ q_t|, 1) in
    unstabilised terms, independent of m (m only keeps the exps finite).

    Args:
      q_t, k_t: `[batch, heads, d_k]`; v_t: `[batch, heads, d_v]`;
      i_pre_t, f_pre_t: `[batch, heads]` gate pre-activations.
      state: (C `[batch, heads, d_k, d_v]`, n `[batch, heads, d_k]`, m `[batch, heads]`).

    Returns:
      (h_t `[batch, heads, d_v]`, state).
    """
    cs, ns, ms = state
    dt = _dtype(q_t, k_t, v_t, i_pre_t, f_pre_t, cs)
    q_t, k_t, v_t, log_i, f_pre_t, cs, ns, ms = (
        x.astype(dt) for x in (q_t, k_t, v_t, i_pre_t, f_pre_t, cs, ns, ms))
    log_f = _log_forget(f_pre_t, forget)
    m = jnp.maximum(log_f + ms, log_i)
    fw = jnp.exp(log_f + ms - m)
    iw = jnp.exp(log_i - m)
    cs = fw[..., None, None] * cs + (iw[..., None] * k_t)[..., :, None] * v_t[..., None, :]
    ns = fw[..., None] * ns + iw[..., None] * k_t
    num = jnp.einsum("bhk,bhkv->bhv", q_t, cs)
    den = jnp.maximum(jnp.abs(jnp.einsum("bhk,bhk->bh", q_t, ns)), jnp.exp(-m))
    return num / den[..., None], (cs, ns, m)


def _mlstm_state(initial_state, b, h, dk, dv, dt):
    if initial_state is None:
        return (jnp.zeros((b, h, dk, dv), dt), jnp.zeros((b, h, dk), dt), jnp.zeros((b, h), dt))
    cs, ns, ms = initial_state
    want = ((b, h, dk, dv), (b, h, dk), (b, h))
    if tuple(tuple(x.shape) for x in (cs, ns, ms)) != want:
        raise ValueError(f"initial_state must be (C, n, m) of shapes {want}, got "
                         f"{tuple(tuple(x.shape) for x in (cs, ns, ms))}")
    return cs.astype(dt), ns.astype(dt), ms.astype(dt)


def _check_mlstm(q, k, v, i_pre, f_pre, forget):
    _check_qkv("q", q, k, v)
    _check_gate("i_pre", i_pre, q, per_dim=False)
    _check_gate("f_pre", f_pre, q, per_dim=False)
    _log_forget(jnp.zeros(()), forget)


def mlstm_reference(q, k, v, i_pre, f_pre, *, forget="sigmoid", initial_state=None):
    """Sequential scan of `mlstm_step` (tests only): same contract as `mlstm`."""
    _check_mlstm(q, k, v, i_pre, f_pre, forget)
    dt = _dtype(q, k, v, i_pre, f_pre)
    b, _, h, dk = q.shape
    s0 = _mlstm_state(initial_state, b, h, dk, v.shape[-1], dt)
    return _scan_time(lambda *x: mlstm_step(*x, forget=forget), [q, k, v, i_pre, f_pre], s0)


def mlstm(q, k, v, i_pre, f_pre, *, forget="sigmoid", chunk_size=64, initial_state=None):
    """The xLSTM mLSTM (Beck et al. 2024), chunkwise parallel and stabilised in log space; equal
    to the stabilised recurrence `mlstm_step` (outputs and the state (C, n, m)).

    Within a chunk with cumulative log forget gate B and start state (C_0, n_0, m_0):
    D_tj = B_t - B_j + log i_j (j <= t), m_t = max(B_t + m_0, max_j D_tj) (the recurrence's
    stabiliser, exactly), and with P = exp(D - m_t), e_t = exp(B_t + m_0 - m_t) (all <= 1):

        h_t = (e_t q_tᵀ C_0 + Σ_j P_tj (q_t·k_j) v_j) / max(|e_t q_tᵀ n_0 + Σ_j P_tj (q_t·k_j)|,
              exp(-m_t)).

    The chunk scan carries (C, n, m) from chunk end to chunk end the same way. The initial
    stabiliser of the zero state is m_0 = 0 (any value gives the same outputs).

    Args:
      q, k: `[batch, length, heads, d_k]`; v: `[batch, length, heads, d_v]`.
      i_pre, f_pre: `[batch, length, heads]` input / forget gate pre-activations
        (log i = i_pre; log f = logsigmoid(f_pre), or f_pre for forget="exp").
      forget: "sigmoid" or "exp".
      chunk_size: steps per chunk (any positive int; the length is padded to a multiple).
      initial_state: (C `[batch, heads, d_k, d_v]`, n `[batch, heads, d_k]`,
        m `[batch, heads]`) or None (zeros).

    Returns:
      (h `[batch, length, heads, d_v]`, (C, n, m)), float32 (float64 for float64 inputs).
    """
    _check_chunk(chunk_size)
    _check_mlstm(q, k, v, i_pre, f_pre, forget)
    dt = _dtype(q, k, v, i_pre, f_pre)
    b, l, h, dk = q.shape
    s0 = _mlstm_state(initial_state, b, h, dk, v.shape[-1], dt)
    c = chunk_size
    qc, kc, vc = (_chunk(x, c, dt) for x in (q, k, v))
    log_f = _chunk(_log_forget(f_pre.astype(dt), forget), c, dt)  # padded steps: f = 1
    log_i = _chunk(i_pre, c, dt, fill=-jnp.inf)  # padded steps: i = 0
    cum = jnp.cumsum(log_f, axis=-1)  # [b, h, n, c]
    dmat = jnp.where(_tril(c), cum[..., :, None] - cum[..., None, :] + log_i[..., None, :],
                     -jnp.inf)
    dmax = jnp.max(dmat, axis=-1)  # [b, h, n, c]
    to_end = cum[..., -1:] - cum + log_i  # [b, h, n, c]: log weight of k_j v_j at chunk end

    def body(state, x):
        cs, ns, ms = state
        cum_end, dmax_end, te, k_n, v_n = x
        m = jnp.maximum(cum_end + ms, dmax_end)
        fw = jnp.exp(cum_end + ms - m)
        kw = k_n * jnp.exp(te - m[..., None])[..., None]
        cs_new = fw[..., None, None] * cs + jnp.einsum("...ck,...cv->...kv", kw, v_n)
        ns_new = fw[..., None] * ns + jnp.sum(kw, axis=-2)
        return (cs_new, ns_new, m), (cs, ns, ms)

    s_end, (c_start, n_start, m_start) = _scan_chunks(
        body, s0, [cum[..., -1], dmax[..., -1], to_end, kc, vc])
    m = jnp.maximum(cum + m_start[..., None], dmax)  # [b, h, n, c]
    p = jnp.exp(dmat - m[..., None]) * jnp.einsum("...td,...jd->...tj", qc, kc)
    e = jnp.exp(cum + m_start[..., None] - m)
    num = e[..., None] * _mm(qc, c_start) + _mm(p, vc)
    den = e * jnp.einsum("...ck,...k->...c", qc, n_start) + jnp.sum(p, axis=-1)
    hs = num / jnp.maximum(jnp.abs(den), jnp.exp(-m))[..., None]
    return _unchunk(hs, l), s_end
