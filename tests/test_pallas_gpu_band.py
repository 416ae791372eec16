"""The Pallas GPU (Triton) band kernel (`sptlib.kernels.platform.gpu_band`) equals the jnp
`plain` attention with the band mask, forward and gradients, in Pallas interpret mode on CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib.kernels import attention as reference
from sptlib.kernels.platform import gpu_band


def _inputs(length, heads=1, head_dim=8, batch=3, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.normal(size=(batch, length, heads, head_dim)), jnp.float32)
               for _ in range(3))
    mask = np.ones((batch, length), bool)
    mask[1 % batch, length - 9:] = False  # padding at the end of a row
    mask[2 % batch, ::3] = False  # and scattered through one (any mask, not only the end)
    return q * head_dim ** -0.5, k, v, jnp.asarray(mask)


def _seen(mask, window, causal):
    """[batch, length]: rows with at least one real key in their band."""
    length = mask.shape[1]
    i, j = np.arange(length)[:, None], np.arange(length)[None, :]
    band = (np.abs(i - j) <= window) & ((j <= i) if causal else True)
    return jnp.asarray((band[None] & np.asarray(mask)[:, None, :]).any(-1))


@pytest.mark.parametrize("length,window,causal,block", [
    (37, 5, False, 16), (33, 40, False, 16),
    pytest.param(64, 20, False, 16, marks=pytest.mark.slow), (45, 7, True, 16)])
def test_band_kernel_equals_plain_with_the_band_forward_and_gradients(length, window, causal,
                                                                      block):
    q, k, v, mask = _inputs(length)
    seen = _seen(mask, window, causal)[:, :, None, None]
    cot = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32) * seen

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) * cot)

    ref = lambda q, k, v: reference.dot_product_attention(q, k, v, mask, causal=causal,
                                                          window=window)
    got = lambda q, k, v: gpu_band.band_attention(q, k, v, mask, window, causal, block, True)
    np.testing.assert_allclose(got(q, k, v) * seen, ref(q, k, v) * seen, atol=2e-5, rtol=1e-5)
    g_ref = jax.grad(loss(ref), argnums=(0, 1, 2))(q, k, v)
    g_got = jax.grad(loss(got), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g_got, g_ref):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)


def test_rows_without_a_real_key_are_zero_with_zero_gradient():
    q, k, v, _ = _inputs(40, heads=2, batch=1)
    mask = jnp.asarray(np.arange(40) < 20)[None]  # keys 20.. padding; window 3
    out = gpu_band.band_attention(q, k, v, mask, 3, False, 16, True)
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[0, 24:], 0.0)  # rows 24..39 see keys 21.. only
    assert np.any(out[0, :23] != 0)
    grads = jax.grad(lambda q, k, v: gpu_band.band_attention(q, k, v, mask, 3, False, 16,
                                                             True).sum(),
                     argnums=(0, 1, 2))(q, k, v)
    assert all(np.all(np.isfinite(g)) for g in grads)
    np.testing.assert_array_equal(grads[0][0, 24:], 0.0)  # no gradient into unseen rows
    np.testing.assert_array_equal(grads[1][0, 20:], 0.0)  # nor into padding keys


def test_band_kernel_in_bfloat16():
    q, k, v, mask = _inputs(40)
    qb, kb, vb = (a.astype(jnp.bfloat16) for a in (q, k, v))
    out = gpu_band.band_attention(qb, kb, vb, mask, 9, False, 16, True)
    assert out.dtype == jnp.bfloat16
    expected = reference.dot_product_attention(*(a.astype(jnp.float32) for a in (qb, kb, vb)),
                                               mask, window=9)
    seen = _seen(mask, 9, False)[:, :, None, None]
    np.testing.assert_allclose(np.float32(out) * seen, expected * seen, atol=3e-2)
