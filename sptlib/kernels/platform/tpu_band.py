"""The backward pass of banded attention on TPU: one fused Pallas kernel, head_dim-compact.

Splash attention's fused backward writes a partial dQ for *every* key block of the grid,
`[length / block_kv, heads, length, head_dim]`, head_dim minor: a head_dim of 32 is padded to 128
lanes in HBM, and XLA then sums the partials. On PathX (L 16,384, window 4,096, head_dim 32)
that is 1.07 GB written and 1.14 GB read per layer and chip — more HBM traffic than the rest of
the layer. For a band `lo <= q - k <= hi` (a local window, causal or not) a query block only
ever meets the few key blocks of its band, so this kernel

- walks the grid `(heads, key block j, slot t)` where slot t is the t-th query block of key
  block j's band (`i = j + first + t`): only the band's blocks, no block-sparse metadata;
- keeps q, k, v, dO, dQ, dK, dV sequence-minor (`[heads, head_dim, length]`: nothing padded);
- writes dQ's partial for query block i from key block j into slot `t = i - j - first`, so
  there are `slots` partials (the band's width in blocks: 9 at PathX's shape with 512-blocks)
  instead of `length / block_kv` (16), and XLA sums them with the slots no key block wrote
  (the band's ends) masked out.

Per computed (query, key) pair it does splash's fused work: QK^T, P = exp(S - lse), dV += P^T dO,
dP = V^T dO, dS = P (dP - di), dK += dS^T Q, dQ = dS K: 10 head_dim FLOPs and one exp. The
forward stays splash's (its log-sum-exp residual feeds this kernel).

Shapes (one batch element; `vmap` adds the batch): q, k, v, o (the forward's output), do
`[heads, head_dim, length]` with q pre-scaled, lse `[heads, 8, length]` float32 (8 sublane
copies), kv_valid `[length, 128]` int32 (lane copies of the key mask); length a multiple of
`block`. di = rowsum(dO * O) is formed in the kernel from the sequence-minor o and dO (an XLA
product of splash's head_dim-minor output with dO materialised a float32 copy of dO in the
padded layout: 0.35 GB of traffic per PathX layer).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

LANES, SUBLANES = 128, 8
# Flash FLOPs per computed (query, key) pair and head_dim unit (see the module docstring).
FLOPS_PER_PAIR = 10


def band_limits(causal, window):
    """`(lo, hi)`: the pairs the mask keeps are `lo <= q - k <= hi` (window > 0)."""
    return (0 if causal else -window), window


def band_slots(block, lo, hi):
    """(first, slots): key block j meets query blocks `j + first ... j + first + slots - 1`."""
    first = lo // block  # floor
    last = (block - 1 + hi) // block
    return first, last - first + 1


def computed_pairs(length, block, lo, hi) -> int:
    """(query, key) pairs the kernel computes per head: block x block per in-range grid step."""
    n = length // block
    first, slots = band_slots(block, lo, hi)
    j = np.arange(n)[:, None]
    i = j + first + np.arange(slots)[None, :]
    return int(np.count_nonzero((i >= 0) & (i < n))) * block * block


def _kernel(q_ref, k_ref, v_ref, o_ref, do_ref, lse_ref, kv_ref,
            dq_ref, dk_ref, dv_ref, dk_acc, dv_acc, *, block, first, slots, n_blocks, lo, hi):
    j, t = pl.program_id(1), pl.program_id(2)
    i = j + first + t

    @pl.when(t == 0)
    def _init():
        dk_acc[...] = jnp.zeros_like(dk_acc)
        dv_acc[...] = jnp.zeros_like(dv_acc)

    @pl.when((i >= 0) & (i < n_blocks))
    def _compute():
        q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]  # [head_dim, block]
        # di = rowsum(dO * O) of the query block, [1, block_q] (recomputed per key block:
        # head_dim x block multiply-adds, against the 5 block x block x head_dim products).
        di = jnp.sum(o_ref[...].astype(jnp.float32) * do.astype(jnp.float32), axis=0,
                     keepdims=True)
        # Scores with keys on sublanes and queries on lanes: [block_k, block_q].
        s = lax.dot(k.T, q, preferred_element_type=jnp.float32)
        kpos = j * block + lax.broadcasted_iota(jnp.int32, s.shape, 0)
        qpos = i * block + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        keep = ((qpos - kpos) >= lo) & ((qpos - kpos) <= hi)
        valid = jnp.tile(kv_ref[...], (1, block // LANES)) != 0  # [block_k, block_q]
        p = jnp.where(keep & valid, jnp.exp(s - lse_ref[:1, :]), 0.0)
        nt = (((1,), (1,)), ((), ()))
        dv_acc[...] += lax.dot_general(do, p.astype(do.dtype), nt,
                                       preferred_element_type=jnp.float32)
        dp = lax.dot(v.T, do, preferred_element_type=jnp.float32)
        ds = (p * (dp - di)).astype(q.dtype)
        dk_acc[...] += lax.dot_general(q, ds, nt, preferred_element_type=jnp.float32)
        dq_ref[...] = lax.dot(k, ds, preferred_element_type=jnp.float32).astype(dq_ref.dtype)

    @pl.when(t == slots - 1)
    def _write():
        dk_ref[...] = dk_acc[...].astype(dk_ref.dtype)
        dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


@functools.partial(jax.jit, static_argnames=("causal", "window", "block", "interpret"))
def band_attention_bwd(q, k, v, o, do, lse, kv_valid, *, causal, window, block=512,
                       interpret=False):
    """dq, dk, dv `[heads, head_dim, length]` of one batch element (module docstring)."""
    heads, head_dim, length = q.shape
    if length % block or block % LANES:
        raise ValueError(f"length {length} must be a multiple of block {block} (of {LANES})")
    n = length // block
    lo, hi = band_limits(causal, window)
    first, slots = band_slots(block, lo, hi)

    def q_block(h, j, t):
        return jnp.clip(j + first + t, 0, n - 1)

    def dq_block(h, j, t):  # out-of-range steps write a spare block past the end
        i = j + first + t
        return jnp.where((i >= 0) & (i < n), i, n)

    seq = lambda index: pl.BlockSpec((None, head_dim, block), index)
    row = lambda index: pl.BlockSpec((None, SUBLANES, block), index)
    kv_seq = seq(lambda h, j, t: (h, 0, j))
    q_seq = seq(lambda h, j, t: (h, 0, q_block(h, j, t)))
    q_row = row(lambda h, j, t: (h, 0, q_block(h, j, t)))
    f32 = jnp.float32
    out_shape = (jax.ShapeDtypeStruct((slots, heads, head_dim, length + block), q.dtype),
                 jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype))
    out_specs = (pl.BlockSpec((None, None, head_dim, block),
                              lambda h, j, t: (t, h, 0, dq_block(h, j, t))),
                 kv_seq, kv_seq)
    in_specs = (q_seq, kv_seq, kv_seq, q_seq, q_seq, q_row,
                pl.BlockSpec((block, LANES), lambda h, j, t: (j, 0)))
    pairs = heads * computed_pairs(length, block, lo, hi)
    operands = (q, k, v, o, do, lse, kv_valid)
    nbytes = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in operands)
    nbytes += sum(int(np.prod(o.shape)) * np.dtype(o.dtype).itemsize for o in out_shape[:3])
    kernel = functools.partial(_kernel, block=block, first=first, slots=slots, n_blocks=n,
                               lo=lo, hi=hi)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=0, grid=(heads, n, slots), in_specs=in_specs, out_specs=out_specs,
        scratch_shapes=[pltpu.VMEM((head_dim, block), f32)] * 2)  # dK, dV accumulators
    dq_parts, dk, dv = pl.pallas_call(
        kernel, grid_spec=grid_spec, out_shape=out_shape, name="sptlib_band_attention_bwd",
        interpret=interpret,
        # Heads and key blocks are independent (a megacore chip splits them over its two
        # cores); the slots of one key block accumulate its dK, dV.
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        cost_estimate=pl.CostEstimate(flops=FLOPS_PER_PAIR * head_dim * pairs,
                                      transcendentals=pairs, bytes_accessed=nbytes),
    )(*operands)
    # Slot t of query block i came from key block i - first - t; slots whose key block is
    # outside the sequence were never written.
    i = jnp.arange(length) // block
    t = jnp.arange(slots)[:, None]
    written = ((i[None] - first - t) >= 0) & ((i[None] - first - t) < n)  # [slots, length]
    parts = dq_parts[..., :length].astype(f32)
    dq = jnp.sum(jnp.where(written[:, None, None, :], parts, 0.0), axis=0).astype(q.dtype)
    return dq, dk, dv
