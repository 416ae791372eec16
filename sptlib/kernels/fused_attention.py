"""Fused softmax attention for XLA:CPU: a C++ XLA FFI kernel, forward and FlashAttention-2 backward.

`fused_attention(q, k, v, key_mask, causal=, window=)` computes exactly the function of
`sptlib.kernels.attention.dot_product_attention` (`q, k, v: [batch, length, heads, head_dim]`, q
pre-scaled; `key_mask: [batch, length]`, True = real) without writing the
`[batch, heads, length, length]` score matrix: each (batch, head) pair is one task on XLA's
intra-op thread pool that keeps one row of scores in cache. On the 2-core test machine XLA:CPU runs
the score and value products of small heads (d = 16, L = 256) at ~18 GFLOP/s because the score
matrix round-trips through memory; this kernel is why the CPU-sized Transformer configs use
`model.attention.impl = "fused"`.

The kernel is C++ (`sptlib/kernels/cpu/fused_attention.cc`), compiled on first use with the host's
C++ compiler (`$CXX`, else `g++`/`c++`, `-O3 -march=native`) into a cache directory
(`$SPTLIB_KERNEL_CACHE`, else `~/.cache/sptlib/kernels`) keyed by the source, the jaxlib version
and the flags. Where no compiler works, or on any backend but CPU, the jnp `dot_product_attention`
runs instead (the same function; a warning says why, once). Computation is float32; other input
dtypes are cast to float32 and the output back to v's dtype.
"""

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning

from sptlib.kernels import attention as jnp_attention

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu", "fused_attention.cc")
_FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w")
_FWD, _BWD = "sptlib_fused_attention_fwd", "sptlib_fused_attention_bwd"
_lock = threading.Lock()
_state = {}  # "ok": bool, "why": str (set once)


def _compiler():
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cache_dir():
    return os.environ.get("SPTLIB_KERNEL_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "sptlib", "kernels")


def _build():
    """Path of the compiled kernel library (compiling it if needed); raises RuntimeError."""
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found ($CXX, g++, c++ or clang++)")
    with open(_SOURCE, "rb") as f:
        source = f.read()
    import jaxlib
    key = hashlib.sha256(source + repr((jaxlib.__version__, cxx, _FLAGS)).encode()).hexdigest()
    out_dir = _cache_dir()
    lib = os.path.join(out_dir, f"fused_attention-{key[:16]}.so")
    if os.path.exists(lib):
        return lib
    os.makedirs(out_dir, exist_ok=True)
    # Compile to a private name and rename: concurrent processes (pytest -n, compare's jobs)
    # never load a half-written library.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    cmd = [cxx, *_FLAGS, "-I", jax.ffi.include_dir(), _SOURCE, "-o", tmp]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n"
                               f"{proc.stderr[-2000:]}")
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return lib


def available():
    """True once the kernel is compiled, loaded and registered for the CPU platform."""
    with _lock:
        if "ok" not in _state:
            try:
                lib = ctypes.cdll.LoadLibrary(_build())
                for name, symbol in ((_FWD, lib.SptlibFusedAttentionFwd),
                                     (_BWD, lib.SptlibFusedAttentionBwd)):
                    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(symbol), platform="cpu")
                _state.update(ok=True, why="")
            except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as e:
                _state.update(ok=False, why=str(e))
                logging.warning("sptlib fused attention unavailable, using the jnp attention "
                                "(same function, slower on CPU): %s", e)
        return _state["ok"]


def unavailable_reason():
    """Why `available()` is False ('' when it is True)."""
    available()
    return _state["why"]


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
# is independent), length and head_dim are gathered. Without this the partitioner would
# replicate the custom call, i.e. every device would compute the whole batch.
def _spec(arg, dims):
    """PartitionSpec for an operand from the (batch, heads) axes of q's sharding."""
    spec = tuple(getattr(arg.sharding, "spec", ())) + (None,) * 4
    batch, heads = spec[0], spec[2]
    return jax.sharding.PartitionSpec(*[{"b": batch, "h": heads}.get(d) for d in dims])


def _partitioned(kernel, arg_dims, out_dims):
    def partition(causal, window, mesh, arg_shapes, result_shape):
        q = arg_shapes[0]
        named = lambda dims: jax.sharding.NamedSharding(mesh, _spec(q, dims))
        args = tuple(named(d) for d in arg_dims)
        outs = tuple(named(d) for d in out_dims)
        return mesh, lambda *a: kernel(*a, causal, window), outs, args

    def infer(causal, window, mesh, arg_shapes, result_shape):
        return tuple(jax.sharding.NamedSharding(mesh, _spec(arg_shapes[0], d))
                     for d in out_dims)

    op = custom_partitioning(kernel, static_argnums=(len(arg_dims), len(arg_dims) + 1))
    rule = (", ".join(" ".join(d) for d in arg_dims) + " -> "
            + ", ".join(" ".join(d) for d in out_dims))
    op.def_partition(partition, infer_sharding_from_operands=infer, sharding_rule=rule,
                     need_replication_factors=("l", "d"))
    return op


_QKV = ("b", "l", "h", "d")
_STATS = ("b", "h", "l")
_fwd_op = _partitioned(_kernel_fwd, (_QKV, _QKV, _QKV, ("b", "l")), (_QKV, _STATS, _STATS))
_bwd_op = _partitioned(_kernel_bwd, (_QKV, _QKV, _QKV, ("b", "l"), _QKV, _STATS, _STATS, _QKV),
                       (_QKV, _QKV, _QKV))


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
