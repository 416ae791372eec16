"""Splash attention declares the work of the blocks its mask computes, no more
(`sptlib.kernels.platform.tpu.cost_estimate`): checked against a direct count of a dense mask's
non-empty blocks. Traced only (Pallas interpret mode on CPU); nothing runs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib.kernels.platform import tpu

# 4 x 4 blocks of 512 forward; the backward's dkv kernel takes 512 queries x 1024 keys.
BATCH, LENGTH, HEADS, HEAD_DIM, BLOCK, BLOCK_KV_DKV = 2, 2048, 3, 32, 512, 1024


def dense_keep(length, causal, window):
    """`[length, length]` bool: the (query, key) pairs a causal and/or banded mask keeps,
    written out densely (the independent truth of the block and pair counts)."""
    i, j = np.arange(length)[:, None], np.arange(length)[None, :]
    keep = np.ones((length, length), bool)
    if causal:
        keep &= j <= i
    if window:
        keep &= np.abs(i - j) <= window
    return keep


def _nonempty_blocks(length, block, causal, window, block_kv=None):
    """Blocks of block x block_kv holding at least one kept (query, key) pair of the dense
    mask."""
    block_kv = block_kv or block
    keep = dense_keep(length, causal, window)
    n, m = length // block, length // block_kv
    return int(keep.reshape(n, block, m, block_kv).any(axis=(1, 3)).sum())


def _declared(causal, window):
    """{phase: CostEstimate} of the Pallas calls in splash attention's forward and backward."""
    x = jnp.ones((BATCH, LENGTH, HEADS, HEAD_DIM), jnp.float32)
    mask = jnp.ones((BATCH, LENGTH), bool)

    def loss(q, k, v):
        return tpu.splash_attention(q, k, v, mask, causal=causal, window=window,
                                    interpret=True).sum()

    tpu.install_cost_estimates()
    out = {}

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pallas_call":
                name = eqn.params["name"]
                phase = "band" if name.startswith("sptlib_band") else tpu._phase(name)
                out[phase] = eqn.params["cost_estimate"]
            for value in eqn.params.values():
                for sub in value if isinstance(value, (tuple, list)) else [value]:
                    sub = getattr(sub, "jaxpr", sub)
                    if hasattr(sub, "eqns"):
                        walk(sub)

    walk(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(x, x, x).jaxpr)
    return out


@pytest.mark.parametrize("causal,window", [(False, 0), (True, 0), (False, 300), (True, 300),
                                           (False, 600)])
def test_declared_flops_count_only_the_masks_nonempty_blocks(causal, window):
    blocks = _nonempty_blocks(LENGTH, BLOCK, causal, window)
    assert blocks < 16 or not (causal or window)  # the masks do empty some blocks
    pairs = BATCH * HEADS * blocks * BLOCK * BLOCK
    bwd_pairs = BATCH * HEADS * BLOCK * BLOCK_KV_DKV * _nonempty_blocks(
        LENGTH, BLOCK, causal, window, BLOCK_KV_DKV)
    declared = _declared(causal, window)
    # QK^T and PV forward; the fused backward recomputes QK^T, forms dP, dV, dK and dQ: splash's
    # dkv kernel (512 queries x 1024 keys), or for a local window sptlib's band kernel
    # (tpu_band: 512 x 512, only the band's blocks).
    bwd = "band" if window else "dkv"
    assert set(declared) == {"fwd", bwd}
    if window:
        bwd_pairs = pairs
    assert declared["fwd"].flops == 4 * HEAD_DIM * pairs
    assert declared[bwd].flops == 10 * HEAD_DIM * bwd_pairs
    assert declared["fwd"].transcendentals == pairs
    assert declared[bwd].transcendentals == bwd_pairs


def test_a_causal_mask_declares_about_half_of_the_full_one():
    full, causal = _declared(False, 0), _declared(True, 0)
    n = LENGTH // BLOCK
    assert causal["fwd"].flops / full["fwd"].flops == pytest.approx(n * (n + 1) / 2 / n ** 2)
