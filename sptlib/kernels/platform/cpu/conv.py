"""The SSMs' long convolution on XLA:CPU: a multi-threaded C++ FFT (`fft_conv.cc`), float32.

`circular_conv(u, kc)` equals `irfft(rfft(u, n) * rfft(kc))[:, :length]` for u `[batch, length,
channels]` and a circular kernel kc `[channels, n]` (n a power of two >= 2 length), forward and
backward; `sptlib.kernels.conv` lowers it for the CPU platform only.
"""

import jax
import jax.numpy as jnp

from sptlib.kernels.platform.cpu import build


_CONV_FWD, _CONV_BWD = "sptlib_fft_conv_fwd", "sptlib_fft_conv_bwd"


def _conv_kernel_fwd(u, kc):
    return (jax.ffi.ffi_call(_CONV_FWD, jax.ShapeDtypeStruct(u.shape, jnp.float32),
                             vmap_method="sequential")(u, kc),)


def _conv_kernel_bwd(u, kc, dy):
    return jax.ffi.ffi_call(
        _CONV_BWD, (jax.ShapeDtypeStruct(u.shape, jnp.float32),
                    jax.ShapeDtypeStruct(kc.shape, jnp.float32)),
        vmap_method="sequential")(u, kc, dy)


# Batch and channels may be sharded; length and FFT size are gathered. The kernel gradient is a
# sum over the batch, so batch shards' partial sums are added.
_BLH, _HN = ("b", "l", "h"), ("h", "n")
_conv_fwd_op = build.partitioned(_conv_kernel_fwd, (_BLH, _HN), (_BLH,), replicated=("l", "n"),
                                  n_static=0)
_conv_bwd_op = build.partitioned(_conv_kernel_bwd, (_BLH, _HN, _BLH), (_BLH, _HN),
                                  replicated=("l", "n"), n_static=0, summed={1: "b"})


@jax.custom_vjp
def _native_circular_conv(u, kc):
    return _conv_fwd_op(u, kc)[0]


def _native_fwd(u, kc):
    return _conv_fwd_op(u, kc)[0], (u, kc)


def _native_bwd(res, dy):
    u, kc = res
    return tuple(_conv_bwd_op(u, kc, dy.astype(jnp.float32)))


_native_circular_conv.defvjp(_native_fwd, _native_bwd)




def circular_conv(u, kc):
    """`[batch, length, channels]`, `[channels, n]` -> `[batch, length, channels]` float32."""
    return _native_circular_conv(u.astype(jnp.float32), kc.astype(jnp.float32))
