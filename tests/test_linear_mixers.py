"""The linear-attention family of mixers (sptlib.layers.linear_rnn): GLA, RetNet, DeltaNet,
Gated DeltaNet, mLSTM, RWKV-7, causal and bidirectional — shape, causality, step == parallel,
padding (garbage there changes nothing; a padded step is the identity on the state), gradients,
one training step of a tiny model, unknown options, state size = the leaves of initial_state,
parameter groups, and the decays against their closed forms."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib.layers import get_mixer, param_groups

RNG = np.random.default_rng(0)
# Small options: d_model 8, two heads, chunks of 4 on length 11 (a partial last chunk).
OPTIONS = {
    "gla": dict(n_heads=2, gate_low_rank_dim=4, chunk_size=4),
    "retnet": dict(n_heads=2, chunk_size=4),
    "deltanet": dict(n_heads=2, chunk_size=4),
    "gated_deltanet": dict(n_heads=2, chunk_size=4),
    "mlstm": dict(n_heads=2, chunk_size=4),
    "rwkv7": dict(head_dim=4, decay_low_rank_dim=4, a_low_rank_dim=4, gate_low_rank_dim=4,
                  chunk_size=4),
}
NAMES = list(OPTIONS)
X = jnp.asarray(RNG.normal(size=(2, 11, 8)), jnp.float32)


@functools.lru_cache(maxsize=None)
def _model(name, causal, **extra):
    """(module, variables, jitted apply(v, x, mask=None)) of a tiny mixer, shared by tests."""
    m = get_mixer(name)(d_model=X.shape[-1], causal=causal, **{**OPTIONS[name], **extra})
    v = jax.jit(m.init)(jax.random.PRNGKey(0), X)
    return m, v, jax.jit(lambda v, x, mask=None: m.apply(v, x, mask=mask))


@pytest.mark.parametrize("name", NAMES)
def test_causal_shape_causality_and_step_equals_parallel(name):
    m, v, apply = _model(name, True)
    y = apply(v, X)
    assert y.shape == X.shape and np.isfinite(y).all()
    later = X.at[:, 7:].set(jnp.asarray(RNG.normal(size=(2, 4, 8)), jnp.float32))
    np.testing.assert_allclose(apply(v, later)[:, :7], y[:, :7], rtol=1e-5, atol=1e-6)
    assert not np.allclose(apply(v, later)[:, 7:], y[:, 7:])
    state = m.apply(v, 2, method=m.initial_state)
    step = jax.jit(lambda v, x_t, state: m.apply(v, x_t, state, method=m.step))
    for t in range(X.shape[1]):
        yt, state = step(v, X[:, t], state)
        np.testing.assert_allclose(yt, y[:, t], rtol=1e-4, atol=1e-5)
    mb, vb, _ = _model(name, False)
    with pytest.raises(ValueError, match="causal"):
        mb.apply(vb, 2, method=mb.initial_state)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", NAMES)
def test_padding_neither_leaks_nor_outputs(name, causal):
    m, v, apply = _model(name, causal)
    mask = jnp.arange(11)[None] < jnp.asarray([[11], [6]])
    noisy = jnp.where(mask[..., None], X, 100.0)  # garbage at the padding
    y = apply(v, noisy, mask)
    assert y.shape == X.shape
    np.testing.assert_array_equal(y[1, 6:], 0.0)
    # the padded row equals the short sequence alone, the full row the full one alone
    np.testing.assert_allclose(y[1, :6], jax.jit(m.apply)(v, X[1:, :6])[0], rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(y[0], apply(v, X)[0], rtol=1e-5, atol=1e-6)


# Without the short convolution (and, for RWKV-7, its token shift: not tested here) only the
# recurrence links positions, so a hole of padding in the middle must be invisible: the real
# positions' outputs equal those of the sequence with the hole cut out. This fails unless a
# padded step is the identity on the state (decay 1, beta 0, input gate off, no input).
HOLE = [n for n in NAMES if n != "rwkv7"]


@pytest.mark.slow
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", HOLE)
def test_a_padded_step_is_the_identity_on_the_state(name, causal):
    m, v, apply = _model(name, causal, use_short_conv=False)
    keep = np.ones(11, bool)
    keep[4:7] = False  # positions 4, 5, 6 are padding
    mask = jnp.asarray(np.stack([keep, keep]))
    y = apply(v, jnp.where(mask[..., None], X, -3.0), mask)
    np.testing.assert_array_equal(y[:, ~keep], 0.0)
    np.testing.assert_allclose(y[:, keep], apply(v, X[:, keep]), rtol=1e-5, atol=1e-6)


# The parameters each direction has its own of (a leading axis n_dir), per mixer.
PER_DIRECTION = {
    "gla": ["conv_w", "gk_b", "gk_w1", "gk_w2"], "retnet": ["conv_w"],
    "deltanet": ["b_proj", "conv_w"],
    "gated_deltanet": ["A_log", "a_proj", "b_proj", "conv_w", "dt_bias"],
    "mlstm": ["conv_w", "fgate_b", "gate_w", "igate_b", "skip"],
    "rwkv7": ["a_a", "a_b_proj", "a_bias", "g_a", "g_b_proj", "k_a", "k_k", "mu", "r_k", "w_a",
              "w_b_proj", "w_bias"]}


@pytest.mark.parametrize("name", NAMES)
def test_bidirectional_sees_both_sides_and_is_mirror_symmetric(name):
    later = X.at[:, -1].add(1.0)
    _, v, f = _model(name, False)
    assert not np.allclose(f(v, later)[:, 0], f(v, X)[:, 0])
    _, vc, _ = _model(name, True)
    for n in PER_DIRECTION[name]:
        assert v["params"][n].value.shape[0] == 2 and vc["params"][n].value.shape[0] == 1, n
        assert v["params"][n].value.shape[1:] == vc["params"][n].value.shape[1:], n
    # Swapping the two directions' parameters and reversing the input reverses the output.
    swapped = jax.tree.map(lambda p: p, v)
    for n in PER_DIRECTION[name]:
        leaf = v["params"][n]
        swapped["params"][n] = leaf.replace_boxed(jnp.flip(leaf.value, 0))
    np.testing.assert_allclose(f(swapped, jnp.flip(X, 1)), jnp.flip(f(v, X), 1),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", NAMES)
def test_gradients_are_finite_and_reach_every_parameter(name, causal):
    m, v, _ = _model(name, causal)
    mask = jnp.arange(11)[None] < jnp.asarray([[11], [6]])

    def loss(v, x):
        return jnp.sum(jnp.sin(m.apply(v, x, mask=mask)))
    gv, gx = jax.jit(jax.grad(loss, argnums=(0, 1)))(v, X)
    leaves = jax.tree_util.tree_flatten_with_path(nn_unbox(gv))[0]
    for path, g in leaves:
        assert np.isfinite(g).all(), path
    assert np.isfinite(gx).all()
    np.testing.assert_array_equal(gx[1, 6:], 0.0)  # nothing flows from the padding
    # every parameter gets a gradient, but the second factors of RWKV-7's LoRAs whose first is
    # zero-initialised behind tanh / identity (fla's init: they move once the first does)
    dead = [p[-1].key for p, g in leaves if not np.any(g)]
    assert dead == (["a_b_proj", "w_b_proj"] if name == "rwkv7" else []), dead


def nn_unbox(tree):
    import flax.linen as nn
    return nn.unbox(tree)


@pytest.mark.parametrize("name", NAMES)
def test_state_elements_equal_the_leaves_of_initial_state(name):
    m, v, _ = _model(name, True)
    leaves = jax.tree.leaves(m.apply(v, 1, method=m.initial_state))
    assert m.state_elements() == sum(a.size for a in leaves) > 0
    assert m.state_elements(max_length=4096) == m.state_elements()
    big = m.apply(v, 3, method=m.initial_state)
    assert sum(a.size for a in jax.tree.leaves(big)) == 3 * m.state_elements()
    mb, _, _ = _model(name, False)
    assert mb.state_elements() == 2 * m.state_elements()  # one state per direction


def test_state_sizes_by_hand():
    """The matrix states: heads x d_k x d_v (+ conv inputs, mLSTM's n and m, RWKV-7's shift)."""
    sizes = {n: get_mixer(n)(d_model=64, causal=True).state_elements() for n in NAMES}
    assert sizes["gla"] == 4 * 8 * 16 + 3 * (2 * 32 + 64)
    assert sizes["retnet"] == 8 * 8 * 16 + 3 * (2 * 64 + 128)
    assert sizes["deltanet"] == 4 * 16 * 16 + 3 * (2 * 64 + 64)
    assert sizes["gated_deltanet"] == 4 * 12 * 24 + 3 * (2 * 48 + 96)
    assert sizes["mlstm"] == 4 * (32 * 32 + 32 + 1) + 3 * 128
    assert sizes["rwkv7"] == 1 * 64 * 64 + 64


@pytest.mark.parametrize("name", NAMES)
def test_unknown_and_bad_options_are_named(name):
    cls = get_mixer(name)
    with pytest.raises(TypeError, match="no_such_option"):
        cls(d_model=8, causal=True, no_such_option=1)
    # another family member's option is not silently ignored either
    foreign = {"rwkv7": "n_heads", "mlstm": "expand_k"}.get(name, "head_dim")
    with pytest.raises(TypeError, match=foreign):
        cls(d_model=8, causal=True, **{foreign: 2})
    from sptlib.train.config import base_config
    c = base_config()
    with pytest.raises((AttributeError, KeyError), match="no_such_option"):
        getattr(c.model, name).no_such_option = 1
    bad = dict(head_dim=3) if name == "rwkv7" else dict(n_heads=5)
    with pytest.raises(ValueError, match="head_dim" if name == "rwkv7" else "n_heads"):
        cls(d_model=8, causal=True, **bad).init(jax.random.PRNGKey(0), X)


SSM_PARAMS = {"gla": ["gk_b"], "retnet": [], "deltanet": [],
              "gated_deltanet": ["A_log", "dt_bias"], "mlstm": ["fgate_b", "igate_b"],
              "rwkv7": ["w_bias"]}


@pytest.mark.parametrize("name", NAMES)
def test_decay_parameters_are_the_ssm_group(name):
    _, v, _ = _model(name, False)
    labels = jax.tree_util.tree_flatten_with_path(param_groups.param_labels(v["params"]))[0]
    ssm = sorted(path[0].key for path, lab in labels if lab != "default")
    assert ssm == SSM_PARAMS[name], labels


def _impulse_states(name, steps=9, **extra):
    """The recurrent state `[heads, d_k, d_v]` after an impulse at t=0 and zeros after."""
    m, v, _ = _model(name, True, **extra)
    state = m.apply(v, 1, method=m.initial_state)
    out = []
    for t in range(steps):
        x_t = X[:1, 0] if t == 0 else jnp.zeros((1, 8))
        _, state = m.apply(v, x_t, state, method=m.step)
        out.append(np.asarray(state["rnn"][0], np.float64))
    return m, v, out


def test_retnet_decays_each_head_by_its_fixed_gamma():
    _, _, s = _impulse_states("retnet")
    # after the convolution has flushed (d_conv = 4 steps) k = v = 0: S_t = γ_h S_{t-1}
    ratio = np.linalg.norm(s[8], axis=(1, 2)) / np.linalg.norm(s[7], axis=(1, 2))
    np.testing.assert_allclose(ratio, 1 - 2.0 ** (-5 - np.arange(2)), rtol=1e-5)


def test_gated_deltanet_decay_is_mamba2s():
    _, v, s = _impulse_states("gated_deltanet")
    p = v["params"]
    a_log, dt_bias = p["A_log"].value[0], p["dt_bias"].value[0]
    # zero input: W_a x = 0, so log α = −exp(A_log) softplus(dt_bias); k = 0 stops the delta
    alpha = np.exp(-np.exp(a_log) * np.log1p(np.exp(dt_bias)))
    ratio = np.linalg.norm(s[8], axis=(1, 2)) / np.linalg.norm(s[7], axis=(1, 2))
    np.testing.assert_allclose(ratio, alpha, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_registered_and_trainable_in_a_model(name):
    import optax

    from sptlib.models import build_model
    from sptlib.models.config import model_config
    m = model_config()
    m.mixer, m.d_model, m.n_layers, m.vocab_size, m.max_length, m.ffn_mult = name, 16, 1, 10, 8, 0
    m.causal = True
    getattr(m, name).update({k: v for k, v in OPTIONS[name].items()})
    model = build_model(m, {"kind": "classify", "num_classes": 3})
    ids = jnp.asarray(RNG.integers(2, 10, (4, 8)), jnp.int32)
    labels = jnp.asarray([0, 1, 2, 1])
    v = jax.jit(model.init)(jax.random.PRNGKey(0), ids)

    def loss(p):
        logits = model.apply(p, ids)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    l0, g = jax.jit(jax.value_and_grad(loss))(v)
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(g))
    v1 = jax.tree.map(lambda p, d: p - 1e-2 * d, v, g)
    assert float(jax.jit(loss)(v1)) < float(l0)
