"""Selective state spaces, pure jnp: the Mamba selective scan and the Mamba-2 SSD algorithm.

Mamba (Gu & Dao 2023), per channel d and state n, with input-dependent Δ, B, C:

    h_t = exp(Δ_t,d A_d,n) h_{t-1} + Δ_t,d B_t,n u_t,d,    y_t,d = Σ_n C_t,n h_t,d,n + D_d u_t,d

`selective_scan` runs it in chunks of `chunk_size` steps: a `lax.scan` over the chunks carries
the state `[batch, d, N]`, and inside a chunk `lax.associative_scan` runs the diagonal
recurrence in parallel. Only one chunk's `[batch, chunk, d, N]` is live at a time (forward, and
backward too: the chunk body is rematerialised), so memory is O(L·d + chunk·d·N), not O(L·d·N).

Mamba-2 / SSD (Dao & Gu 2024): a scalar decay per head, `A_h < 0`, heads of width P sharing
B, C within a group (G groups, H/G heads each):

    h_t = exp(Δ_t,h A_h) h_{t-1} + Δ_t,h x_t,h ⊗ B_t,g,    y_t,h = h_t C_t,g + D_h x_t,h

`ssd` is the chunked state-space-dual algorithm: within a chunk the output is a masked matmul
(C B^T ⊙ decay, the "attention-like" form), the chunks' final states are passed on by a short
scan over chunks, and their contribution to the next chunk is one more matmul. `ssd_quadratic`
is the whole-sequence masked form (O(L²)), the reference the tests hold it to. Both have a
`*_step` recurrent form. Sequences whose length is not a multiple of the chunk are padded with
Δ = 0, an identity step (decay 1, no input).
"""

import jax
import jax.numpy as jnp


def causal_depthwise_conv(x, w, b=None):
    """Short causal depthwise convolution: y_t,c = Σ_k w_k,c x_{t-K+1+k},c (+ b_c).

    Args:
      x: `[batch, length, channels]`.
      w: `[K, channels]` (w[K-1] multiplies x_t).
      b: `[channels]` or None.
    """
    k = w.shape[0]
    xp = jnp.pad(x, ((0, 0), (k - 1, 0), (0, 0)))
    length = x.shape[1]
    y = sum(xp[:, i:i + length] * w[i] for i in range(k))
    return y if b is None else y + b


def conv_step(conv_state, x_t, w, b=None):
    """One step of `causal_depthwise_conv`: conv_state `[batch, K-1, channels]` holds the last
    K-1 inputs. Returns (y_t `[batch, channels]`, new conv_state)."""
    window = jnp.concatenate([conv_state, x_t[:, None]], axis=1)  # [batch, K, channels]
    y = jnp.einsum("bkc,kc->bc", window, w)
    return (y if b is None else y + b), window[:, 1:]


def _pad_length(x, length, axis=1):
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, length - x.shape[axis])
    return jnp.pad(x, pad)


def _combine(left, right):
    a1, b1 = left
    a2, b2 = right
    return a1 * a2, a2 * b1 + b2


# -- Mamba: the selective scan -------------------------------------------------------------------

def selective_scan(u, delta, A, B, C, D=None, *, chunk_size=64, h0=None, return_state=False):
    """Parallel selective scan (Mamba's S6), chunked.

    Args:
      u: `[batch, length, d]` input.
      delta: `[batch, length, d]` positive step sizes (softplus already applied).
      A: `[d, N]` (negative real).
      B, C: `[batch, length, N]` input-dependent input and output matrices.
      D: `[d]` skip, or None.
      chunk_size: steps per chunk of the associative scan.
      h0: `[batch, d, N]` initial state (zeros when None).
      return_state: also return the final state.

    Returns:
      y `[batch, length, d]` (float32), and the final state `[batch, d, N]` if `return_state`.
    """
    f32 = jnp.float32
    u, delta, A, B, C = (t.astype(f32) for t in (u, delta, A, B, C))
    batch, length, d = u.shape
    n = A.shape[-1]
    t = max(1, min(int(chunk_size), length))
    n_chunks = -(-length // t)
    padded = n_chunks * t

    def chunks(x):  # [batch, length, ...] -> [n_chunks, batch, t, ...]
        x = _pad_length(x, padded)
        return jnp.moveaxis(x.reshape((batch, n_chunks, t) + x.shape[2:]), 1, 0)

    h0 = jnp.zeros((batch, d, n), f32) if h0 is None else h0.astype(f32)

    @jax.checkpoint
    def body(h, xs):
        uc, dc, bc, cc = xs                                   # [batch, t, d], ..., [batch, t, N]
        da = jnp.exp(dc[..., None] * A)                       # [batch, t, d, N]
        dbu = (dc * uc)[..., None] * bc[:, :, None, :]        # [batch, t, d, N]
        a_cum, h_in = jax.lax.associative_scan(_combine, (da, dbu), axis=1)
        hs = h_in + a_cum * h[:, None]
        y = jnp.einsum("btdn,btn->btd", hs, cc)
        return hs[:, -1], y

    h, ys = jax.lax.scan(body, h0, (chunks(u), chunks(delta), chunks(B), chunks(C)))
    y = jnp.moveaxis(ys, 0, 1).reshape(batch, padded, d)[:, :length]
    if D is not None:
        y = y + u * D.astype(f32)
    return (y, h) if return_state else y


def selective_step(h, u_t, delta_t, A, B_t, C_t, D=None):
    """One recurrent step of `selective_scan`: h `[batch, d, N]`, u_t / delta_t `[batch, d]`,
    B_t / C_t `[batch, N]` -> (y_t `[batch, d]`, h)."""
    h = jnp.exp(delta_t[..., None] * A) * h + (delta_t * u_t)[..., None] * B_t[:, None, :]
    y = jnp.einsum("bdn,bn->bd", h, C_t)
    if D is not None:
        y = y + D * u_t
    return y, h


# -- Mamba-2: state-space duality ----------------------------------------------------------------

def segsum(a):
    """Stable segment sums over the last axis: out[..., i, j] = Σ_{k=j+1..i} a_k for j <= i
    (0 on the diagonal), and a mask of j <= i. Returns (segsum, mask); entries above the
    diagonal of segsum are 0 (use the mask)."""
    t = a.shape[-1]
    x = jnp.broadcast_to(a[..., :, None], a.shape + (t,))   # x[..., i, j] = a_i
    strict = jnp.tril(jnp.ones((t, t), bool), -1)
    cs = jnp.cumsum(jnp.where(strict, x, 0.0), axis=-2)      # Σ_{k=j+1..i} a_k
    mask = jnp.tril(jnp.ones((t, t), bool))
    return jnp.where(mask, cs, 0.0), mask


def _group_heads(x, groups):
    """[..., H, P] -> [..., G, H/G, P]."""
    h = x.shape[-2]
    if h % groups:
        raise ValueError(f"{h} heads do not split into {groups} groups")
    return x.reshape(x.shape[:-2] + (groups, h // groups) + x.shape[-1:])


def ssd(x, dt, A, B, C, D=None, *, chunk_size=64, h0=None, return_state=False):
    """Chunked SSD (Mamba-2): intra-chunk masked matmuls + inter-chunk state passing.

    Args:
      x: `[batch, length, H, P]` per-head inputs.
      dt: `[batch, length, H]` positive step sizes (softplus already applied).
      A: `[H]` negative scalar decay per head.
      B, C: `[batch, length, G, N]`, G groups (H divisible by G).
      D: `[H]` skip, or None.
      chunk_size: the chunk length T (intra-chunk work is O(T²) per chunk).
      h0: `[batch, H, P, N]` initial state (zeros when None).
      return_state: also return the final state.

    Returns:
      y `[batch, length, H, P]` float32 (and the final state `[batch, H, P, N]`).
    """
    f32 = jnp.float32
    x, dt, A, B, C = (t.astype(f32) for t in (x, dt, A, B, C))
    batch, length, nh, p = x.shape
    g, n = B.shape[-2:]
    t = max(1, min(int(chunk_size), length))
    c = -(-length // t)
    padded = c * t

    def chunks(v):  # [batch, length, ...] -> [batch, c, t, ...]
        v = _pad_length(v, padded)
        return v.reshape((batch, c, t) + v.shape[2:])

    xdt = chunks(x * dt[..., None])                       # [b, c, t, H, P]
    a = jnp.moveaxis(chunks(dt * A), -1, 2)               # [b, c, H, t]
    bc, cc = chunks(B), chunks(C)                         # [b, c, t, G, N]
    xg = _group_heads(xdt, g)                             # [b, c, t, G, Hg, P]
    a_cum = jnp.cumsum(a, axis=-1)                        # [b, c, H, t]

    # 1. intra-chunk (diagonal blocks): y = (C B^T ⊙ L) x dt, L the masked decay
    seg, mask = segsum(a)
    decay = jnp.where(mask, jnp.exp(seg), 0.0)            # [b, c, H, t, t]
    decay = decay.reshape((batch, c, g, nh // g, t, t))
    cb = jnp.einsum("bclgn,bcsgn->bcgls", cc, bc)         # [b, c, G, t, t]
    # (pairwise products: one 3-operand einsum may form a [.., t, t, P] outer product)
    y_diag = jnp.einsum("bcghls,bcsghp->bclghp", cb[:, :, :, None] * decay, xg)

    # 2. each chunk's final state from its own inputs
    to_end = jnp.exp(a_cum[..., -1:] - a_cum)             # [b, c, H, t]
    to_end = to_end.reshape((batch, c, g, nh // g, t))
    xw = xg * jnp.moveaxis(to_end, -1, 2)[..., None]      # [b, c, t, G, Hg, P]
    states = jnp.einsum("bcsgn,bcsghp->bcghpn", bc, xw)

    # 3. inter-chunk recurrence (a short scan over chunks) for the state entering each chunk
    h0 = jnp.zeros((batch, nh, p, n), f32) if h0 is None else h0.astype(f32)
    chunk_decay = jnp.exp(a_cum[..., -1])                 # [b, c, H]
    states = states.reshape((batch, c, nh, p, n))

    def pass_state(h, xs):
        dec, s = xs
        return dec[..., None, None] * h + s, h             # carry the new state, emit the old

    h_last, h_in = jax.lax.scan(pass_state, h0, (jnp.moveaxis(chunk_decay, 1, 0),
                                                 jnp.moveaxis(states, 1, 0)))
    h_in = jnp.moveaxis(h_in, 0, 1)                       # [b, c, H, P, N]

    # 4. the entering state's contribution inside each chunk
    from_start = jnp.exp(a_cum).reshape((batch, c, g, nh // g, t))
    h_in = h_in.reshape((batch, c, g, nh // g, p, n))
    y_off = (jnp.einsum("bclgn,bcghpn->bclghp", cc, h_in)
             * jnp.moveaxis(from_start, -1, 2)[..., None])

    y = (y_diag + y_off).reshape(batch, padded, nh, p)[:, :length]
    if D is not None:
        y = y + x * D.astype(f32)[:, None]
    return (y, h_last) if return_state else y


def ssd_quadratic(x, dt, A, B, C, D=None):
    """SSD's dual, whole-sequence form: y = (C B^T ⊙ L) (x dt) with the masked decay
    L[t, s] = exp(Σ_{k=s+1..t} Δ_k A) for s <= t — attention-like, O(L²). Same arguments and
    result as `ssd` (without an initial state)."""
    f32 = jnp.float32
    x, dt, A, B, C = (t.astype(f32) for t in (x, dt, A, B, C))
    g = B.shape[-2]
    nh = x.shape[-2]
    seg, mask = segsum(jnp.moveaxis(dt * A, -1, 1))       # [b, H, L, L]
    decay = jnp.where(mask, jnp.exp(seg), 0.0)
    decay = decay.reshape((decay.shape[0], g, nh // g) + decay.shape[-2:])
    cb = jnp.einsum("blgn,bsgn->bgls", C, B)
    xg = _group_heads(x * dt[..., None], g)
    y = jnp.einsum("bghls,bsghp->blghp", cb[:, :, None] * decay, xg).reshape(x.shape)
    if D is not None:
        y = y + x * D.astype(f32)[:, None]
    return y


def ssd_step(h, x_t, dt_t, A, B_t, C_t, D=None):
    """One recurrent step of `ssd`: h `[batch, H, P, N]`, x_t `[batch, H, P]`, dt_t
    `[batch, H]`, B_t / C_t `[batch, G, N]` -> (y_t `[batch, H, P]`, h)."""
    g = B_t.shape[-2]
    hg = x_t.shape[-2] // g
    b = jnp.repeat(B_t, hg, axis=-2)                      # [batch, H, N]
    cm = jnp.repeat(C_t, hg, axis=-2)
    decay = jnp.exp(dt_t * A)[..., None, None]
    h = decay * h + (dt_t[..., None] * x_t)[..., None] * b[:, :, None, :]
    y = jnp.einsum("bhpn,bhn->bhp", h, cm)
    if D is not None:
        y = y + D[:, None] * x_t
    return y, h
