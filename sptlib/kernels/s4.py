"""S4 (DPLR / NPLR HiPPO) kernel: Cauchy kernel + Woodbury identity at the roots of unity.

Continuous system (one per channel, state size N = 2 * state/2 in conjugate pairs):
    A = diag(Lambda) - P P^*,  B,  C~ (the "C tilde" of the S4 paper),
discretised with the bilinear transform, step dt = exp(log_dt). Following state-spaces/s4, the
learned output matrix is C~ = C (I - dA^L): the truncated generating function at the L-th roots
of unity is then C~ (I - dA z)^{-1} dB, which Woodbury turns into four Cauchy sums; an inverse
real FFT gives the kernel. The recurrent (step) form needs C = C~ (I - dA^L)^{-1}, computed once
for a given length (`s4_output_matrix`).

All vectors are stored as the N/2 members of each conjugate pair; the other halves are their
conjugates (`s4_full`).
"""

import math

import jax
import jax.numpy as jnp

from sptlib.kernels import platform
from sptlib.kernels.diagonal import _complex_dtype


# Elements of one Cauchy denominator block [H, N/2, J_chunk]: 2^22 complex64 = 32 MiB. Above this
# the sums are evaluated in chunks of the nodes, so memory stays O(k H J + H N) instead of
# O(H N J): the kernel's forward+backward at H=256, N=64, L=16384 plans 0.28 GiB instead of
# 3.1 GiB (XLA:CPU memory analysis), and runs ~2x faster; 2^20 / 2^24 measured 0.24 / 0.73 GiB
# and about the same time.
CAUCHY_BLOCK_ELEMS = 1 << 22


def _cauchy_conj_dense(v, lam, dt, z):
    """All nodes at once: `[k, H, N]`, `[H, N]`, `[H]`, `[J]` -> `[k, H, J]` via `[H, N, J]`."""
    a = (2.0 / dt)[:, None, None] * (1 - z)  # [H, 1, J]
    b = (1 + z)  # [J]
    d1 = a - b * lam[..., None]  # [H, N, J]
    d2 = a - b * jnp.conj(lam)[..., None]
    return 2 * (jnp.einsum("khn,hnj->khj", v, 1 / d1)
                + jnp.einsum("khn,hnj->khj", jnp.conj(v), 1 / d2))


def cauchy_chunk_size(channels, half_state, nodes, block_elems=None):
    """Nodes per chunk so that one `[channels, half_state, chunk]` block has <= block_elems
    (default: the module's `CAUCHY_BLOCK_ELEMS`, read at call time) elements (at least 1);
    `nodes` (no chunking) when everything fits at once. The blocks are balanced
    (ceil(nodes / blocks) each) so the padding of the last one stays small."""
    block_elems = CAUCHY_BLOCK_ELEMS if block_elems is None else block_elems
    cap = max(1, block_elems // max(1, channels * half_state))
    n_blocks = -(-nodes // cap)
    return -(-nodes // n_blocks)


def _cauchy_conj(v, lam, dt, z, chunk=None):
    """2 sum_n [v_n / d(lam_n) + conj(v_n) / d(conj lam_n)], d(l) = (2/dt)(1-z) - (1+z) l.

    v `[k, H, N]`, lam `[H, N]`, dt `[H]`, z `[J]` -> `[k, H, J]`. Multiplying the Cauchy
    denominator g(z) - l (g = (2/dt)(1-z)/(1+z)) by (1+z) removes the pole of g at z = -1.

    chunk: nodes per block (None: `cauchy_chunk_size`). With chunk < J the nodes are visited
    with `lax.map` over blocks of `chunk`, each block rematerialised in the backward pass, so
    neither the forward nor the saved residuals hold an `[H, N, J]` array; the sums are the same
    per node, so the result equals the dense evaluation up to float reassociation.
    """
    nodes = z.shape[0]
    if chunk is None:
        chunk = cauchy_chunk_size(lam.shape[0], lam.shape[1], nodes)
    if chunk >= nodes:
        return _cauchy_conj_dense(v, lam, dt, z)
    n_blocks = -(-nodes // chunk)
    # pad by repeating the last node: its denominators are those of a real node (finite whenever
    # the result is), and the padded sums are dropped
    zp = jnp.pad(z, (0, n_blocks * chunk - nodes), mode="edge").reshape(n_blocks, chunk)

    # checkpoint: the backward pass recomputes each block's [H, N, chunk] denominators instead
    # of lax.map stacking them as residuals for all blocks (which would be the dense memory)
    block = jax.checkpoint(lambda zc: _cauchy_conj_dense(v, lam, dt, zc))
    s = jax.lax.map(block, zp)  # [blocks, k, H, chunk]
    s = jnp.moveaxis(s, 0, -2).reshape(s.shape[1:3] + (n_blocks * chunk,))
    return s[..., :nodes]


def _woodbury(s, z, nc):
    """The generating function at the nodes from the Cauchy sums `s` `[2c+2, H, J]`:
    s00 - s01 (h s10) / (1 + h s11), h = (1 + z) / 2 -> `[c, H, J]`."""
    s00, s01, s10, s11 = s[:nc], s[nc:2 * nc], s[2 * nc], s[2 * nc + 1]
    h = (1 + z) / 2
    return s00 - s01 * (h * s10) / (1 + h * s11)


def _spectrum(v, lam, dt, z, chunk):
    """The generating function at the nodes, `[c, H, J]`: by the platform's CPU kernel on XLA:CPU
    (complex64, no explicit `chunk`), else in jnp (`_cauchy_conj` in blocks of `chunk` nodes,
    `_woodbury`)."""
    nc = v.shape[0] // 2 - 1

    def jnp_path(v, lam, dt, z):
        return _woodbury(_cauchy_conj(v, lam, dt, z, chunk), z, nc)

    if chunk is not None or v.dtype != jnp.complex64 or not platform.cpu_kernels():
        return jnp_path(v, lam, dt, z)
    return platform.on_platforms(jnp_path, v, lam, dt, z, cpu=platform.cpu_s4_spectrum)


def s4_kernel(Lambda, P, B, C, log_dt, length, cauchy_chunk=None):
    """S4 DPLR convolution kernel via Cauchy + Woodbury at the roots of unity (S4 paper, Alg. 1).

    Args:
      Lambda, P, B: complex `[channels, state/2]`.
      C: complex `[..., channels, state/2]` (C tilde; leading dims e.g. 2 for bidirectional).
      log_dt: `[channels]`.
      length: static int.
      cauchy_chunk: static int, roots of unity per block of the jnp Cauchy sums (>= length // 2
        + 1: one dense block). None: on XLA:CPU with the platform's CPU kernels (complex64) one
        kernel for the sums and the Woodbury step (no `[H, N/2, J]` array in memory); elsewhere
        jnp in blocks of about `CAUCHY_BLOCK_ELEMS` elements.

    Returns:
      real `[..., channels, length]`.
    """
    ct = _complex_dtype(Lambda, P, B, C, log_dt)
    rt = jnp.float64 if ct == jnp.complex128 else jnp.float32
    Lambda, P, B, C = (x.astype(ct) for x in (Lambda, P, B, C))
    lead = C.shape[:-2]
    c = C.reshape((-1,) + C.shape[-2:])  # [c, H, N]
    dt = jnp.exp(log_dt.astype(rt))
    j = jnp.arange(length // 2 + 1, dtype=rt)
    z = jnp.exp(jax.lax.complex(jnp.zeros_like(j), -2 * math.pi / length * j))  # nodes
    Pc = jnp.conj(P)
    v = jnp.concatenate([c * B, c * P, (Pc * B)[None], (Pc * P)[None]], axis=0)
    k_f = _spectrum(v, Lambda, dt, z, cauchy_chunk)  # [c, H, J]
    k = jnp.fft.irfft(k_f, n=length, axis=-1)
    return k.reshape(lead + k.shape[-2:])


def s4_full(*halves):
    """Concatenates each half-stored vector `[..., N/2]` with its conjugate -> `[..., N]`."""
    out = tuple(jnp.concatenate([x, jnp.conj(x)], axis=-1) for x in halves)
    return out if len(out) > 1 else out[0]


def s4_dense(Lambda, P, B, log_dt):
    """Dense bilinear discretisation of the full system: dA `[H, N, N]`, dB `[H, N]`.

    dA = (I - dt/2 A)^{-1} (I + dt/2 A), dB = (I - dt/2 A)^{-1} dt B, A = diag(Lambda) - P P^*.
    """
    ct = _complex_dtype(Lambda, P, B, log_dt)
    lam, p, b = (x.astype(ct) for x in s4_full(Lambda, P, B))
    n = lam.shape[-1]
    A = jax.vmap(jnp.diag)(lam) - p[:, :, None] * jnp.conj(p)[:, None, :]
    dt = jnp.exp(log_dt).astype(ct)[:, None, None]
    eye = jnp.eye(n, dtype=ct)
    m = eye - dt / 2 * A
    dA = jnp.linalg.solve(m, eye + dt / 2 * A)
    dB = jnp.linalg.solve(m, (dt[..., 0] * b)[..., None])[..., 0]
    return dA, dB


def _matrix_power(a, k):
    """a^k for square matrices `[..., N, N]` by repeated squaring (k static)."""
    result = None
    base = a
    while k:
        if k & 1:
            result = base if result is None else result @ base
        k >>= 1
        if k:
            base = base @ base
    return result if result is not None else jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)


def s4_output_matrix(Lambda, P, B, C, log_dt, length=None):
    """Full output matrix C `[..., H, N]` of the recurrence from C tilde `[..., H, N/2]`.

    C = C~ (I - dA^length)^{-1}; with length None the infinite-length limit C = C~ is used.
    """
    c = s4_full(C)
    if length is None:
        return c
    dA, _ = s4_dense(Lambda, P, B, log_dt)
    n = dA.shape[-1]
    m = jnp.eye(n, dtype=dA.dtype) - _matrix_power(dA, int(length))  # [H, N, N]
    # row vector c solves c m = c~  <=>  m^T c^T = c~^T
    mt = jnp.swapaxes(m, -1, -2)
    cc = c.astype(dA.dtype)
    flat = cc.reshape((-1,) + cc.shape[-2:])
    out = jax.vmap(lambda ci: jnp.linalg.solve(mt, ci[..., None])[..., 0])(flat)
    return out.reshape(cc.shape)


def s4_step(x, u, Lambda, P, B, log_dt):
    """One bilinear step x <- dA x + dB u of the full DPLR system in O(N) per channel.

    Woodbury: (I - dt/2 A)^{-1} = D - D p (2/dt + p^* D p)^{-1} p^* D with D = (1 - dt/2 Lambda)^{-1}
    (applied to r = (I + dt/2 A) x + dt B u), so no dense matrix is formed.

    Args:
      x: complex `[batch, H, N]` full state; u: real `[batch, H]`.
      Lambda, P, B: complex `[H, N/2]`; log_dt `[H]`.
    """
    lam, p, b = s4_full(Lambda, P, B)
    dt = jnp.exp(log_dt)[:, None].astype(lam.dtype)
    pc = jnp.conj(p)
    ax = lam * x - p * jnp.sum(pc * x, axis=-1, keepdims=True)
    r = x + dt / 2 * ax + dt * b * u[..., None].astype(lam.dtype)
    d = 1 / (1 - dt / 2 * lam)
    dr = d * r
    denom = 2 / dt + jnp.sum(pc * d * p, axis=-1, keepdims=True)
    return dr - d * p * (jnp.sum(pc * dr, axis=-1, keepdims=True) / denom)


def s4_recurrent_kernel(Lambda, P, B, C, log_dt, length):
    """Reference for `s4_kernel` (C `[H, N/2]`): K_k = Re(C dA^k dB) with the dense matrices,
    C = C~ (I - dA^L)^{-1}, stepped k = 0..L-1."""
    dA, dB = s4_dense(Lambda, P, B, log_dt)
    c = s4_output_matrix(Lambda, P, B, C, log_dt, length)

    def step(x, _):
        return jnp.einsum("hij,hj->hi", dA, x), jnp.sum(c * x, axis=-1).real

    _, k = jax.lax.scan(step, dB, None, length=length)
    return k.T
