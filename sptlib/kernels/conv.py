"""FFT convolution of sequences with long (length-L) per-channel kernels.

All functions take activations in the `[batch, length, channels]` layout used by the layers and
do the FFT along the length axis, so no transposes are needed around them.
"""

import functools

import jax.numpy as jnp
import numpy as np

from sptlib.kernels import fftmm, platform
from sptlib.kernels.fftmm import fft_size  # the 5-smooth transform size both paths use


@functools.lru_cache(maxsize=None)
def _real_dtype(dtype):
    return jnp.float64 if dtype == jnp.float64 else jnp.float32


def _pow2(n):
    return 1 << max(0, int(n - 1).bit_length())


def _cpu_kernel_ok(u):
    """Whether the CPU kernel is lowered for CPU (float32; `sptlib.kernels.platform`)."""
    return _real_dtype(u.dtype) == jnp.float32 and platform.cpu_kernels()


def circular_conv(u, kc, d=None):
    """y[b, t] = sum_s u[b, s] kc[:, (t - s) mod n] (+ d * u_t) for t < L, u zero past L.

    Args:
      u: `[batch, length, channels]`.
      kc: `[channels, n]` circular kernel, n >= 2 * length (a causal kernel zero-padded; a
        two-sided one with lag -j at index n - j), so nothing wraps around.
      d: optional `[channels]` skip weights.
    Returns:
      `[batch, length, channels]` in u's dtype. On XLA:CPU with the platform's CPU kernels
      (float32 and n a power of two) the FFTs run in the platform's multi-threaded CPU kernel;
      where `platform.fft_matmul()` (TPU) as DFT matmuls (`fftmm`; n must factor into its
      blocks); elsewhere `jnp.fft`.
    """
    n = kc.shape[-1]
    ct = _real_dtype(u.dtype)
    if platform.fft_matmul():
        y = fftmm.circular_conv(
            u, kc, precision=platform.fft_matmul_precision() or fftmm.DEFAULT_PRECISION)
        if d is not None:
            y = y + d.astype(ct) * u.astype(ct)
        return y.astype(u.dtype)

    def jnp_conv(u, kc):
        k_f = jnp.fft.rfft(kc.astype(ct), axis=-1).T
        return _conv_with_spectrum(u.astype(ct), k_f, n, None)

    if _cpu_kernel_ok(u) and n == _pow2(n):
        y = platform.on_platforms(jnp_conv, u, kc, cpu=platform.cpu_circular_conv)
    else:
        y = jnp_conv(u, kc)
    if d is not None:
        y = y + d.astype(ct) * u.astype(ct)
    return y.astype(u.dtype)


def _conv_with_spectrum(u, k_f, n, d):
    """y = irfft(rfft(u, n) * k_f)[:L] (+ d * u); u [B, L, H], k_f [n//2+1, H]."""
    length = u.shape[1]
    ct = _real_dtype(u.dtype)
    uc = u.astype(ct)
    u_f = jnp.fft.rfft(uc, n=n, axis=1)
    y = jnp.fft.irfft(u_f * k_f, n=n, axis=1)[:, :length]
    if d is not None:
        y = y + d.astype(ct) * uc
    return y.astype(u.dtype)


def fft_conv(u, k, d=None):
    """Causal convolution y_t = sum_{s<=t} k[:, t-s] u_s (+ d * u_t).

    Args:
      u: `[batch, length, channels]` input.
      k: `[channels, length]` kernel (at least `length` long; extra taps are ignored).
      d: optional `[channels]` skip weights.

    Returns:
      `[batch, length, channels]`, in u's dtype (computed in float32 / complex64).

    The FFT size is the smallest fast composite >= 2 * length, so nothing wraps around (on TPU
    the same size as DFT matmuls, `sptlib.kernels.fftmm`).
    """
    length = u.shape[1]
    if platform.fft_matmul():
        n = fftmm.supported_size(2 * length)
        kc = jnp.pad(k[:, :length].astype(_real_dtype(u.dtype)), ((0, 0), (0, n - length)))
        return circular_conv(u, kc, d)
    if _cpu_kernel_ok(u):
        n = _pow2(2 * length)
        kc = jnp.pad(k[:, :length].astype(jnp.float32), ((0, 0), (0, n - length)))
        return circular_conv(u, kc, d)
    n = fft_size(2 * length)
    ct = _real_dtype(u.dtype)
    k_f = jnp.fft.rfft(k[:, :length].astype(ct), n=n, axis=-1).T  # [n//2+1, H]
    return _conv_with_spectrum(u, k_f, n, d)


def bidirectional_kernel(k_fwd, k_bwd, length, n):
    """`[channels, n]` circular two-sided kernel: k_fwd at lags 0..L-1 and k_bwd at -1..-L."""
    ct = jnp.float64 if k_fwd.dtype == jnp.float64 else jnp.float32
    k_fwd = k_fwd[:, :length].astype(ct)
    k_bwd = k_bwd[:, :length].astype(ct)
    h = k_fwd.shape[0]
    # Circular layout: lag j >= 0 at index j; lag -(j+1) at index n-1-j.
    return jnp.concatenate([k_fwd, jnp.zeros((h, n - 2 * length), ct), k_bwd[:, ::-1]], axis=-1)


def bidirectional_kernel_spectrum(k_fwd, k_bwd, length, n):
    """rfft (size n) of the two-sided kernel with k_fwd at lags 0..L-1 and k_bwd at -1..-L."""
    return jnp.fft.rfft(bidirectional_kernel(k_fwd, k_bwd, length, n), axis=-1).T


def fft_conv_bidirectional(u, k_fwd, k_bwd, d=None):
    """Two-sided convolution: a causal kernel plus a second kernel run on the reversed input.

    y_t = sum_{s<=t} k_fwd[:, t-s] u_s + sum_{s>t} k_bwd[:, s-t-1] u_s (+ d * u_t)

    i.e. `k_bwd` is applied causally to the reversed sequence, shifted by one step so the
    current position is counted once (as in state-spaces/s4). Shapes as in `fft_conv`.
    """
    length = u.shape[1]
    if platform.fft_matmul():
        n = fftmm.supported_size(2 * length)
        return circular_conv(u, bidirectional_kernel(k_fwd, k_bwd, length, n), d)
    if _cpu_kernel_ok(u):
        return circular_conv(u, bidirectional_kernel(k_fwd, k_bwd, length, _pow2(2 * length)), d)
    n = fft_size(2 * length)
    return _conv_with_spectrum(u, bidirectional_kernel_spectrum(k_fwd, k_bwd, length, n), n, d)


def ssm_conv(u, k, d=None, *, causal):
    """An SSM layer's long convolution: `k[0]` causally (`fft_conv`), or, bidirectional, `k[0]`
    forward plus `k[1]` on the reversed input (`fft_conv_bidirectional`).

    `u` `[batch, length, channels]`, `k` `[n_dir, channels, length]` (n_dir 1 or 2), `d` an
    optional skip `[channels]` -> `[batch, length, channels]`.
    """
    if causal:
        return fft_conv(u, k[0], d)
    return fft_conv_bidirectional(u, k[0], k[1], d)


def direct_conv(u, k, d=None, k_bwd=None):
    """Reference O(L^2) convolution in NumPy float64 (tests only).

    Same semantics as `fft_conv` (or `fft_conv_bidirectional` when `k_bwd` is given).
    """
    u = np.asarray(u, np.float64)
    k = np.asarray(k, np.float64)
    _, length, _ = u.shape
    y = np.zeros_like(u)
    for t in range(length):
        # causal part: sum_s k[t-s] u_s for s <= t
        y[:, t] = np.einsum("bsh,hs->bh", u[:, :t + 1], k[:, t::-1])
        if k_bwd is not None and t + 1 < length:
            kb = np.asarray(k_bwd, np.float64)
            y[:, t] += np.einsum("bsh,hs->bh", u[:, t + 1:], kb[:, :length - t - 1])
    if d is not None:
        y += np.asarray(d, np.float64) * u
    return y
