"""Long convolutions as matrix products: a four-step (Bailey) DFT with DFT blocks as matmuls.

The SSMs' convolution `y = irfft(rfft(u, n) * rfft(kc, n))[:L]` (`sptlib.kernels.conv`) computed
without an FFT op: n = n1 * n2 * ... * ns with every block n_i <= `MAX_BLOCK` (256: PathX's
n = 32,768 in two stages, 256 x 128; blocks of 128 took three, 32^3, and libtpu's cost model
put that 2.5x slower, all HBM passes), and the length-n DFT done as s stages (Bailey 1990; the Monarch form of FlashFFTConv,
Fu et al. 2023). For t = t1 * M + t2 (t1 < n1, t2 < M = n / n1) and k = k1 + n1 * k2,

    X[k1 + n1 k2] = sum_t2 W_M^(t2 k2) * [W_n^(t2 k1) * sum_t1 W_n1^(t1 k1) x[t1 M + t2]]

so a stage is one matmul by the n1 x n1 DFT matrix along the t1 axis, a twiddle (elementwise)
and the recursion on the remaining M. The spectrum comes out in digit-reversed order; nothing
reorders it, because the convolution only multiplies it elementwise by the kernel's spectrum
computed by the same transform, and the inverse transform (the stages backwards, conjugated)
reads that order. A complex matmul is one real matmul of twice the size ([[A, -B], [B, A]]
against [re; im]); the real input's first stage and the real output's last stage are half of
that. The backward pass is JAX's transpose of these matmuls (again DFT stages).

Precision (`PRECISIONS`; error of the convolution against the float64 FFT, relative RMS over
the output, measured by `tests/test_fft_matmul.py` at n up to 2^17 with float32 inputs):

    float32  f32 matmuls (Precision.HIGHEST; 6 bf16 passes on a TPU)      <= 2e-6
    bf16x3   each operand split into bf16 hi + lo, hi*hi + hi*lo + lo*hi,
             f32 accumulation: traced for a TPU, f32 dots at Precision.HIGH
             (XLA:TPU's bf16_3x, the split inside the MXU); elsewhere the
             three products written out (what the CPU tests measure)        <= 2e-5
    bf16     one bf16 pass, f32 accumulation                               ~ 5e-3 (refused)

`MAX_ERROR` (1e-4) is the bound a precision must keep: bf16 exceeds it at every size (its
operands alone are rounded at 2^-9) and is refused by name. Float64 inputs are computed in
float64 whatever the precision (tests: the algorithm against the FFT to ~1e-12).

Sizes: `supported_size(n)` is the smallest 5-smooth size >= n (`fft_size`, the size the
FFT path pads to) up to `MAX_SIZE` = 2^17 (L = 65,536, padded to 2L); every 5-smooth size
factors into blocks <= 256. Longer sizes are refused with one line.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from sptlib.kernels import platform

MAX_BLOCK = 256
MAX_SIZE = 1 << 17
MAX_ERROR = 1e-4
PRECISIONS = ("float32", "bf16x3", "bf16")
# Relative RMS error against the float64 FFT, the bound each precision is tested to keep.
ERROR_BOUND = {"float32": 2e-6, "bf16x3": 2e-5, "bf16": 1e-2}
DEFAULT_PRECISION = "bf16x3"


def check_precision(precision):
    """`precision` if it is one of PRECISIONS and within MAX_ERROR; else one ValueError line."""
    if precision not in PRECISIONS:
        raise ValueError(f"fft matmul precision {precision!r} not in {PRECISIONS}")
    if ERROR_BOUND[precision] > MAX_ERROR:
        raise ValueError(
            f"fft matmul precision {precision!r} refused: its convolution error (relative RMS "
            f"~{ERROR_BOUND[precision]:g} against the float64 FFT) exceeds the bound "
            f"{MAX_ERROR:g}; use 'bf16x3' or 'float32'")
    return precision


def fft_size(n):
    """Smallest 2^a 3^b 5^c >= n (a length FFT libraries handle fast; the FFT path
    `sptlib.kernels.conv` pads to the same size)."""
    best = 1 << max(0, int(n - 1).bit_length())
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            m = p35
            while m < n:
                m *= 2
            best = min(best, m)
            p35 *= 3
        p5 *= 5
    return best


@functools.lru_cache(maxsize=None)
def supported_size(n):
    """The transform size used for a convolution needing >= n points (5-smooth, <= MAX_SIZE)."""
    m = fft_size(int(n))
    if m > MAX_SIZE:
        raise ValueError(f"fft matmul: transform size {m} (for {n} points) exceeds the largest "
                         f"supported {MAX_SIZE} (sequence length 65,536)")
    return m


@functools.lru_cache(maxsize=None)
def blocks(n):
    """n as a product of DFT blocks, each <= MAX_BLOCK, as few and as even as possible."""
    n = int(n)
    if n < 1:
        raise ValueError(f"fft matmul: size {n} must be positive")
    stages = max(1, math.ceil(math.log(n) / math.log(MAX_BLOCK) - 1e-12))
    while True:
        out = _split(n, stages)
        if out is not None:
            return out
        stages += 1
        if stages > 64:
            raise ValueError(f"fft matmul: size {n} has a prime factor > {MAX_BLOCK}; "
                             f"use supported_size(n)")


def _split(n, stages):
    """n into `stages` factors <= MAX_BLOCK, largest first (None if impossible)."""
    if stages == 1:
        return (n,) if n <= MAX_BLOCK else None
    target = n ** (1.0 / stages)
    divisors = [d for d in range(MAX_BLOCK, 1, -1) if n % d == 0]
    # Prefer the divisor nearest the even split, so later stages stay possible.
    for d in sorted(divisors, key=lambda d: (abs(math.log(d / target)), -d)):
        rest = _split(n // d, stages - 1)
        if rest is not None:
            return tuple(sorted((d,) + rest, reverse=True))
    return None


def _dft_matrix(b, dtype, inverse):
    """The real form [2, b, 2, b] of the b x b DFT: out[p, k] = sum_{q, t} G[p, k, q, t] z[q, t]
    with parts p, q in (re, im); exact integer angles (k t mod b) then cos / sin."""
    kt = (np.arange(b)[:, None] * np.arange(b)[None, :]) % b
    ang = 2 * np.pi * kt / b * (1 if inverse else -1)
    c, s = np.cos(ang), np.sin(ang)
    g = np.stack([np.stack([c, -s], 1), np.stack([s, c], 1)], 0)  # [p, k, q, t]
    return jnp.asarray(g, dtype)


def _twiddle(n1, m, n, dtype, inverse):
    """cos, sin of -+2 pi k1 t2 / n, [n1, m], from the exact integer k1 t2 mod n."""
    kt = (jnp.arange(n1, dtype=jnp.int32)[:, None] * jnp.arange(m, dtype=jnp.int32)[None, :]) % n
    ang = kt.astype(dtype) * jnp.asarray(2 * np.pi / n * (1 if inverse else -1), dtype)
    return jnp.cos(ang), jnp.sin(ang)


def _matmul(spec, g, z, precision):
    """einsum(spec, g, z) at `precision` (float64 operands: float64)."""
    if z.dtype == jnp.float64:
        return jnp.einsum(spec, g.astype(jnp.float64), z,
                          precision=jax.lax.Precision.HIGHEST)
    g = g.astype(jnp.float32)
    if precision == "float32":
        return jnp.einsum(spec, g, z, precision=jax.lax.Precision.HIGHEST)
    bf = jnp.bfloat16

    def dot(a, b):
        return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)

    g_hi, z_hi = g.astype(bf), z.astype(bf)
    if precision == "bf16":
        return dot(g_hi, z_hi)
    if platform.target_platform() == "tpu":
        # The same three products inside the MXU (XLA:TPU's bf16_3x), no split in HBM.
        return jnp.einsum(spec, g, z, precision=jax.lax.Precision.HIGH)
    g_lo = (g - g_hi.astype(jnp.float32)).astype(bf)
    z_lo = (z - z_hi.astype(jnp.float32)).astype(bf)
    return dot(g_hi, z_hi) + (dot(g_hi, z_lo) + dot(g_lo, z_hi))


def _forward(z, sizes, precision):
    """DFT over the axes 2 .. 2+len(sizes) of z [batch, parts, n1, ..., ns, H] (parts 1: real
    input, 2: complex) -> [batch, 2, n1, ..., ns, H], digit-reversed (module docstring)."""
    n1, rest = sizes[0], sizes[1:]
    g = _dft_matrix(n1, z.dtype, inverse=False)[:, :, :z.shape[1]]
    z = _matmul("pkqt,bqt...->bpk...", g, z, precision)
    if not rest:
        return z
    m = math.prod(rest)
    c, s = _twiddle(n1, m, n1 * m, z.dtype, inverse=False)
    shape = (n1,) + tuple(rest) + (1,)
    c, s = c.reshape(shape), s.reshape(shape)
    re, im = z[:, 0], z[:, 1]
    z = jnp.stack([re * c - im * s, re * s + im * c], 1)
    # The remaining digits: the same transform on axes 3.. with k1 as a batch axis.
    b = z.shape[0]
    zr = jnp.moveaxis(z, 2, 1).reshape((b * n1, 2) + z.shape[3:])
    zr = _forward(zr, rest, precision)
    return jnp.moveaxis(zr.reshape((b, n1, 2) + zr.shape[2:]), 1, 2)


def _inverse(z, sizes, precision, real):
    """The inverse of `_forward` without the 1/n: [batch, 2, n1, ..., ns, H] (digit-reversed) ->
    time order, [batch, 1 if real else 2, n1, ..., ns, H] (real: the real part only)."""
    n1, rest = sizes[0], sizes[1:]
    if rest:
        m = math.prod(rest)
        b = z.shape[0]
        zr = jnp.moveaxis(z, 2, 1).reshape((b * n1, 2) + z.shape[3:])
        zr = _inverse(zr, rest, precision, real=False)
        z = jnp.moveaxis(zr.reshape((b, n1, 2) + zr.shape[2:]), 1, 2)
        c, s = _twiddle(n1, m, n1 * m, z.dtype, inverse=True)
        shape = (n1,) + tuple(rest) + (1,)
        c, s = c.reshape(shape), s.reshape(shape)
        re, im = z[:, 0], z[:, 1]
        z = jnp.stack([re * c - im * s, re * s + im * c], 1)
    g = _dft_matrix(n1, z.dtype, inverse=True)
    if real:
        g = g[:1]
    return _matmul("pkqt,bqt...->bpk...", g, z, precision)


def spectrum(x, n, precision=DEFAULT_PRECISION):
    """The digit-reversed length-n DFT of real x [batch, length <= n, H] along axis 1 (zero
    padded): [batch, 2, n1, ..., ns, H] (re, im), as `circular_conv` multiplies it."""
    sizes = blocks(n)
    b, length, h = x.shape
    x = jnp.pad(x, ((0, 0), (0, n - length), (0, 0)))
    return _forward(x.reshape((b, 1) + sizes + (h,)), sizes, precision)


def circular_conv(u, kc, *, precision=DEFAULT_PRECISION, kc_spectrum=None):
    """y[b, t] = sum_s u[b, s] kc[:, (t - s) mod n] for t < L (u zero past L), as DFT matmuls.

    Args:
      u: `[batch, length, channels]` float32 (or float64).
      kc: `[channels, n]` circular kernel, n >= 2 * length and `blocks(n)`-factorable (a causal
        kernel zero-padded; a two-sided one with lag -j at index n - j), so nothing wraps.
      precision: one of PRECISIONS within MAX_ERROR (`check_precision`).
      kc_spectrum: optional `spectrum(kc.T[None], n)`, when the caller already has it.
    Returns:
      `[batch, length, channels]` in the compute dtype (float32, or float64 for float64 u).
    """
    check_precision(precision)
    n = kc.shape[-1]
    ct = jnp.float64 if u.dtype == jnp.float64 else jnp.float32
    length = u.shape[1]
    if n < 2 * length:
        raise ValueError(f"fft matmul: circular kernel of {n} points < 2 x length {length}")
    sizes = blocks(n)
    # The kernel's transform once per call (all channels at once), broadcast over the batch.
    k_f = spectrum(kc.astype(ct).T[None], n, precision) if kc_spectrum is None else kc_spectrum
    u_f = spectrum(u.astype(ct), n, precision)
    ur, ui, kr, ki = u_f[:, 0], u_f[:, 1], k_f[:, 0], k_f[:, 1]
    prod = jnp.stack([ur * kr - ui * ki, ur * ki + ui * kr], 1)
    y = _inverse(prod, sizes, precision, real=True)[:, 0]
    y = y.reshape((u.shape[0], n, u.shape[2]))[:, :length]
    return y * jnp.asarray(1.0 / n, ct)
