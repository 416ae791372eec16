"""The TPU band backward (`sptlib.kernels.platform.tpu_band`) that splash's forward feeds for a
local window: gradients against the plain jnp attention (Pallas interpret mode on CPU), its
block walk against a direct count of a dense mask's non-empty blocks, and that Mosaic compiles
it for a v4 chip (libtpu's compile-only devices)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib.kernels import attention as ref
from sptlib.kernels.platform import tpu, tpu_band
from test_splash_costs import dense_keep  # the pairs a mask keeps, written out densely


@pytest.mark.parametrize("causal,window", [(True, 100), (False, 150)])
def test_band_gradients_equal_plain_with_padding_anywhere(causal, window):
    """Three blocks of 128 (length 380 pads to 384), windows that are not a multiple of the
    block (2 and 5 slots per key block: the band's ends leave slots unwritten and send steps
    past the sequence to the spare block), head_dim 32 (sequence-minor), and key padding
    scattered through the rows (not only at the end)."""
    length, heads, head_dim = 380, 2, 32
    ks = jax.random.split(jax.random.PRNGKey(1), 5)
    q, k, v = (jax.random.normal(kk, (2, length, heads, head_dim)) for kk in ks[:3])
    q = q * head_dim ** -0.5
    mask = jax.random.uniform(ks[3], (2, length)) > 0.2
    w = jax.random.normal(ks[4], q.shape) * mask[..., None, None]
    fn = functools.partial(tpu.splash_attention, causal=causal, window=window, interpret=True)
    plain = functools.partial(ref.dot_product_attention, causal=causal, window=window)
    loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v, mask) * w)
    got = jax.grad(loss(fn), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(plain), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(got, want):
        assert np.abs(np.asarray(b)).max() > 1e-2
        np.testing.assert_allclose(a, b, atol=2e-4)
    for g in got[1:]:  # padding keys get no gradient
        assert np.all(np.where(np.asarray(mask)[..., None, None], 0, np.asarray(g)) == 0)


@pytest.mark.parametrize("length,block,causal,window", [
    (2048, 512, True, 4096), (2048, 512, True, 600), (2048, 512, False, 600),
    (8192, 512, True, 2048), (8192, 512, False, 2000), (1024, 128, False, 1)])
def test_the_walk_computes_exactly_the_bands_nonempty_blocks(length, block, causal, window):
    keep = dense_keep(length, causal, window)
    n = length // block
    nonempty = int(keep.reshape(n, block, n, block).any(axis=(1, 3)).sum())
    lo, hi = tpu_band.band_limits(causal, window)
    assert tpu_band.computed_pairs(length, block, lo, hi) == nonempty * block * block


def test_band_backward_compiles_for_a_v4_chip():
    """Interpret mode checks the values, not Mosaic's layout rules: lower and compile the
    kernel for one v4 chip at a PathX-like shape (bf16, head_dim 32), with its cost declared."""
    pytest.importorskip("libtpu")
    from sptlib.slices import topologies
    device = topologies.devices(topologies.slice_spec("v4-8"))[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    heads, head_dim, length = 4, 32, 4096
    seq = jax.ShapeDtypeStruct((heads, head_dim, length), jnp.bfloat16, sharding=sharding)
    rows = jax.ShapeDtypeStruct((heads, 8, length), jnp.float32, sharding=sharding)
    valid = jax.ShapeDtypeStruct((length, 128), jnp.int32, sharding=sharding)
    bwd = functools.partial(tpu_band.band_attention_bwd, causal=True, window=1024)
    compiled = jax.jit(bwd).lower(seq, seq, seq, seq, seq, rows, valid).compile()
    pairs = heads * tpu_band.computed_pairs(length, 512, 0, 1024)
    assert compiled.cost_analysis()["flops"] >= 10 * head_dim * pairs
