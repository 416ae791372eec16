"""Diagonal SSM kernels (S4D, DSS, DLR) and their recurrent references.

A diagonal SSM with modes z_n = exp(log_z_n) has the kernel K_k = Re sum_n c_n z_n^k. We
evaluate it without materialising the `[channels, state, length]` Vandermonde tensor: with
k = q*m + r, z^k = z^r * (z^m)^q, so the sum is a batched matmul of `[state, m]` and
`[state, L/m]` factors (m ~ sqrt(L)), whose exps cost O(state * sqrt(L)) per channel. Each
factor is computed by `exp` of the exact exponent (no repeated products), so the accuracy is that
of the direct formula.
"""

import math

import jax
import jax.numpy as jnp


def _complex_dtype(*xs):
    return jnp.complex128 if any(jnp.asarray(x).dtype in (jnp.complex128, jnp.float64)
                                 for x in xs) else jnp.complex64


def vandermonde_sum(coef, log_z, length):
    """K[..., h, k] = Re sum_n coef[..., h, n] * exp(k * log_z[h, n]) for k in [0, length).

    Args:
      coef: complex `[..., channels, state]`.
      log_z: complex `[channels, state]`, or `[state]` for modes shared by all channels.
        Real parts should be <= 0 (|z| <= 1) so the factors do not overflow.
      length: static int.

    Returns:
      real `[..., channels, length]`.
    """
    ct = _complex_dtype(coef, log_z)
    coef = coef.astype(ct)
    log_z = log_z.astype(ct)
    rt = jnp.float64 if ct == jnp.complex128 else jnp.float32
    if log_z.ndim == 1:
        # Modes shared by every channel (DLR): the full Vandermonde matrix is only
        # [state, length], so one plain [channels, 2N] x [2N, length] matmul. XLA:CPU runs it
        # 4-5x faster (forward + backward, N = 1,024, L = 256-1,024) than the blocked
        # contraction below, whose batched dot it lowers poorly.
        z = jnp.exp(log_z[:, None] * jnp.arange(length, dtype=rt))  # [N, L]
        a2 = jnp.concatenate([coef.real, -coef.imag], axis=-1)  # [..., H, 2N]
        return jnp.einsum("...hn,nl->...hl", a2, jnp.concatenate([z.real, z.imag], axis=0))
    # Per-channel modes: a [H, N, L] Vandermonde tensor would be large, so factor
    # k = q m + r (m ~ sqrt(L)): exp(k log z) = exp(r log z) exp(q m log z).
    m = 1 << max(0, math.ceil(math.log2(math.sqrt(length))))
    q = -(-length // m)
    r_idx = jnp.arange(m, dtype=rt)
    q_idx = jnp.arange(q, dtype=rt) * m
    z_r = jnp.exp(log_z[..., None] * r_idx)  # [(H,) N, m]
    z_q = jnp.exp(log_z[..., None] * q_idx)  # [(H,) N, q]
    a = coef[..., None] * z_r  # [..., H, N, m]
    # Re(a b) = a_re b_re - a_im b_im: one real contraction over 2N.
    a2 = jnp.concatenate([a.real, -a.imag], axis=-2)
    b2 = jnp.concatenate([z_q.real, z_q.imag], axis=-2)
    if log_z.ndim == 1:
        out = jnp.einsum("...hnr,nq->...hqr", a2, b2)
    else:
        out = jnp.einsum("...hnr,hnq->...hqr", a2, b2)
    out = out.reshape(out.shape[:-2] + (q * m,))
    return out[..., :length]


# ----------------------------------------------------------------------------------------------
# S4D
# ----------------------------------------------------------------------------------------------

def s4d_discretize(A, B, log_dt, discretization="zoh"):
    """Discrete (dA, dB) `[channels, state/2]` of the diagonal system dx = A x + B u.

    zoh: dA = exp(dt A), dB = (exp(dt A) - 1) / A * B;
    bilinear: dA = (1 + dt A/2) / (1 - dt A/2), dB = dt B / (1 - dt A/2).
    """
    ct = _complex_dtype(A, B, log_dt)
    A = A.astype(ct)
    B = B.astype(ct)
    dt = jnp.exp(log_dt)[..., None].astype(ct)
    dtA = dt * A
    if discretization == "zoh":
        return jnp.exp(dtA), jnp.expm1(dtA) / A * B
    if discretization == "bilinear":
        return (1 + dtA / 2) / (1 - dtA / 2), dt * B / (1 - dtA / 2)
    raise ValueError(f"unknown discretization {discretization!r} (zoh | bilinear)")


def s4d_kernel(A, B, C, log_dt, length, discretization="zoh"):
    """S4D convolution kernel.

    K_k = 2 Re sum_n C_n dB_n dA_n^k; for ZOH, C_n B_n (exp(dt A_n) - 1) / A_n exp(k dt A_n).

    Args:
      A, B: complex `[channels, state/2]` (one of each conjugate pair).
      C: complex `[..., channels, state/2]` (leading dims, e.g. 2 for bidirectional).
      log_dt: `[channels]`, dt = exp(log_dt).
      length: static int.
      discretization: zoh | bilinear.

    Returns:
      real `[..., channels, length]`.
    """
    ct = _complex_dtype(A, B, C, log_dt)
    dt = jnp.exp(log_dt)[..., None].astype(ct)
    A = A.astype(ct)
    dtA = dt * A
    if discretization == "zoh":
        coef = C * (B * jnp.expm1(dtA) / A)
        log_z = dtA
    elif discretization == "bilinear":
        coef = C * (dt * B / (1 - dtA / 2))
        log_z = jnp.log((1 + dtA / 2) / (1 - dtA / 2))
    else:
        raise ValueError(f"unknown discretization {discretization!r} (zoh | bilinear)")
    return 2 * vandermonde_sum(coef, log_z, length)


def diagonal_step(x, u_t, dA, dB, C):
    """One step of x_t = dA x_{t-1} + dB u_t, y_t = Re sum_n C_n x_t,n (recurrent mode).

    `x` complex `[batch, channels, state]`, `u_t` real `[batch, channels]`, `dA`, `dB`, `C`
    broadcastable to `[channels, state]` -> (y_t real `[batch, channels]`, x_t).
    """
    x = dA * x + dB * u_t[..., None]
    return jnp.sum(C * x, axis=-1).real, x


def diagonal_recurrence(dA, dB, C, u, x0=None):
    """Reference step-by-step scan of x_t = dA x_{t-1} + dB u_t, y_t = Re sum_n C_n x_t,n.

    Args:
      dA, dB: complex `[channels, state]` (or `[state]`, shared).
      C: complex `[channels, state]`.
      u: real `[batch, length, channels]`.
      x0: optional complex `[batch, channels, state]`.

    Returns:
      (y real `[batch, length, channels]`, final state `[batch, channels, state]`).
    """
    ct = _complex_dtype(dA, dB, C)
    batch, _, h = u.shape
    dA = jnp.broadcast_to(dA, C.shape).astype(ct)
    dB = jnp.broadcast_to(dB, C.shape).astype(ct)
    C = C.astype(ct)
    if x0 is None:
        x0 = jnp.zeros((batch,) + C.shape, ct)

    def step(x, u_t):
        y, x = diagonal_step(x, u_t, dA, dB, C)
        return x, y

    x, y = jax.lax.scan(step, x0, jnp.swapaxes(u, 0, 1))
    return jnp.swapaxes(y, 0, 1), x


def impulse_response(dA, dB, C, length):
    """Kernel `[channels, length]` of the diagonal system by running the recurrence on a unit
    impulse in every channel (the independent reference for the convolution kernels)."""
    h = C.shape[-2]
    u = jnp.zeros((h, length, h)).at[jnp.arange(h), 0, jnp.arange(h)].set(1.0)
    y, _ = diagonal_recurrence(dA, dB, C, u)
    return jnp.einsum("hlh->hl", y)


def s4d_recurrent_kernel(A, B, C, log_dt, length, discretization="zoh"):
    """Reference for `s4d_kernel` (one C `[channels, state/2]`) via the recurrent scan."""
    dA, dB = s4d_discretize(A, B, log_dt, discretization)
    return impulse_response(dA, dB, 2 * C, length)


# ----------------------------------------------------------------------------------------------
# DSS
# ----------------------------------------------------------------------------------------------

def dss_kernel(Lambda, W, log_dt, length, version="exp"):
    """DSS kernel (Gupta, Gu & Berant 2022, 'Diagonal state spaces are as effective as
    structured state spaces').

    exp:     K_k = Re sum_n W_n (exp(lambda_n dt) - 1) / lambda_n * exp(k lambda_n dt),
             with Re lambda < 0 (the layer parameterises Re lambda = -exp(.)).
    softmax: the same with exp(k lambda_n dt) replaced by its complex softmax over k in
             [0, length), i.e. divided by sum_j exp(j lambda_n dt); lambda unrestricted.
             Growing modes (Re lambda > 0) are evaluated on the reversed index, so nothing
             overflows.

    Args:
      Lambda: complex `[state]` (shared by all channels, as in DSS) or `[channels, state]`.
      W: complex `[..., channels, state]`.
      log_dt: `[channels]`.
      length: static int.

    Returns:
      real `[..., channels, length]`.
    """
    ct = _complex_dtype(Lambda, W, log_dt)
    Lambda = Lambda.astype(ct)
    dt = jnp.exp(log_dt)[:, None].astype(ct)
    mu = dt * Lambda  # [H, N]
    base = W * (jnp.expm1(mu) / Lambda)
    if version == "exp":
        return vandermonde_sum(base, mu, length)
    if version != "softmax":
        raise ValueError(f"unknown DSS version {version!r} (exp | softmax)")
    grow = mu.real > 0
    nu = jnp.where(grow, -mu, mu)  # Re nu <= 0
    # 1 / sum_{j<L} exp(j mu) = expm1(mu) / expm1(L mu); for growing modes, factor out
    # exp((L-1) mu): exp(k mu) / sum_j exp(j mu) = exp((L-1-k) nu) expm1(nu) / expm1(L nu).
    coef = base * (jnp.expm1(nu) / jnp.expm1(length * nu))
    zero = jnp.zeros((), ct)
    both = jnp.stack([jnp.where(grow, zero, coef), jnp.where(grow, coef, zero)])
    out = vandermonde_sum(both, nu, length)
    return out[0] + out[1][..., ::-1]


def dss_discretize(Lambda, W, log_dt, length=None, version="exp"):
    """Recurrent form of the DSS kernel: (dA, dB, C) `[channels, state]` with
    x_t = dA x_{t-1} + u_t and y_t = Re sum_n C_n x_t,n.

    For `softmax` the normaliser sum_{j<length} exp(j lambda dt) is summed term by term (the
    independent reference for the closed form in `dss_kernel`); `length` is then required.
    """
    ct = _complex_dtype(Lambda, W, log_dt)
    Lambda = Lambda.astype(ct)
    dt = jnp.exp(log_dt)[:, None].astype(ct)
    mu = dt * Lambda
    dA = jnp.broadcast_to(jnp.exp(mu), W.shape[-2:])
    c = W * (jnp.expm1(mu) / Lambda)
    if version == "softmax":
        if length is None:
            raise ValueError("DSS-softmax needs the sequence length for its normaliser")
        k = jnp.arange(length, dtype=mu.real.dtype)
        c = c / jnp.sum(jnp.exp(mu[..., None] * k), axis=-1)
    elif version != "exp":
        raise ValueError(f"unknown DSS version {version!r} (exp | softmax)")
    return dA, jnp.ones_like(dA), c


def dss_recurrent_kernel(Lambda, W, log_dt, length, version="exp"):
    """Reference for `dss_kernel` (W `[channels, state]`) via the recurrent scan."""
    dA, dB, c = dss_discretize(Lambda, W, log_dt, length, version)
    return impulse_response(dA, dB, c, length)


# ----------------------------------------------------------------------------------------------
# DLR
# ----------------------------------------------------------------------------------------------

def dlr_log_lambda(a, theta):
    """log lambda = -a^2 + i theta (so |lambda| = exp(-a^2) < 1)."""
    return jax.lax.complex(-jnp.square(a), theta)


def dlr_kernel(log_lambda, C, length):
    """DLR kernel (Gupta, Mehta & Berant 2022, 'Simplifying and understanding state space
    models with diagonal linear RNNs'): x_k = Lambda x_{k-1} + u_k, y_k = Re(C x_k), so
    K_k = Re sum_n C_n lambda_n^k with Lambda shared across channels.

    Args:
      log_lambda: complex `[state]` (see `dlr_log_lambda`).
      C: complex `[..., channels, state]`.
      length: static int.

    Returns:
      real `[..., channels, length]`.
    """
    return vandermonde_sum(C, log_lambda, length)


def dlr_recurrent_kernel(log_lambda, C, length):
    """Reference for `dlr_kernel` (C `[channels, state]`) via the recurrent scan."""
    dA = jnp.exp(log_lambda)
    return impulse_response(dA, jnp.ones_like(dA), C, length)
