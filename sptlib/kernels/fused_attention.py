"""Fused softmax attention for XLA:CPU: a C++ XLA FFI kernel, forward and FlashAttention-2 backward.

`fused_attention(q, k, v, key_mask, causal=, window=)` computes exactly the function of
`sptlib.kernels.attention.dot_product_attention` (`q, k, v: [batch, length, heads, head_dim]`, q
pre-scaled; `key_mask: [batch, length]`, True = real) without writing the
`[batch, heads, length, length]` score matrix: each (batch, head) pair is one task on XLA's
intra-op thread pool that keeps a block of score rows in cache. On the 2-core test machine
XLA:CPU runs the score and value products of small heads (d = 16, L = 256) at ~18 GFLOP/s because
the score matrix round-trips through memory; this kernel is why the CPU-sized Transformer configs
use `model.attention.impl = "fused"`.

The kernel is C++ (`sptlib/kernels/cpu/fused_attention.cc`), compiled on first use
(`sptlib.kernels.native`). Where it is unavailable, or on any backend but CPU, the jnp
`dot_product_attention` runs instead (the same function). Computation is float32; other input
dtypes are cast to float32 and the output back to v's dtype.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from sptlib.kernels import attention as jnp_attention
from sptlib.kernels import native

_FWD, _BWD = "sptlib_fused_attention_fwd", "sptlib_fused_attention_bwd"
available = native.available
unavailable_reason = native.unavailable_reason


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
_fwd_op = native.partitioned(_kernel_fwd, (_QKV, _QKV, _QKV, ("b", "l")), (_QKV, _STATS, _STATS),
                             replicated=("l", "d"), n_static=2)
_bwd_op = native.partitioned(
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


def fused_attention(q, k, v, key_mask=None, *, causal=False, window=0):
    """Softmax attention, fused on CPU; same arguments and result as `dot_product_attention`.

    Args:
      q, k, v: `[batch, length, heads, head_dim]` (q pre-scaled by 1/sqrt(head_dim)).
      key_mask: bool `[batch, length]`, True at real keys; padding keys get weight exactly 0.
      causal: query i sees keys j <= i only.
      window: if > 0, query i sees keys with |i - j| <= window (0 <= i - j <= window if causal).
    Returns:
      `[batch, length, heads, head_dim]` in v's dtype.
    """
    plain = functools.partial(jnp_attention.dot_product_attention, causal=causal, window=window)
    if not available():
        return plain(q, k, v, key_mask)
    if key_mask is None:
        key_mask = jnp.ones(q.shape[:2], bool)

    def cpu(q, k, v, key_mask):
        f32 = [a.astype(jnp.float32) for a in (q, k, v)]
        return _fused(*f32, key_mask.astype(bool), bool(causal), int(window)).astype(v.dtype)

    # Chosen when lowering, so the same program compiles for TPU/GPU (e.g. `sptlib.aot`) with
    # the jnp attention there.
    return jax.lax.platform_dependent(q, k, v, key_mask, cpu=cpu, default=plain)
