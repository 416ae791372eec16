"""Attention on TPUs: Pallas splash attention (block-sparse flash attention, forward and backward).

`kernel_for(q, causal=, window=)` returns the function `(q, k, v, key_mask) -> out` (the contract
of `sptlib.kernels.attention.dot_product_attention`: `[batch, length, heads, head_dim]`, q
pre-scaled, key_mask bool `[batch, length]`) that `sptlib.kernels.platform.attention` lowers for
TPU. Splash takes the mask as blocks: full, causal or a local band (`LocalMask`, left/right
window), so its grid visits only the key blocks a query block needs. Key padding becomes segment
ids (real keys segment 1, padding 0, every query 1), lengths are padded to a multiple of 128
with padding keys, and the batch is a `vmap`. Heads narrower than 128 lanes reach splash
sequence-minor (`[heads, head_dim, length]`), so HBM holds them unpadded. A local window's
backward is not splash's but `tpu_band`'s (fed splash's forward residual): it computes only the
band's blocks and writes its partial dQ unpadded and per band slot, not per key block.

A Mosaic kernel cannot be partitioned automatically, so the call runs inside `jax.shard_map`
over the mesh in context: batch and heads stay sharded as the caller's `spec` says
(`PartitionSpec` of `[batch, length, heads, head_dim]`), length and head_dim are whole per
shard.

Cost estimates. XLA's cost model knows nothing about a Pallas call without a `CostEstimate`, and
jax's splash kernels set none, so `install_cost_estimates()` gives each of their calls one: the
work of the blocks its mask computes (non-empty blocks of splash's own block mask x block_q x
block_kv (query, key) pairs; per pair 4 head_dim FLOPs forward, 6 in the dq kernel, 8 in the dkv
kernel or 10 in the fused dkv kernel that also forms dq, one exp each) and the bytes of its
operands and results. A grid step whose block the mask empties runs no matmul (splash skips it),
so it declares nothing: a causal mask declares the lower triangle of blocks, a local window its
band. Over-declaring would not be conservative: libtpu prices a Pallas call at the roofline of
what it declares, so more declared FLOPs lengthen the best-case step *and* add compiler FLOPs.
"""

import functools
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jax.experimental import pallas as pl
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_mask_info as mask_info_lib)

from sptlib.kernels.platform import tpu_band

LANES = 128
# Flash FLOPs per (query, key) pair and head_dim unit, by splash kernel phase: QK^T and PV
# forward; the dq kernel recomputes QK^T, forms dP = dO V^T and dQ; the dkv kernel recomputes
# QK^T, forms dP, dV and dK, and the fused one dQ as well.
PHASE_FLOPS = {"fwd": 4, "dq": 6, "dkv": 8, "dkv_fused": 10}
# Computed (non-empty) blocks per head of each kernel built here, by phase, keyed by the mask
# function splash passes to every one of its Pallas calls (the kernels are cached for the
# process, so the keys stay alive). A mask without a mask function (full) computes every block.
_COMPUTED_BLOCKS = {}


def _block(length):
    """The largest of 512 / 256 / 128 dividing `length` (a multiple of 128)."""
    return next(b for b in (512, 256, 128) if length % b == 0)


def _build_kernel(length, heads, head_dim, causal, window, interpret, save_residuals=False):
    """A splash kernel for `[heads, length, head_dim]` (length a multiple of 128); with
    `save_residuals` it returns `(out, (logsumexp [heads, length],))` and is forward-only."""
    shape = (length, length)
    if window:
        mask = masks.LocalMask(shape, window_size=(window, 0 if causal else window), offset=0)
    elif causal:
        mask = masks.CausalMask(shape)
    else:
        mask = masks.FullMask(shape)
    b = _block(length)
    # The fused backward (one dkv kernel that also forms dq: 10 head_dim FLOPs and one exp per
    # pair, against 6 + 8 FLOPs and two exps for separate dq and dkv kernels) writes a partial
    # dq (q's dtype, head_dim minor: padded to 128 lanes) per key block of the whole grid,
    # [length / block_kv_dkv, heads, length, head_dim], whatever the mask empties, and sums it
    # after; key blocks of 1024 halve that traffic. Separate kernels (18 head_dim FLOPs per
    # pair where the model counts 12) and 2048-key blocks (half the partial dq, more of each
    # band's edge computed) trade one for the other: docs/benchmarks.md has both measured.
    bk = 2 * b if b == 512 and length % (2 * b) == 0 else b
    # Head-dim-minor q/k/v ([heads, length, head_dim]) pad a head_dim under 128 to 128 lanes in
    # HBM (4x the bytes at head_dim 32); sequence-minor ([heads, head_dim, length]) do not.
    layout = (splash.QKVLayout.SEQ_MINOR if head_dim < LANES
              else splash.QKVLayout.HEAD_DIM_MINOR)
    sizes = splash.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b,
                              block_kv_dkv=bk, block_kv_dkv_compute=bk, use_fused_bwd_kernel=True,
                              q_layout=layout, k_layout=layout, v_layout=layout)
    kernel = splash.make_splash_mha(masks.MultiHeadMask([mask] * heads), head_shards=1,
                                    q_seq_shards=1, block_sizes=sizes, interpret=interpret,
                                    save_residuals=save_residuals)
    fn = getattr(mask, "mask_function", None)
    if fn is not None:
        n = computed_blocks(mask, (b, b))
        _COMPUTED_BLOCKS[fn] = {"fwd": n, "dq": n, "dkv": computed_blocks(mask, (b, bk))}
    return kernel


# Splash kernels are cached per shape. The forward-with-residuals kernel of a local window is
# built afresh in each trace instead: inside `jax.shard_map` its mask metadata is traced, and a
# custom_vjp's forward is traced again under differentiation, where a cached one would leak
# the first trace's values (measured: "No constant handler for DynamicJaxprTracer").
_kernel = functools.lru_cache(maxsize=None)(_build_kernel)


def computed_blocks(mask, block_shape) -> int:
    """Blocks of one head's splash `mask` that splash computes at `block_shape`: the non-zero
    entries of the block mask it derives (0 = empty, skipped; 1 = partial; 2 = full)."""
    info, _ = mask_info_lib.process_mask(masks.MultiHeadMask([mask]), block_shape)
    return int(np.count_nonzero(np.asarray(info.block_mask)))


def _splash_call(kernel, q, k, v, key_mask):
    """`kernel` over the batch of head-major q/k/v `[batch, heads, length, head_dim]`;
    key_mask `[batch, length]` (padding keys become segment 0, every query segment 1)."""
    seg = splash.SegmentIds(q=jnp.ones((q.shape[0], q.shape[2]), jnp.int32),
                            kv=key_mask.astype(jnp.int32))
    return jax.vmap(kernel)(q, k, v, segment_ids=seg)


def splash_attention(q, k, v, key_mask, *, causal=False, window=0, interpret=False):
    """One shard's attention by splash (see the module docstring); shapes as the contract."""
    batch, length, heads, head_dim = q.shape
    # Past one block, pad to a multiple of 512: blocks of 512 (and 1024-key dkv blocks) instead
    # of the 128 that e.g. 16,000 allows (whose fused backward writes a partial dQ per 128 keys).
    unit = LANES if length <= 512 else 512
    padded = -(-length // unit) * unit
    if padded != length:
        pad = [(0, 0), (0, padded - length), (0, 0), (0, 0)]
        q, k, v = (jnp.pad(a, pad) for a in (q, k, v))
        key_mask = jnp.pad(key_mask, [(0, 0), (0, padded - length)])
    heads_major = lambda a: a.transpose(0, 2, 1, 3)  # [batch, heads, length, head_dim]
    args = (padded, heads, head_dim, bool(causal), int(window), bool(interpret))
    if window:
        out = _band_attention(args, heads_major(q), heads_major(k), heads_major(v), key_mask)
    else:
        out = _splash_call(_kernel(*args), heads_major(q), heads_major(k), heads_major(v),
                           key_mask)
    return out.transpose(0, 2, 1, 3)[:, :length].astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _band_attention(args, q, k, v, key_mask):
    """A local window: splash's forward, `tpu_band`'s backward (head-major q/k/v
    `[batch, heads, length, head_dim]`; `args` the static arguments of `_kernel`)."""
    return _band_forward(args, q, k, v, key_mask)[0]


def _band_forward(args, q, k, v, key_mask):
    out, (lse,) = _splash_call(_build_kernel(*args, save_residuals=True), q, k, v,
                               key_mask)
    return out, (q, k, v, key_mask, out, lse)


def _band_backward(args, residuals, d_out):
    _, _, _, causal, window, interpret = args
    q, k, v, key_mask, out, lse = residuals
    batch, heads, length, _ = q.shape
    rows = jnp.broadcast_to(lse.astype(jnp.float32)[:, :, None, :],
                            (batch, heads, tpu_band.SUBLANES, length))
    kv_valid = jnp.broadcast_to(key_mask.astype(jnp.int32)[:, :, None],
                                (batch, length, tpu_band.LANES))
    seq_minor = lambda a: a.swapaxes(-1, -2)  # [batch, heads, head_dim, length]
    bwd = functools.partial(tpu_band.band_attention_bwd, causal=causal, window=window,
                            block=_block(length), interpret=interpret)
    grads = jax.vmap(bwd)(seq_minor(q), seq_minor(k), seq_minor(v), seq_minor(out),
                          seq_minor(d_out.astype(q.dtype)), rows, kv_valid)
    return (*(seq_minor(g) for g in grads), None)


_band_attention.defvjp(_band_forward, _band_backward)


def _batch_spec(mesh, batch):
    """Batch over every mesh axis of size > 1 (when they divide it), for callers without a spec."""
    axes = tuple(n for n, s in mesh.shape.items() if s > 1)
    size = int(np.prod([mesh.shape[n] for n in axes])) if axes else 1
    return P(axes if axes and batch % size == 0 else None)


def _divides(mesh, axes, size):
    """`axes` (a mesh axis name, a tuple of them or None) if their sizes divide `size`, else
    None (that dimension whole on every shard, e.g. the batch of 1 that initialisation traces)."""
    names = axes if isinstance(axes, tuple) else (axes,) if axes else ()
    return axes if names and size % int(np.prod([mesh.shape[n] for n in names])) == 0 else None


def kernel_for(q, *, causal, window, spec=None, interpret=False):
    """The splash function for these arguments under the mesh in context (module docstring)."""
    install_cost_estimates()
    call = functools.partial(splash_attention, causal=causal, window=window,
                             interpret=interpret)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return call
    spec = spec if spec is not None else _batch_spec(mesh, q.shape[0])
    b, h = (_divides(mesh, (tuple(spec) + (None,) * 4)[i], q.shape[i]) for i in (0, 2))
    qkv, m = P(b, None, h, None), P(b, None)
    return jax.shard_map(call, in_specs=(qkv, qkv, qkv, m), out_specs=qkv, check_vma=False)


# ---------------------------------------------------------------------------------------------
# Cost estimates for splash's Pallas calls
# ---------------------------------------------------------------------------------------------

def _phase(name):
    return next((p for p in ("fwd", "dq", "dkv") if f"_{p}" in name), None)


def cost_estimate(name, grid, metadata, operands, out_shape, mask_function=None):
    """`pl.CostEstimate` of one splash call (module docstring), or None for an unknown one.

    `grid` is the call's grid (heads first for fwd / dq, second for dkv); `mask_function` the
    one splash passes its kernel (None: a full mask, every block of the grid computed)."""
    phase = _phase(name or "")
    if phase is None or not grid:
        return None
    sizes = json.loads((metadata or {}).get("xprof_metadata", "{}"))
    suffix = "" if phase == "fwd" else f"_{phase}"
    bq, bkv = sizes.get(f"block_q{suffix}"), sizes.get(f"block_kv{suffix}")
    operands = [x for x in jax.tree.leaves(operands) if hasattr(x, "dtype")]
    floats = [x for x in operands if jnp.issubdtype(x.dtype, jnp.floating) and x.ndim >= 2]
    if not bq or not bkv or not floats:
        return None
    heads = grid[1] if phase == "dkv" else grid[0]
    per_head = _COMPUTED_BLOCKS.get(mask_function, {}).get(phase)
    blocks = heads * per_head if per_head is not None else int(np.prod(grid))
    pairs = blocks * bq * bkv
    # q comes [heads, length, head_dim], or [heads, head_dim, length] in splash's SEQ_MINOR
    # layout (xprof_metadata's q_layout 2), its first float operand either way.
    seq_minor = sizes.get("q_layout") == int(splash.QKVLayout.SEQ_MINOR)
    head_dim = floats[0].shape[-2 if seq_minor else -1]
    outs = [o for o in jax.tree.leaves(out_shape) if o is not None]
    # The fused dkv kernel has a fourth float result, dq (dq, dk, dv beside its residuals).
    fused = phase == "dkv" and sum(1 for o in outs if len(o.shape) >= 2
                                   and jnp.issubdtype(o.dtype, jnp.floating)) >= 3
    per_pair = PHASE_FLOPS["dkv_fused" if fused else phase]
    nbytes = sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize for x in operands + outs)
    return pl.CostEstimate(flops=per_pair * head_dim * pairs, transcendentals=pairs,
                           bytes_accessed=nbytes)


def install_cost_estimates():
    """Routes the splash module's `pl.pallas_call` through one that adds `cost_estimate` where
    the call has none (jax's own module is untouched: only splash's reference to `pl`)."""
    if getattr(splash.pl, "sptlib_costed", False):
        return
    real = pl.pallas_call

    def pallas_call(kernel, *args, **kwargs):
        if kwargs.get("cost_estimate") is not None:
            return real(kernel, *args, **kwargs)
        grid = getattr(kwargs.get("grid_spec"), "grid", None) or kwargs.get("grid")

        def call(*operands):
            fn = getattr(kernel, "keywords", {}).get("mask_function")
            est = cost_estimate(kwargs.get("name"), grid, kwargs.get("metadata"), operands,
                                kwargs.get("out_shape"), mask_function=fn)
            return real(kernel, *args, **dict(kwargs, cost_estimate=est))(*operands)

        return call

    shim = types.SimpleNamespace(**{n: getattr(pl, n) for n in dir(pl) if not n.startswith("__")})
    shim.pallas_call, shim.sptlib_costed = pallas_call, True
    splash.pl = shim
