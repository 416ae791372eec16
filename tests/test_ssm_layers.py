"""SSM mixers and the GSS block: convolution form == step form, causality, masking, gradients,
parameter labels and logical axes."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib.layers import get_mixer
from sptlib.layers.gss import GSSBlock
from sptlib.layers.ssm import (DLRMixer, DSSMixer, S4DMixer, S4Mixer, S5Mixer,
                               ssm_param_labels)

H = 4
# (class, small kwargs)
CASES = {
    "s4": (S4Mixer, dict(d_state=8)),
    "s4d_zoh": (S4DMixer, dict(d_state=8)),
    "s4d_bilinear_legs": (S4DMixer, dict(d_state=8, discretization="bilinear", init_kind="legs")),
    "s4d_inv": (S4DMixer, dict(d_state=8, init_kind="inv")),
    "s4d_random": (S4DMixer, dict(d_state=8, init_kind="random")),
    "dss_exp": (DSSMixer, dict(d_state=8)),
    "dss_random": (DSSMixer, dict(d_state=8, init_kind="random")),
    "dss_softmax": (DSSMixer, dict(d_state=8, version="softmax")),
    "dlr": (DLRMixer, dict(d_state=16)),
    "s5": (S5Mixer, dict(d_state=8)),
    "s5_random": (S5Mixer, dict(d_state=8, init_kind="random")),
    "gss": (GSSBlock, dict(d_state=16, expansion=2, d_ssm=4)),  # LayerNorm over H=1 is constant
}


def make(name, causal, **over):
    cls, kw = CASES[name]
    return cls(d_model=H, causal=causal, **{**kw, "dropout": 0.1, **over})


def inputs(batch, length, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=(batch, length, H)), jnp.float32)


def run_steps(module, variables, x):
    """The step form over a whole sequence (lax.scan), from initial_state(max_length=L)."""
    state = module.apply(variables, x.shape[0], x.shape[1], method=module.initial_state)

    def body(st, x_t):
        y_t, st = module.apply(variables, x_t, st, method=module.step)
        return st, y_t

    _, ys = jax.lax.scan(body, state, jnp.swapaxes(x, 0, 1))
    return jnp.swapaxes(ys, 0, 1)


@pytest.mark.parametrize("name", sorted(CASES))
def test_step_form_equals_convolution(name):
    m = make(name, causal=True)
    x = inputs(2, 24)
    v = m.init(jax.random.PRNGKey(1), x)
    y = m.apply(v, x)
    ys = jax.jit(lambda v, x: run_steps(m, v, x))(v, x)
    np.testing.assert_allclose(ys, y, rtol=1e-4, atol=1e-4 * float(jnp.abs(y).max()))


def test_step_form_equals_convolution_long():
    m = make("s4d_zoh", causal=True, d_state=16)
    x = inputs(1, 1024)
    v = m.init(jax.random.PRNGKey(2), x)
    y = m.apply(v, x)
    ys = jax.jit(lambda v, x: run_steps(m, v, x))(v, x)
    np.testing.assert_allclose(ys, y, rtol=1e-4, atol=1e-4 * float(jnp.abs(y).max()))


@pytest.mark.parametrize("name", sorted(CASES))
def test_causal_and_bidirectional(name):
    x = inputs(1, 24)
    t = 15
    x2 = x.at[:, t, 0].add(1.0)  # one feature: a shift of all would vanish in LayerNorm
    for causal in (True, False):
        m = make(name, causal=causal)
        v = m.init(jax.random.PRNGKey(0), x)
        y1, y2 = m.apply(v, x), m.apply(v, x2)
        d = jnp.abs(y2 - y1)[0].max(-1)
        assert float(d[t]) > 1e-4
        if causal:
            # Round-off of the FFT convolution is absolute, about eps x the output's magnitude
            # (measured: at most 1.3 eps x max|y| over every case and 3 seeds), not a fraction
            # of the response at t, which can be 1e-3 (a relative bound there was flaky).
            # A real leak of the future is of the order of the response itself.
            roundoff = 16 * float(jnp.finfo(jnp.float32).eps) * float(
                jnp.maximum(jnp.abs(y1).max(), jnp.abs(y2).max()))
            assert float(d[:t].max()) <= roundoff, "causal layer saw the future"
            assert float(d[t]) > 50 * roundoff  # the bound is far below a real dependence
        else:
            assert float(d[:t].max()) > 1e-3 * float(d[t]), "bidirectional layer missed the future"


@pytest.mark.parametrize("name", ["s4", "dss_softmax", "s5", "gss"])
def test_padding_does_not_leak(name):
    x = inputs(2, 30)
    mask = jnp.arange(30)[None] < jnp.array([[30], [21]])
    x2 = x.at[1, 21:].set(100.0)
    m = make(name, causal=False)
    v = m.init(jax.random.PRNGKey(0), x)
    y1 = m.apply(v, x, mask=mask)
    y2 = m.apply(v, x2, mask=mask)
    np.testing.assert_allclose(y2[1, :21], y1[1, :21], rtol=1e-5, atol=1e-5)  # pads set to 100
    np.testing.assert_array_equal(y1[0], m.apply(v, x[:1])[0])


@pytest.mark.parametrize("name", ["s4", "s4d_zoh", "dss_exp", "dss_softmax", "dlr", "s5",
                                  "gss"])
def test_gradients_finite_at_4096(name):
    x = inputs(1, 4096)
    m = make(name, causal=False)
    v = m.init(jax.random.PRNGKey(0), x)

    def loss(params):
        y = m.apply({"params": params}, x, deterministic=False,
                    rngs={"dropout": jax.random.PRNGKey(1)})
        return jnp.mean(y ** 2)

    g = jax.jit(jax.grad(loss))(v["params"])
    leaves = jax.tree.leaves(nn.unbox(g))
    assert all(bool(jnp.all(jnp.isfinite(a))) for a in leaves)
    assert any(bool(jnp.any(a != 0)) for a in leaves)


def test_dropout_only_in_training():
    m = make("s4d_zoh", causal=False, dropout=0.5)
    x = inputs(2, 16)
    v = m.init(jax.random.PRNGKey(0), x)
    np.testing.assert_array_equal(m.apply(v, x), m.apply(v, x, deterministic=True))
    y_train = m.apply(v, x, deterministic=False, rngs={"dropout": jax.random.PRNGKey(3)})
    assert float(jnp.abs(y_train - m.apply(v, x)).max()) > 1e-3


def test_param_labels_and_logical_axes():
    expected_ssm = {
        "s4": {"A_re", "A_im", "P", "B", "log_dt"}, "s4d_zoh": {"A_re", "A_im", "B", "log_dt"},
        "dss_exp": {"Lambda_re", "Lambda_im", "log_dt"}, "dlr": {"a", "theta"},
        "s5": {"A_re", "A_im", "B", "log_dt"}, "gss": {"Lambda_re", "Lambda_im"}}
    allowed = {"embed", "mlp", "heads", "kv", "vocab", "length", "ssm_channels", "ssm_state",
               "classes", "norm", None}
    for name, want in expected_ssm.items():
        m = make(name, causal=False)
        params = m.init(jax.random.PRNGKey(0), inputs(1, 8))["params"]
        for path, leaf in jax.tree_util.tree_flatten_with_path(
                params, is_leaf=lambda l: isinstance(l, nn.Partitioned))[0]:
            assert isinstance(leaf, nn.LogicallyPartitioned), (name, path)
            assert len(leaf.names) == leaf.value.ndim and set(leaf.names) <= allowed
            assert leaf.value.dtype == jnp.float32  # complex values stored as (re, im) pairs
        labels = ssm_param_labels(params)  # the group is the module's tag on the box
        flat = {jax.tree_util.keystr(p): l for p, l in jax.tree_util.tree_flatten_with_path(labels)[0]}
        got = {k.split("'")[-2] for k, l in flat.items() if l in ("ssm", "ssm_dt")}
        assert got == want, (name, got)
        dt = {k.split("'")[-2] for k, l in flat.items() if l == "ssm_dt"}
        assert dt == ({"log_dt"} & want), (name, dt)  # log dt: its own group (optim.ssm_dt_lr)
        assert "default" in flat.values()


def test_registered_mixers():
    for key, cls in [("s4", S4Mixer), ("s4d", S4DMixer), ("dss", DSSMixer), ("dlr", DLRMixer),
                     ("s5", S5Mixer)]:
        assert get_mixer(key) is cls


def test_step_needs_causal():
    m = make("s4d_zoh", causal=False)
    v = m.init(jax.random.PRNGKey(0), inputs(1, 8))
    with pytest.raises(ValueError):
        m.apply(v, 1, method=m.initial_state)


def test_random_init_is_unstructured_and_stable():
    """The rand-init control: per-channel draws (S4D), stable Re A in [-1, -0.1), frequencies
    neither sorted nor on S4D-Lin's grid, and a different draw for a different key."""
    x = inputs(1, 16)
    mod = S4DMixer(d_model=H, d_state=8, init_kind="random")
    p0 = nn.unbox(mod.init(jax.random.PRNGKey(0), x)["params"])
    p1 = nn.unbox(mod.init(jax.random.PRNGKey(1), x)["params"])
    re = -np.exp(np.asarray(p0["A_re"]))
    im = np.asarray(p0["A_im"])
    assert re.shape == (H, 4) and np.all((re <= -0.1) & (re > -1.0))
    assert not np.allclose(im[0], im[1])  # channels differ
    assert not np.allclose(im, np.sort(im, axis=-1))  # unsorted
    lin = nn.unbox(S4DMixer(d_model=H, d_state=8).init(jax.random.PRNGKey(0), x)["params"])
    assert not np.allclose(im, np.asarray(lin["A_im"]))
    assert not np.allclose(p0["A_im"], p1["A_im"])
    dss = nn.unbox(DSSMixer(d_model=H, d_state=8, init_kind="random", version="softmax").init(
        jax.random.PRNGKey(0), x)["params"])
    assert np.all(np.asarray(dss["Lambda_re"]) < 0)  # softmax version stores Re lambda itself
    with pytest.raises(ValueError, match="legs | random"):
        DSSMixer(d_model=H, d_state=8, init_kind="lin").init(jax.random.PRNGKey(0), x)
    s5 = nn.unbox(S5Mixer(d_model=H, d_state=8, init_kind="random").init(
        jax.random.PRNGKey(0), x)["params"])
    legs = nn.unbox(S5Mixer(d_model=H, d_state=8).init(jax.random.PRNGKey(0), x)["params"])
    assert np.all(np.exp(np.asarray(s5["A_re"])) >= 0.1)  # -Re Lambda in [0.1, 1)
    assert not np.allclose(s5["A_im"], legs["A_im"])
