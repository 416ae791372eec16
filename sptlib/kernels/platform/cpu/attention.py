"""Fused softmax attention for XLA:CPU: a C++ XLA FFI kernel, forward and FlashAttention-2 backward.

`attention(q, k, v, key_mask, causal=, window=)` computes exactly the function of
`sptlib.kernels.attention.dot_product_attention` (`q, k, v: [batch, length, heads, head_dim]`, q
pre-scaled; `key_mask: [batch, length]`, True = real) without writing the
`[batch, heads, length, length]` score matrix: each (batch, head) pair is one task on XLA's
intra-op thread pool that keeps a block of score rows in cache. On the 2-core test machine
XLA:CPU runs the score and value products of small heads (d = 16, L = 256) at ~18 GFLOP/s because
the score matrix round-trips through memory; this kernel is what the ``plain`` algorithm runs on
CPU (`sptlib.kernels.platform`).

The kernel is C++ (`fused_attention.cc`), compiled on first use (`build.py`); it is only ever
lowered for the CPU platform (the caller's `jax.lax.platform_dependent`). Computation is float32;
other input dtypes are cast to float32 and the output back to v's dtype.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from sptlib.kernels.platform.cpu import build

_FWD, _BWD = "sptlib_fused_attention_fwd", "sptlib_fused_attention_bwd"


def _attrs(causal, window):
    return dict(causal=np.int64(bool(causal)), window=np.int64(window))


def _kernel_fwd(q, k, v, mask, causal, window):
    """(o, m, l) of one device's shard: o like q, row max and row sum m, l `[batch, heads, L]`."""
    b, length, h, _ = q.shape
    stats = jax.ShapeDtypeStruct((b, h, length), jnp.float32)
    return jax.ffi.ffi_call(_FWD, (jax.ShapeDtypeStruct(q.shape, jnp.float32), stats, stats),
                            vmap_method="sequential")(q, k, v, mask, **_attrs(causal, window))


def _kernel_bwd(q, k, v, mask, o, m, l, d_out, causal, window):
    """(dq, dk, dv) of one device's shard."""
    shape = jax.ShapeDtypeStruct(q.shape, jnp.float32)
    return jax.ffi.ffi_call(_BWD, (shape, shape, shape), vmap_method="sequential")(
        q, k, v, mask, o, m, l, d_out, **_attrs(causal, window))


# Under a mesh the kernels run per shard: batch and heads may be sharded (each (batch, head) pair
# is independent), length and head_dim are gathered.
_QKV = ("b", "l", "h", "d")
_STATS = ("b", "h", "l")
_fwd_op = build.partitioned(_kernel_fwd, (_QKV, _QKV, _QKV, ("b", "l")), (_QKV, _STATS, _STATS),
                             replicated=("l", "d"), n_static=2)
_bwd_op = build.partitioned(
    _kernel_bwd, (_QKV, _QKV, _QKV, ("b", "l"), _QKV, _STATS, _STATS, _QKV), (_QKV, _QKV, _QKV),
    replicated=("l", "d"), n_static=2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _fused(q, k, v, mask, causal, window):
    return _fwd_op(q, k, v, mask, causal, window)[0]


def _fused_fwd(q, k, v, mask, causal, window):
    o, m, l = _fwd_op(q, k, v, mask, causal, window)
    return o, (q, k, v, mask, o, m, l)


def _fused_bwd(causal, window, res, d_out):
    dq, dk, dv = _bwd_op(*res, d_out.astype(jnp.float32), causal, window)
    return dq, dk, dv, None


_fused.defvjp(_fused_fwd, _fused_bwd)


def attention(q, k, v, key_mask, *, causal=False, window=0):
    """Softmax attention by the C++ kernel; same arguments and result as `dot_product_attention`
    (`key_mask` bool `[batch, length]`, required). CPU only: the caller chooses it per platform.
    """
    f32 = [a.astype(jnp.float32) for a in (q, k, v)]
    return _fused(*f32, key_mask.astype(bool), bool(causal), int(window)).astype(v.dtype)
