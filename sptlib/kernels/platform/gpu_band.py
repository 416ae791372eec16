"""Flash attention in a band |i - j| <= window on GPUs: a Pallas (Triton) kernel, forward and
backward, that visits only the key blocks the band reaches.

cuDNN takes no right-hand window without a causal mask, so bidirectional local attention (PathX,
Speech Commands) gets this kernel on CUDA. `band_attention(q, k, v, key_mask, window=)` has the
contract of `sptlib.kernels.attention.dot_product_attention` (`[batch, length, heads,
head_dim]`, q pre-scaled, key_mask bool `[batch, length]`). Each program owns one block of
`block` queries of one (batch, head) and loops over the key blocks from `(start - window) //
block` to `(end + window) // block` only: O(length x window) work. The backward is
FlashAttention-2's: the forward saves the output and the per-row log-sum-exp; a dK/dV kernel
loops per key block over the query blocks in reach, a dQ kernel per query block over the key
blocks in reach; probabilities are recomputed block by block, never stored.

Rows that see no real key (a padding query whose whole band is padding) are defined as zero
output with zero gradient; the jnp reference gives them the mean of the values instead. Every
row with at least one real key in its band equals the reference. Lengths are padded to a
multiple of `block` with padding keys, head_dim to a power of two >= 16 (Triton's dot).
`interpret=True` runs the same kernels on CPU (tests).
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

MASK_VALUE = -1e30


def _reach(start, size, window, block, n_blocks):
    """[lo, hi) of the key blocks that queries start..start+size-1 can see in the band."""
    lo = lax.div(jnp.maximum(start - window, 0), block)
    hi = jnp.minimum(lax.div(start + size - 1 + window, block) + 1, n_blocks)
    return lo, hi


def _scores(q, k, q_pos, k_pos, key_ok, window, causal):
    """Scores `[bq, bk]` (float32) and which (query, key) pairs are allowed."""
    s = plgpu.dot(q, k, trans_b=True).astype(jnp.float32)
    diff = q_pos[:, None] - k_pos[None, :]
    allowed = (jnp.abs(diff) <= window) & key_ok[None, :]
    if causal:
        allowed &= diff >= 0
    return jnp.where(allowed, s, MASK_VALUE), allowed


def _fwd_kernel(q_ref, k_ref, v_ref, m_ref, o_ref, lse_ref, *, window, block, causal):
    n_blocks = k_ref.shape[0] // block
    start = pl.program_id(0) * block
    q = q_ref[pl.ds(start, block), :]
    q_pos = start + jnp.arange(block)

    def body(j, carry):
        acc, m, l = carry
        ks = pl.ds(j * block, block)
        s, allowed = _scores(q, k_ref[ks, :], q_pos, j * block + jnp.arange(block),
                             m_ref[ks] != 0, window, causal)
        m_new = jnp.maximum(m, s.max(axis=-1))
        p = jnp.where(allowed, jnp.exp(s - m_new[:, None]), 0.0)
        corr = jnp.exp(m - m_new)
        acc = acc * corr[:, None] + plgpu.dot(p.astype(v_ref.dtype), v_ref[ks, :]).astype(
            jnp.float32)
        return acc, m_new, l * corr + p.sum(axis=-1)

    lo, hi = _reach(start, block, window, block, n_blocks)
    init = (jnp.zeros(q.shape, jnp.float32), jnp.full((block,), MASK_VALUE, jnp.float32),
            jnp.zeros((block,), jnp.float32))
    acc, m, l = lax.fori_loop(lo, hi, body, init)
    seen = l > 0  # False: no real key in the band (module docstring)
    o_ref[...] = jnp.where(seen[:, None], acc / jnp.where(seen, l, 1.0)[:, None],
                           0.0).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), jnp.inf)


def _dkv_kernel(q_ref, k_ref, v_ref, m_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *,
                window, block, causal):
    n_blocks = q_ref.shape[0] // block
    start = pl.program_id(0) * block
    ks = pl.ds(start, block)
    k, v = k_ref[ks, :], v_ref[ks, :]
    k_pos, key_ok = start + jnp.arange(block), m_ref[ks] != 0

    def body(i, carry):
        dk, dv = carry
        qs = pl.ds(i * block, block)
        q, do = q_ref[qs, :], do_ref[qs, :]
        s, allowed = _scores(q, k, i * block + jnp.arange(block), k_pos, key_ok, window,
                             causal)
        p = jnp.where(allowed, jnp.exp(s - lse_ref[qs][:, None]), 0.0)
        dv = dv + plgpu.dot(p.astype(do.dtype), do, trans_a=True).astype(jnp.float32)
        dp = plgpu.dot(do, v, trans_b=True).astype(jnp.float32)
        ds = p * (dp - delta_ref[qs][:, None])
        dk = dk + plgpu.dot(ds.astype(q.dtype), q, trans_a=True).astype(jnp.float32)
        return dk, dv

    lo, hi = _reach(start, block, window, block, n_blocks)
    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = lax.fori_loop(lo, hi, body, (zeros, zeros))
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_kernel(q_ref, k_ref, v_ref, m_ref, do_ref, lse_ref, delta_ref, dq_ref, *, window,
               block, causal):
    n_blocks = k_ref.shape[0] // block
    start = pl.program_id(0) * block
    qs = pl.ds(start, block)
    q, do, lse, delta = q_ref[qs, :], do_ref[qs, :], lse_ref[qs], delta_ref[qs]
    q_pos = start + jnp.arange(block)

    def body(j, dq):
        ks = pl.ds(j * block, block)
        k = k_ref[ks, :]
        s, allowed = _scores(q, k, q_pos, j * block + jnp.arange(block), m_ref[ks] != 0,
                             window, causal)
        p = jnp.where(allowed, jnp.exp(s - lse[:, None]), 0.0)
        dp = plgpu.dot(do, v_ref[ks, :], trans_b=True).astype(jnp.float32)
        return dq + plgpu.dot((p * (dp - delta[:, None])).astype(k.dtype), k).astype(jnp.float32)

    lo, hi = _reach(start, block, window, block, n_blocks)
    dq_ref[...] = lax.fori_loop(lo, hi, body, jnp.zeros(q.shape, jnp.float32)
                                ).astype(dq_ref.dtype)


def _call(kernel, grid_len, length, head_dim, block, outs, interpret, name, n_in):
    """A pallas_call over (blocks, batch x heads): every operand whole per (batch, head) but
    the outputs, one block each. `outs`: [(shape per (batch, head), dtype, per_block)]."""
    whole = lambda shape: pl.BlockSpec((None,) + shape, lambda i, b: (b,) + (0,) * len(shape))
    seq = lambda: whole((length, head_dim))
    in_specs = [seq(), seq(), seq(), whole((length,)), seq(), whole((length,)),
                whole((length,))][:n_in]
    out_specs, out_shape = [], []
    for shape, dtype in outs:
        tail = shape[1:]
        out_specs.append(pl.BlockSpec((None, block) + tail,
                                      lambda i, b, _t=tail: (b, i) + (0,) * len(_t)))
        out_shape.append(jax.ShapeDtypeStruct((grid_len,) + shape, dtype))
    return pl.pallas_call(kernel, grid=(length // block, grid_len), in_specs=in_specs,
                          out_specs=out_specs, out_shape=out_shape, interpret=interpret,
                          compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
                          name=name)


def _layout(q, k, v, key_mask, block):
    """[batch x heads, padded length, padded head_dim] operands and the per-row key mask."""
    batch, length, heads, head_dim = q.shape
    lp, dp = -(-length // block) * block, max(16, pl.next_power_of_2(head_dim))
    rows = lambda a: jnp.pad(a, [(0, 0), (0, lp - length), (0, 0), (0, dp - head_dim)]
                             ).transpose(0, 2, 1, 3).reshape(batch * heads, lp, dp)
    mask = jnp.pad(key_mask.astype(jnp.int32), [(0, 0), (0, lp - length)])
    return rows(q), rows(k), rows(v), jnp.repeat(mask, heads, axis=0), lp, dp


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def band_attention(q, k, v, key_mask, window, causal=False, block=64, interpret=False):
    """Attention restricted to |i - j| <= window (module docstring); shapes as the contract."""
    return _forward(q, k, v, key_mask, window, causal, block, interpret)[0]


def _forward(q, k, v, key_mask, window, causal, block, interpret):
    batch, length, heads, head_dim = q.shape
    qr, kr, vr, mr, lp, dp = _layout(q, k, v, key_mask, block)
    kernel = functools.partial(_fwd_kernel, window=int(window), block=block, causal=causal)
    o, lse = _call(kernel, batch * heads, lp, dp, block,
                   [((lp, dp), q.dtype), ((lp,), jnp.float32)], interpret, "band_fwd", 4
                   )(qr, kr, vr, mr)
    out = o.reshape(batch, heads, lp, dp).transpose(0, 2, 1, 3)[:, :length, :, :head_dim]
    return out.astype(v.dtype), (q, k, v, key_mask, out, lse)


def _fwd_rule(q, k, v, key_mask, window, causal, block, interpret):
    return _forward(q, k, v, key_mask, window, causal, block, interpret)


def _bwd_rule(window, causal, block, interpret, res, dout):
    q, k, v, key_mask, out, lse = res
    batch, length, heads, head_dim = q.shape
    qr, kr, vr, mr, lp, dp = _layout(q, k, v, key_mask, block)
    do = _layout(dout.astype(q.dtype), k, v, key_mask, block)[0]
    # delta_i = sum_d dO_id O_id (FlashAttention-2); rows without a real key have lse = inf,
    # so their probabilities, and every gradient through them, are exactly 0.
    delta = jnp.einsum("bld,bld->bl", do.astype(jnp.float32),
                       _layout(out, k, v, key_mask, block)[0].astype(jnp.float32))
    args = (qr, kr, vr, mr, do, lse, delta)
    opts = dict(window=int(window), block=block, causal=causal)
    dk, dv = _call(functools.partial(_dkv_kernel, **opts), batch * heads, lp, dp, block,
                   [((lp, dp), k.dtype), ((lp, dp), v.dtype)], interpret, "band_dkv", 7)(*args)
    (dq,) = _call(functools.partial(_dq_kernel, **opts), batch * heads, lp, dp, block,
                  [((lp, dp), q.dtype)], interpret, "band_dq", 7)(*args)
    back = lambda a: a.reshape(batch, heads, lp, dp).transpose(0, 2, 1, 3)[
        :, :length, :, :head_dim]
    return back(dq), back(dk), back(dv), None


band_attention.defvjp(_fwd_rule, _bwd_rule)
