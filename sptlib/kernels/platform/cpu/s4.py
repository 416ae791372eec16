"""S4's generating function on XLA:CPU: the Cauchy sums with every denominator in registers,
then the Woodbury step, in one C++ kernel (`cauchy.cc`); complex64 only.

`spectrum(v, lam, dt, z)` equals `sptlib.kernels.s4`'s jnp `_woodbury(_cauchy_conj(...))`
(`[2c+2, H, N]`, `[H, N]`, `[H]`, `[J]` -> `[c, H, J]`), forward and backward, without an
`[H, N/2, J]` array in memory; `sptlib.kernels.s4` lowers it for the CPU platform only.
"""

import jax
import jax.numpy as jnp

from sptlib.kernels.platform.cpu import build

# ---------------------------------------------------------------------------------------------

_S4_FWD, _S4_BWD = "sptlib_s4_spectrum_fwd", "sptlib_s4_spectrum_bwd"


def _parts(*xs):
    return [p for x in xs for p in (jnp.real(x), jnp.imag(x))]


def _spectrum_kernel_fwd(vr, vi, lr, li, ar, ai, br, bi):
    k, h, j = vr.shape[0], vr.shape[1], ar.shape[1]
    out = (jax.ShapeDtypeStruct((k // 2 - 1, h, j), jnp.complex64),
           jax.ShapeDtypeStruct((k, h, j), jnp.complex64))
    return jax.ffi.ffi_call(_S4_FWD, out, vmap_method="sequential")(
        vr, vi, lr, li, ar, ai, br, bi)


def _spectrum_kernel_bwd(vr, vi, lr, li, ar, ai, br, bi, s, g):
    out = [jax.ShapeDtypeStruct(x.shape, jnp.float32) for x in (vr, vi, lr, li, ar, ai, ar, ai)]
    return jax.ffi.ffi_call(_S4_BWD, tuple(out), vmap_method="sequential")(
        vr, vi, lr, li, ar, ai, br, bi, s, g)


# Channels may be sharded (each channel's sums are its own); the rest is gathered.
_KHN, _HN, _HJ, _J, _KHJ = ("k", "h", "n"), ("h", "n"), ("h", "j"), ("j",), ("k", "h", "j")
_CHJ = ("c", "h", "j")
_ARGS = (_KHN, _KHN, _HN, _HN, _HJ, _HJ, _J, _J)
_spectrum_fwd_op = build.partitioned(_spectrum_kernel_fwd, _ARGS, (_CHJ, _KHJ),
                                      replicated=("k", "n", "j", "c"), n_static=0)
_spectrum_bwd_op = build.partitioned(_spectrum_kernel_bwd, _ARGS + (_KHJ, _CHJ),
                                      (_KHN, _KHN, _HN, _HN, _HJ, _HJ, _HJ, _HJ),
                                      replicated=("k", "n", "j", "c"), n_static=0)


@jax.custom_vjp
def _native_spectrum(v, lam, a, b):
    """`_woodbury` of the sums 2 sum_n v / (a - b lam) + conj(v) / (a - b conj(lam)), with
    h = b / 2: `[2c+2, H, N]`, `[H, N]`, `[H, J]`, `[J]` (complex64, J a multiple of 16)
    -> `[c, H, J]`."""
    return _spectrum_fwd_op(*_parts(v, lam, a, b))[0]


def _native_spectrum_fwd(v, lam, a, b):
    kf, s = _spectrum_fwd_op(*_parts(v, lam, a, b))
    return kf, (v, lam, a, b, s)


def _native_spectrum_bwd(res, g):
    v, lam, a, b, s = res
    out = _spectrum_bwd_op(*_parts(v, lam, a, b), s, g.astype(jnp.complex64))
    ct_v, ct_lam, ct_a, ct_b = (jax.lax.complex(out[i], out[i + 1]) for i in range(0, 8, 2))
    return ct_v, ct_lam, ct_a, jnp.sum(ct_b, axis=0)  # ct_b per channel, b shared


_native_spectrum.defvjp(_native_spectrum_fwd, _native_spectrum_bwd)


def spectrum(v, lam, dt, z):
    """`_woodbury(_cauchy_conj_dense(...))` by the native kernel: the nodes padded to a multiple
    of its 16 lanes (by repeating the last one, whose denominators are finite wherever the result
    is), the result cut back."""
    nodes = z.shape[0]
    pad = -nodes % 16
    a = jnp.pad((2.0 / dt)[:, None] * (1 - z), ((0, 0), (0, pad)), mode="edge")  # [H, J]
    b = jnp.pad(1 + z, (0, pad), mode="edge")
    return _native_spectrum(v, lam, a, b)[..., :nodes]


