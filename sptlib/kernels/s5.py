"""S5 (Smith, Warrington & Linderman 2023, 'Simplified state space layers for sequence
modeling'): one MIMO diagonal SSM over all channels, run with a parallel scan.

x_k = dLambda x_{k-1} + dB u_k,  y_k = 2 Re(C x_k) (+ D u_k), state P in conjugate pairs
(P/2 stored), per-state step dt.
"""

import jax
import jax.numpy as jnp

from sptlib.kernels.diagonal import _complex_dtype


def s5_discretize(Lambda, B, log_dt, discretization="zoh"):
    """(dLambda `[P/2]`, dB `[P/2, H]`) from Lambda `[P/2]`, B `[P/2, H]`, log_dt `[P/2]`."""
    ct = _complex_dtype(Lambda, B, log_dt)
    Lambda = Lambda.astype(ct)
    dt = jnp.exp(log_dt).astype(ct)
    dtL = dt * Lambda
    if discretization == "zoh":
        return jnp.exp(dtL), (jnp.expm1(dtL) / Lambda)[:, None] * B.astype(ct)
    if discretization == "bilinear":
        return (1 + dtL / 2) / (1 - dtL / 2), (dt / (1 - dtL / 2))[:, None] * B.astype(ct)
    raise ValueError(f"unknown discretization {discretization!r} (zoh | bilinear)")


def s5_input(dB, u):
    """dB u_k for all k: u real `[batch, length, H]` -> complex `[batch, length, P/2]`
    (two real matmuls rather than a complex one)."""
    ut = u.astype(dB.real.dtype)
    return jax.lax.complex(ut @ dB.real.T, ut @ dB.imag.T)


def s5_output(C, x):
    """2 Re(C x_k): C complex `[H, P/2]`, x `[batch, length, P/2]` -> real `[batch, length, H]`."""
    return 2 * (x.real @ C.real.T - x.imag @ C.imag.T)


def _combine(left, right):
    a1, b1 = left
    a2, b2 = right
    return a1 * a2, a2 * b1 + b2


def s5_scan(dLambda, bu, reverse=False):
    """Parallel scan (jax.lax.associative_scan) of x_k = dLambda x_{k-1} + bu_k, x_{-1} = 0.

    Args:
      dLambda: complex `[P/2]`.
      bu: complex `[batch, length, P/2]`.
      reverse: scan from the end (x_k = dLambda x_{k+1} + bu_k).

    Returns:
      states complex `[batch, length, P/2]`.
    """
    a = jnp.broadcast_to(dLambda.astype(bu.dtype), bu.shape)
    _, x = jax.lax.associative_scan(_combine, (a, bu), axis=1, reverse=reverse)
    return x


def s5_recurrent(dLambda, bu, reverse=False):
    """Reference sequential scan (jax.lax.scan), same contract as `s5_scan`."""
    def step(x, b):
        x = dLambda * x + b
        return x, x

    x0 = jnp.zeros((bu.shape[0], bu.shape[2]), bu.dtype)
    _, x = jax.lax.scan(step, x0, jnp.swapaxes(bu, 0, 1), reverse=reverse)
    return jnp.swapaxes(x, 0, 1)
