"""Attention against an independent float64 NumPy reference (explicit masks and softmax)."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib.layers import MIXERS, get_mixer
from sptlib.layers.attention import (MultiHeadAttention, chunked_attention,
                                     dot_product_attention, rotary_embedding)


def reference_attention(q, k, v, key_mask, causal, window):
    """Naive float64 attention, one (batch, head) at a time; NaN rows where nothing is allowed."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    batch, length, heads, _ = q.shape
    i, j = np.meshgrid(np.arange(length), np.arange(length), indexing="ij")
    band = np.ones((length, length), bool)
    if causal:
        band &= j <= i
    if window:
        band &= (i - j <= window) if causal else (np.abs(i - j) <= window)
    out = np.zeros_like(q)
    for b in range(batch):
        allowed = band & np.asarray(key_mask[b])[None, :]
        for h in range(heads):
            s = q[b, :, h] @ k[b, :, h].T
            s = np.where(allowed, s, -np.inf)
            with np.errstate(invalid="ignore"):  # rows with nothing allowed -> NaN
                w = np.exp(s - s.max(axis=1, keepdims=True))
            out[b, :, h] = (w / w.sum(axis=1, keepdims=True)) @ v[b, :, h]
    return out


def _qkv(batch=2, length=45, heads=3, head_dim=8, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=(batch, length, heads, head_dim)).astype(np.float32)
               for _ in range(3))
    mask = np.ones((batch, length), bool)
    mask[0, 30:] = False  # right padding
    mask[1, 5:9] = False  # holes: keys must be skipped wherever they are
    return q, k, v, mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [0, 6])
def test_kernels_match_reference(causal, window):
    q, k, v, mask = _qkv()
    ref = reference_attention(q, k, v, mask, causal, window)
    real = mask[..., None, None]
    plain = dot_product_attention(q, k, v, jnp.asarray(mask), causal=causal, window=window)
    np.testing.assert_allclose(np.where(real, plain, 0), np.where(real, ref, 0), atol=1e-5)
    # Chunk sizes that divide the length, that do not (internal padding), and one chunk only.
    for chunk in (5, 8, 64):
        out = chunked_attention(q, k, v, jnp.asarray(mask), causal=causal, window=window,
                                chunk_size=chunk)
        np.testing.assert_allclose(np.where(real, out, 0), np.where(real, ref, 0), atol=1e-5)
        np.testing.assert_allclose(np.where(real, out, 0), np.where(real, plain, 0), atol=1e-5)


@pytest.mark.parametrize("causal,window,chunk", [(True, 7, 4), (False, 0, 8), (True, 0, 5),
                                                 (False, 6, 16)])
def test_chunked_gradients_match_plain(causal, window, chunk):
    """The custom (FlashAttention-2) backward equals autodiff of plain attention."""
    q, k, v, mask = _qkv(length=33)
    mask = jnp.asarray(mask)
    w = jnp.asarray(np.random.default_rng(1).normal(size=q.shape).astype(np.float32)) * mask[
        ..., None, None]
    loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v) * w)
    kw = dict(causal=causal, window=window)
    plain = jax.grad(loss(lambda *a: dot_product_attention(*a, mask, **kw)),
                     argnums=(0, 1, 2))(q, k, v)
    chunk = jax.jit(jax.grad(loss(lambda *a: chunked_attention(*a, mask, chunk_size=chunk, **kw)),
                             argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(plain, chunk):
        assert np.abs(np.asarray(a)).max() > 1e-2  # not trivially zero
        np.testing.assert_allclose(a, b, atol=1e-5)
    # Padded keys get no gradient at all (they had weight exactly 0).
    for g in chunk[1:]:
        assert np.all(np.asarray(g)[0, 30:] == 0) and np.all(np.asarray(g)[1, 5:9] == 0)


def test_chunked_fully_masked_rows_have_finite_gradients():
    """Rows that see no real key (causal, left padding) give finite outputs and gradients; with
    their output cotangent zero (the module zeroes padding rows) the real gradients are exact."""
    q, k, v, _ = _qkv(length=20)
    mask = jnp.asarray(np.arange(20)[None] >= np.array([[6], [0]]))  # left padding in row 0:
    # its queries 0..5 see no real key
    w = jnp.asarray(np.random.default_rng(2).normal(size=q.shape).astype(np.float32))
    w = w * mask[..., None, None]
    loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v) * w)
    plain = jax.grad(loss(lambda *a: dot_product_attention(*a, mask, causal=True)),
                     argnums=(0, 1, 2))(q, k, v)
    chunk = jax.grad(loss(lambda *a: chunked_attention(*a, mask, causal=True, chunk_size=4)),
                     argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(plain, chunk):
        assert np.all(np.isfinite(b))
        np.testing.assert_allclose(a, b, atol=1e-5)
    # With a non-zero cotangent on the fully masked rows too, everything stays finite.
    g = jax.grad(lambda q, k, v: jnp.sum(chunked_attention(q, k, v, mask, causal=True,
                                                           chunk_size=4) ** 2),
                 argnums=(0, 1, 2))(q, k, v)
    assert all(np.all(np.isfinite(a)) for a in g)


def test_chunked_backward_memory_is_linear_at_16k():
    """XLA's planned temporary memory of forward+backward at L=16,384, batch 1, 8 heads,
    d_model 256 (head_dim 32) stays far below the quadratic 16,384² score matrix (8 GiB)."""
    shape = jax.ShapeDtypeStruct((1, 16384, 8, 32), jnp.float32)
    f = lambda q, k, v: jnp.sum(chunked_attention(q, k, v, None, chunk_size=512) ** 2)
    compiled = jax.jit(jax.grad(f, argnums=(0, 1, 2))).lower(shape, shape, shape).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    assert temp < 256 * 2**20, temp / 2**20


def test_rotary_scores_depend_on_relative_position_only():
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(2, 16)).astype(np.float32)
    score = lambda i, j: float(jnp.dot(rotary_embedding(q, i), rotary_embedding(k, j)))
    for i, j in [(0, 0), (3, 7), (20, 5), (100, 99)]:
        for shift in (1, 13, 1000):
            np.testing.assert_allclose(score(i + shift, j + shift), score(i, j), rtol=1e-4,
                                       atol=1e-4)
    # Not trivially constant: a different offset gives a different score.
    assert abs(score(3, 7) - score(3, 8)) > 1e-3
    # Norm preserving (it is a rotation).
    np.testing.assert_allclose(np.linalg.norm(rotary_embedding(q, 37)), np.linalg.norm(q),
                               rtol=1e-5)


def _module(**kw):
    kw = dict(dict(d_model=24, n_heads=3, causal=False), **kw)
    return MultiHeadAttention(**kw)


def _x(batch=2, length=40, d=24, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=(batch, length, d)), jnp.float32)


def test_registered_as_mixer_and_params_have_logical_axes():
    assert MIXERS["attention"].endswith(":MultiHeadAttention")
    assert get_mixer("attention") is MultiHeadAttention
    variables = _module().init(jax.random.PRNGKey(0), _x())
    boxes = jax.tree.leaves(variables, is_leaf=lambda a: hasattr(a, "names"))
    assert boxes and all(hasattr(b, "names") and len(b.names) == b.value.ndim for b in boxes)


@pytest.mark.parametrize("impl,window,causal", [("chunked", 0, False), ("chunked", 0, True),
                                                ("local", 7, False), ("local", 7, True)])
def test_module_impls_equal_plain(impl, window, causal):
    x = _x()
    mask = jnp.asarray(np.arange(40)[None] < np.array([[40], [29]]))
    plain = _module(causal=causal, positions="rotary", window=window)
    other = _module(causal=causal, positions="rotary", window=window, impl=impl, chunk_size=8)
    variables = plain.init(jax.random.PRNGKey(0), x)
    a = plain.apply(variables, x, mask=mask)
    b = other.apply(variables, x, mask=mask)
    np.testing.assert_allclose(a, b, atol=1e-5)
    assert np.all(np.asarray(a)[1, 29:] == 0)  # padding rows are zero


@pytest.mark.parametrize("impl,window", [("plain", 0), ("chunked", 0), ("local", 5)])
def test_causal_no_leak(impl, window):
    model = _module(causal=True, impl=impl, window=window, chunk_size=8, positions="rotary")
    x = _x(batch=1)
    variables = model.init(jax.random.PRNGKey(0), x)
    t = 17
    x2 = x.at[:, t].add(3.0)
    y, y2 = model.apply(variables, x), model.apply(variables, x2)
    np.testing.assert_array_equal(np.asarray(y[:, :t]), np.asarray(y2[:, :t]))
    # The change does reach position t and the ones after it (within the window).
    reach = window + 1 if window else x.shape[1] - t
    assert np.abs(np.asarray(y[:, t:t + reach] - y2[:, t:t + reach])).max(axis=-1).min() > 0


@pytest.mark.parametrize("positions,window", [("rotary", 0), ("rotary", 5)])
def test_step_with_cache_equals_parallel(positions, window):
    model = _module(causal=True, positions=positions, window=window)
    x = _x(length=20)
    variables = model.init(jax.random.PRNGKey(0), x)
    parallel = model.apply(variables, x)
    state = model.apply(variables, 2, 24, method=MultiHeadAttention.initial_state)
    step = jax.jit(lambda x_t, s: model.apply(variables, x_t, s, method=MultiHeadAttention.step))
    outs = []
    for t in range(x.shape[1]):
        y_t, state = step(x[:, t], state)
        outs.append(y_t)
    assert int(state["index"]) == x.shape[1]
    np.testing.assert_allclose(jnp.stack(outs, axis=1), parallel, atol=1e-5)


@pytest.mark.parametrize("impl,causal", [("plain", False), ("chunked", True), ("local", False),
                                         ("local", True)])
def test_padding_invariance(impl, causal):
    """Real outputs do not change with the content or the amount of padding."""
    model = _module(causal=causal, impl=impl, window=6 if impl == "local" else 0, chunk_size=8,
                    positions="rotary")
    real = 23
    x = _x(batch=1, length=real)
    variables = model.init(jax.random.PRNGKey(0), x)
    base = model.apply(variables, x, mask=jnp.ones((1, real), bool))
    for pad, seed in [(5, 1), (17, 2)]:
        xp = jnp.concatenate([x, _x(batch=1, length=pad, seed=seed) * 10], axis=1)
        mp = jnp.arange(real + pad)[None] < real
        out = model.apply(variables, xp, mask=mp)
        np.testing.assert_allclose(out[:, :real], base, atol=1e-5)


def test_dropout_is_active_only_when_not_deterministic():
    model = _module(dropout=0.5)
    x = _x()
    variables = model.init(jax.random.PRNGKey(0), x)
    a = model.apply(variables, x)
    b = model.apply(variables, x, deterministic=False, rngs={"dropout": jax.random.PRNGKey(1)})
    assert np.abs(np.asarray(a - b)).max() > 1e-3
    np.testing.assert_array_equal(a, model.apply(variables, x))


@pytest.mark.slow
def test_chunked_attention_16k_forward_backward_memory():
    """Forward+backward at L=16,384, batch 1, 8 heads, d=256 fits in < 4 GB (peak RSS)."""
    code = textwrap.dedent("""
        import resource
        import jax, jax.numpy as jnp
        from sptlib.layers.attention import chunked_attention
        q, k, v = (jax.random.normal(key, (1, 16384, 8, 32))
                   for key in jax.random.split(jax.random.PRNGKey(0), 3))
        f = lambda q, k, v: jnp.sum(chunked_attention(q, k, v, None, chunk_size=512) ** 2)
        jax.block_until_ready(jax.jit(jax.grad(f, argnums=(0, 1, 2)))(q, k, v))
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, JAX_PLATFORMS="cpu"))
    peak_gb = int(out.stdout.split()[-1]) / 2**20  # ru_maxrss is in KiB on Linux
    print(f"peak RSS {peak_gb:.2f} GB")
    assert peak_gb < 4.0
