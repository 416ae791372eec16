"""Selective SSMs: the kernels against naive Python-loop recurrences (forward and gradients),
chunked SSD against its quadratic form, and the Mamba / Mamba-2 mixers (step == parallel,
padding, bidirectional, parameter groups, initialisation, registration)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib.kernels import selective as sel
from sptlib.layers import get_mixer, param_groups
from sptlib.layers.mamba import Mamba2Mixer, MambaMixer

RNG = np.random.default_rng(0)


def _f32(*shape, scale=1.0, positive=False):
    x = RNG.normal(size=shape) * scale
    return jnp.asarray(np.abs(x) if positive else x, jnp.float32)


# -- naive references: plain Python loops over time ---------------------------------------------

def naive_selective(u, delta, A, B, C, D):
    batch, length, d = u.shape
    h = jnp.zeros((batch, d, A.shape[-1]))
    ys = []
    for t in range(length):
        h = jnp.exp(delta[:, t, :, None] * A) * h + (delta[:, t] * u[:, t])[..., None] * \
            B[:, t, None, :]
        ys.append(jnp.sum(h * C[:, t, None, :], -1) + D * u[:, t])
    return jnp.stack(ys, 1)


def naive_ssd(x, dt, A, B, C, D):
    batch, length, nh, p = x.shape
    g = B.shape[2]
    h = jnp.zeros((batch, nh, p, B.shape[-1]))
    ys = []
    for t in range(length):
        bt = jnp.repeat(B[:, t], nh // g, axis=1)  # head i uses group i // (H / G)
        ct = jnp.repeat(C[:, t], nh // g, axis=1)
        h = jnp.exp(dt[:, t] * A)[..., None, None] * h + \
            (dt[:, t, :, None] * x[:, t])[..., None] * bt[:, :, None, :]
        ys.append(jnp.sum(h * ct[:, :, None, :], -1) + D[:, None] * x[:, t])
    return jnp.stack(ys, 1)


def _selective_args(batch=2, length=11, d=3, n=4):
    return (_f32(batch, length, d), _f32(batch, length, d, scale=0.5, positive=True),
            -jnp.exp(_f32(d, n)), _f32(batch, length, n), _f32(batch, length, n), _f32(d))


def _ssd_args(batch=2, length=11, nh=4, p=3, g=2, n=5):
    return (_f32(batch, length, nh, p), _f32(batch, length, nh, scale=0.5, positive=True),
            -jnp.exp(_f32(nh)), _f32(batch, length, g, n), _f32(batch, length, g, n), _f32(nh))


@pytest.mark.parametrize("chunk", [1, 4, 5, 11, 64])
def test_selective_scan_equals_the_loop(chunk):
    args = _selective_args()
    np.testing.assert_allclose(sel.selective_scan(*args, chunk_size=chunk),
                               naive_selective(*args), rtol=1e-5, atol=1e-5)


def test_selective_scan_gradients_equal_the_loop():
    args = _selective_args(length=7)
    loss = lambda f: (lambda *a: jnp.sum(jnp.sin(f(*a))))
    g = jax.jit(jax.grad(loss(lambda *a: sel.selective_scan(*a, chunk_size=3)),
                         argnums=range(6)))(*args)
    ref = jax.jit(jax.grad(loss(naive_selective), argnums=range(6)))(*args)
    for a, b in zip(g, ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_selective_scan_carries_a_state_across_calls():
    u, dl, A, B, C, D = _selective_args(length=10)
    full, h_full = sel.selective_scan(u, dl, A, B, C, D, chunk_size=3, return_state=True)
    y1, h1 = sel.selective_scan(u[:, :6], dl[:, :6], A, B[:, :6], C[:, :6], D, chunk_size=4,
                                return_state=True)
    y2, h2 = sel.selective_scan(u[:, 6:], dl[:, 6:], A, B[:, 6:], C[:, 6:], D, h0=h1,
                                return_state=True)
    np.testing.assert_allclose(jnp.concatenate([y1, y2], 1), full, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h2, h_full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 4, 5, 11, 64])
def test_ssd_chunked_equals_quadratic_and_loop(chunk):
    args = _ssd_args()
    ref = naive_ssd(*args)
    np.testing.assert_allclose(sel.ssd_quadratic(*args), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sel.ssd(*args, chunk_size=chunk), ref, rtol=1e-5, atol=1e-5)


def test_ssd_gradients_equal_the_loop():
    args = _ssd_args(length=7)
    loss = lambda f: (lambda *a: jnp.sum(jnp.sin(f(*a))))
    g = jax.jit(jax.grad(loss(lambda *a: sel.ssd(*a, chunk_size=3)), argnums=range(6)))(*args)
    ref = jax.jit(jax.grad(loss(naive_ssd), argnums=range(6)))(*args)
    for a, b in zip(g, ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_ssd_state_passing_and_step():
    x, dt, A, B, C, D = _ssd_args(length=9)
    full, h_full = sel.ssd(x, dt, A, B, C, D, chunk_size=4, return_state=True)
    y1, h1 = sel.ssd(x[:, :5], dt[:, :5], A, B[:, :5], C[:, :5], D, return_state=True)
    y2, h2 = sel.ssd(x[:, 5:], dt[:, 5:], A, B[:, 5:], C[:, 5:], D, h0=h1, chunk_size=2,
                     return_state=True)
    np.testing.assert_allclose(jnp.concatenate([y1, y2], 1), full, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h2, h_full, rtol=1e-5, atol=1e-5)
    h = jnp.zeros_like(h_full)
    for t in range(9):
        y, h = sel.ssd_step(h, x[:, t], dt[:, t], A, B[:, t], C[:, t], D)
        np.testing.assert_allclose(y, full[:, t], rtol=1e-5, atol=1e-5)


def test_causal_depthwise_conv_and_its_step():
    x, w, b = _f32(2, 9, 3), _f32(4, 3), _f32(3)
    y = sel.causal_depthwise_conv(x, w, b)
    xn = np.pad(np.asarray(x), ((0, 0), (3, 0), (0, 0)))
    ref = np.stack([sum(xn[:, t + k] * np.asarray(w)[k] for k in range(4)) for t in range(9)],
                   1) + np.asarray(b)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    state = jnp.zeros((2, 3, 3))
    for t in range(9):
        yt, state = sel.conv_step(state, x[:, t], w, b)
        np.testing.assert_allclose(yt, y[:, t], rtol=1e-5, atol=1e-5)


# -- the mixers ------------------------------------------------------------------------------------

MIXERS = [(MambaMixer, dict(d_state=4, chunk_size=4)),
          (Mamba2Mixer, dict(d_state=4, head_dim=8, n_groups=2, chunk_size=4))]


X = _f32(2, 11, 8)  # one input shape for the mixer tests: each mixer compiles once per form


@functools.lru_cache(maxsize=None)
def _model(cls, causal):
    """(module, variables, jitted apply(v, x, mask=None)) of a tiny mixer, shared by tests."""
    m = cls(d_model=X.shape[-1], causal=causal, **dict(MIXERS)[cls])
    v = jax.jit(m.init)(jax.random.PRNGKey(0), X)
    return m, v, jax.jit(lambda v, x, mask=None: m.apply(v, x, mask=mask))


@pytest.mark.parametrize("cls", dict(MIXERS))
def test_step_equals_parallel(cls):
    m, v, apply = _model(cls, True)
    y = apply(v, X)
    assert y.shape == X.shape
    state = m.apply(v, 2, method=m.initial_state)
    step = jax.jit(lambda v, x_t, state: m.apply(v, x_t, state, method=m.step))
    for t in range(X.shape[1]):
        yt, state = step(v, X[:, t], state)
        np.testing.assert_allclose(yt, y[:, t], rtol=1e-4, atol=1e-5)
    mb, vb, _ = _model(cls, False)
    with pytest.raises(ValueError, match="causal"):
        mb.apply(vb, 2, method=mb.initial_state)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("cls", dict(MIXERS))
def test_padding_neither_leaks_nor_outputs(cls, causal):
    m, v, apply = _model(cls, causal)
    mask = jnp.arange(11)[None] < jnp.asarray([[11], [6]])
    noisy = jnp.where(mask[..., None], X, 100.0)  # garbage at the padding
    y = apply(v, noisy, mask)
    np.testing.assert_array_equal(y[1, 6:], 0.0)
    # the padded row equals the short sequence alone, the full row the full one alone
    np.testing.assert_allclose(y[1, :6], jax.jit(m.apply)(v, X[1:, :6])[0], rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(y[0], apply(v, X)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls", dict(MIXERS))
def test_bidirectional_sees_both_sides_and_is_mirror_symmetric(cls):
    later = X.at[:, -1].add(1.0)
    _, vc, fc = _model(cls, True)
    np.testing.assert_allclose(fc(vc, later)[:, 0], fc(vc, X)[:, 0])
    _, v, f = _model(cls, False)
    assert not np.allclose(f(v, later)[:, 0], f(v, X)[:, 0])
    # Swapping the two directions' parameters and reversing the input reverses the output.
    swapped = jax.tree.map(lambda p: p, v)
    for name in ("conv_w", "conv_b", "dt_bias", "A_log", "D", "x_proj", "dt_proj"):
        if name in v["params"]:
            leaf = v["params"][name]
            swapped["params"][name] = leaf.replace_boxed(jnp.flip(leaf.value, 0))
    np.testing.assert_allclose(f(swapped, jnp.flip(X, 1)), jnp.flip(f(v, X), 1),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls", dict(MIXERS))
def test_ssm_group_and_initialisation(cls):
    _, v, _ = _model(cls, False)
    labels = jax.tree_util.tree_flatten_with_path(param_groups.param_labels(v["params"]))[0]
    ssm = sorted(path[0].key for path, lab in labels if lab != "default")
    assert ssm == ["A_log", "D", "dt_bias"], labels
    p = v["params"]
    dt = jax.nn.softplus(p["dt_bias"].value)
    assert float(dt.min()) >= 1e-3 * 0.999 and float(dt.max()) <= 1e-1 * 1.001
    np.testing.assert_array_equal(p["D"].value, 1.0)
    if cls is MambaMixer:  # S4D-real: A_n = -n
        np.testing.assert_allclose(jnp.exp(p["A_log"].value), np.broadcast_to(
            np.arange(1, 5), p["A_log"].value.shape), rtol=1e-6)
    else:  # one A per head, U[1, 16]
        a = jnp.exp(p["A_log"].value)
        assert p["A_log"].value.shape == (2, 2) and float(a.min()) >= 1 and float(a.max()) <= 16


@pytest.mark.parametrize("name", ["mamba", "mamba2"])
def test_registered_and_trainable_in_a_model(name):
    from sptlib.models import build_model
    from sptlib.models.config import model_config
    m = model_config()
    m.mixer, m.d_model, m.n_layers, m.vocab_size, m.max_length, m.ffn_mult = name, 16, 1, 10, 8, 0
    m.mamba.d_state, m.mamba2.d_state, m.mamba2.head_dim = 4, 4, 8
    assert get_mixer(name) is {"mamba": MambaMixer, "mamba2": Mamba2Mixer}[name]
    model = build_model(m, {"kind": "classify", "num_classes": 3})
    ids = jnp.asarray(RNG.integers(2, 10, (2, 8)), jnp.int32)
    v = jax.jit(model.init)(jax.random.PRNGKey(0), ids)
    loss = lambda p: jnp.sum(model.apply(p, ids) ** 2)
    g = jax.jit(jax.grad(loss))(v)
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(g))


@pytest.mark.parametrize("name", ["mamba", "mamba2", "s4d"])
def test_dense_projections_follow_init_scheme(name):
    """`config.model.init_scheme` reaches the mixers' dense projections: under "torch" the
    kernels are PyTorch's nn.Linear default, uniform in +-1/sqrt(fan_in) (the reference code's);
    under "linen" a truncated normal of std 1/sqrt(fan_in), which exceeds that bound."""
    from sptlib.models import build_model
    from sptlib.models.config import model_config
    spread = {}
    for scheme in ("linen", "torch"):
        m = model_config()
        m.mixer, m.d_model, m.n_layers, m.vocab_size, m.max_length = name, 64, 1, 10, 8
        m.ffn_mult, m.init_scheme = 0, scheme
        model = build_model(m, {"kind": "classify", "num_classes": 3})
        ids = jnp.asarray(RNG.integers(2, 10, (2, 8)), jnp.int32)
        p = jax.jit(model.init)(jax.random.PRNGKey(0), ids)["params"]
        for path, leaf in jax.tree_util.tree_flatten_with_path(p)[0]:
            keys = [getattr(k, "key", None) for k in path]
            proj = next((k for k in keys if k in ("in_proj", "out_proj")), None)
            if proj and "mixer" in keys and "kernel" in keys:
                k = np.asarray(getattr(leaf, "value", leaf))
                bound = 1 / np.sqrt(k.shape[0])
                spread[scheme, proj] = (float(np.abs(k).max()) / bound, float(k.std()) / bound)
    assert {p for _, p in spread} == ({"out_proj"} if name == "s4d" else
                                      {"in_proj", "out_proj"}), spread
    for proj in {p for _, p in spread}:
        assert spread["torch", proj][0] <= 1.0 + 1e-6, spread  # inside U(+-bound)
        np.testing.assert_allclose(spread["torch", proj][1], 1 / np.sqrt(3), rtol=0.1)
        np.testing.assert_allclose(spread["linen", proj][1], 1.0, rtol=0.1)  # std 1/sqrt(fan_in)
