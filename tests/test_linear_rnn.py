"""The chunked linear-RNN kernels (`sptlib.kernels.linear_rnn`) against their sequential float64
references: outputs, final states and gradients (all inputs, gates and initial state) for chunk
sizes 1, 16, 64 on a length that is a multiple of none of them; the step loop; causality; the
padded tail; segments; bfloat16 at L = 16k and strong decays (finite, close)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib.kernels import linear_rnn as lr


@pytest.fixture
def x64():
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", old)


def _unit(x):
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def _log_gate(rng, shape, lo=1e-3, hi=2.0):
    """Log decays -exp(U[log lo, log hi]): from near 1 to strong (exp(-hi))."""
    return -np.exp(rng.uniform(np.log(lo), np.log(hi), shape))


class Case:
    """A kernel with its inputs: `chunked(*xs, chunk_size=, initial_state=)`,
    `reference(*xs, initial_state=)`, `step(*xs_t, state)`; `make(rng, b, l, h, dk, dv, strong)`
    returns the input tensors `[batch, length, heads, ...]`, `state(rng, b, h, dk, dv)` a random
    initial state."""

    def __init__(self, chunked, reference, step, make, state=None):
        self.chunked, self.reference, self.step, self.make = chunked, reference, step, make
        self.state = state or (lambda rng, b, h, dk, dv: rng.standard_normal((b, h, dk, dv)))


def _qkv(rng, b, l, h, dk, dv):
    return (rng.standard_normal((b, l, h, dk)), np.asarray(_unit(rng.standard_normal((b, l, h, dk)))),
            rng.standard_normal((b, l, h, dv)))


def _gla(kind):
    def make(rng, b, l, h, dk, dv, strong=False):
        hi = 12.0 if strong else 2.0
        g = {"scalar": (b, l, h), "vector": (b, l, h, dk)}.get(kind)
        return _qkv(rng, b, l, h, dk, dv) + (() if g is None else (_log_gate(rng, g, hi=hi),))
    if kind is None:
        return Case(lambda q, k, v, **kw: lr.gated_linear_attention(q, k, v, None, **kw),
                    lambda q, k, v, **kw: lr.gated_linear_attention_reference(q, k, v, **kw),
                    lambda q, k, v, s: lr.gated_linear_attention_step(q, k, v, None, s), make)
    return Case(lr.gated_linear_attention, lr.gated_linear_attention_reference,
                lr.gated_linear_attention_step, make)


def _delta(gated):
    def make(rng, b, l, h, dk, dv, strong=False):
        beta = 1 / (1 + np.exp(-rng.standard_normal((b, l, h))))
        g = (_log_gate(rng, (b, l, h), hi=12.0 if strong else 2.0),) if gated else ()
        return _qkv(rng, b, l, h, dk, dv) + (beta,) + g
    if not gated:
        return Case(lambda q, k, v, be, **kw: lr.delta_rule(q, k, v, be, None, **kw),
                    lambda q, k, v, be, **kw: lr.delta_rule_reference(q, k, v, be, **kw),
                    lambda q, k, v, be, s: lr.delta_rule_step(q, k, v, be, None, s), make)
    return Case(lr.delta_rule, lr.delta_rule_reference, lr.delta_rule_step, make)


def _rwkv7_make(rng, b, l, h, dk, dv, strong=False):
    r, k, v = _qkv(rng, b, l, h, dk, dv)
    kap = np.asarray(_unit(rng.standard_normal((b, l, h, dk))))
    icl = 1 / (1 + np.exp(-rng.standard_normal((b, l, h, dk))))
    log_w = _log_gate(rng, (b, l, h, dk), hi=12.0 if strong else 0.6)
    return r, k, v, log_w, -kap, kap * icl


def _mlstm(forget):
    def make(rng, b, l, h, dk, dv, strong=False):
        q, k, v = _qkv(rng, b, l, h, dk, dv)
        if strong:
            # positive q·k: with random signs n_tᵀ q_t can cancel, and h_t = C_tᵀ q_t / |n_tᵀ q_t|
            # is then ill-conditioned in its inputs (bfloat16 rounding of an i_pre ~ 60 alone
            # moves a weight by ~10%), whatever the kernel
            q, k = np.abs(q), np.abs(k)
        i_pre = rng.standard_normal((b, l, h)) * (30.0 if strong else 2.0)
        if strong:  # large input gates (exp(i) overflows float32 unstabilised), strong forget
            i_pre = i_pre + 60.0
        if forget == "sigmoid":
            f_pre = rng.standard_normal((b, l, h)) * 3 + (-8.0 if strong else 2.0)
        else:
            f_pre = -np.abs(rng.standard_normal((b, l, h))) * (10.0 if strong else 0.5)
        return q, k, v, i_pre, f_pre

    def state(rng, b, h, dk, dv):
        return (rng.standard_normal((b, h, dk, dv)), rng.standard_normal((b, h, dk)),
                rng.standard_normal((b, h)))

    return Case(lambda *x, **kw: lr.mlstm(*x, forget=forget, **kw),
                lambda *x, **kw: lr.mlstm_reference(*x, forget=forget, **kw),
                lambda *x: lr.mlstm_step(*x, forget=forget), make, state)


CASES = {
    "linear_attention": _gla(None), "scalar_decay": _gla("scalar"), "gla": _gla("vector"),
    "deltanet": _delta(False), "gated_deltanet": _delta(True),
    "rwkv7": Case(lr.rwkv7, lr.rwkv7_reference, lr.rwkv7_step, _rwkv7_make),
    "mlstm_sigmoid": _mlstm("sigmoid"), "mlstm_exp": _mlstm("exp"),
}
B, H, DK, DV = 2, 2, 5, 3


def _inputs(name, l, seed=0, strong=False, dtype=jnp.float64, b=B, h=H, dk=DK, dv=DV):
    rng = np.random.default_rng(seed)
    case = CASES[name]
    xs = [jnp.asarray(x, dtype) for x in case.make(rng, b, l, h, dk, dv, strong)]
    s0 = jax.tree.map(lambda x: jnp.asarray(x, dtype), case.state(rng, b, h, dk, dv))
    return case, xs, s0


def _close(got, want, rtol, atol=0.0):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=atol)


LENGTH = 70  # a multiple of no chunk size above 1: the padded tail is exercised


@pytest.mark.parametrize("chunk", [1, 16, 64])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_float64_reference(x64, name, chunk):
    case, xs, s0 = _inputs(name, LENGTH)
    got = case.chunked(*xs, chunk_size=chunk, initial_state=s0)
    _close(got, case.reference(*xs, initial_state=s0), rtol=1e-9, atol=1e-11)


def _grads(fn, xs, s0, seed=1):
    """Gradients w.r.t. every input and the initial state of a random projection of the
    outputs and the final state."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(fn, xs, s0)
    proj = jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape)), shapes)

    def f(xs, s0):
        return sum(jnp.sum(a * p) for a, p in
                   zip(jax.tree.leaves(fn(xs, s0)), jax.tree.leaves(proj), strict=True))
    return jax.jit(jax.grad(f, argnums=(0, 1)))(xs, s0)


@pytest.mark.parametrize("chunk", [pytest.param(1, marks=pytest.mark.slow), 16,
                                   pytest.param(64, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", list(CASES))
def test_gradients_match_float64_reference(x64, name, chunk):
    """Chunk 16 (5 chunks, a padded tail) in the default suite; 1 and 64 with -m slow (each
    compile is ~3 s of CPU, ~20 s on a loaded machine)."""
    case, xs, s0 = _inputs(name, LENGTH)
    got = _grads(lambda xs, s0: case.chunked(*xs, chunk_size=chunk, initial_state=s0), xs, s0)
    want = _grads(lambda xs, s0: case.reference(*xs, initial_state=s0), xs, s0)
    for g in jax.tree.leaves(got):
        assert np.all(np.isfinite(np.asarray(g)))
    _close(got, want, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("name", list(CASES))
def test_step_loop_equals_parallel(x64, name):
    case, xs, s0 = _inputs(name, 21, seed=2)
    o, s_end = case.chunked(*xs, chunk_size=8, initial_state=s0)
    step = jax.jit(case.step)
    s, outs = s0, []
    for t in range(21):
        o_t, s = step(*[x[:, t] for x in xs], s)
        outs.append(o_t)
    _close((jnp.stack(outs, axis=1), s), (o, s_end), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", list(CASES))
def test_causal(x64, name):
    case, xs, s0 = _inputs(name, 40, seed=3)
    t0 = 23
    o, _ = case.chunked(*xs, chunk_size=16, initial_state=s0)
    rng = np.random.default_rng(4)
    # perturb every input at t0 and after (gates stay in range: scale, do not shift)
    ys = [x.at[:, t0:].multiply(jnp.asarray(rng.uniform(0.5, 1.5, x[:, t0:].shape)))
          for x in xs]
    o2, _ = case.chunked(*ys, chunk_size=16, initial_state=s0)
    np.testing.assert_array_equal(np.asarray(o[:, :t0]), np.asarray(o2[:, :t0]))
    assert np.max(np.abs(np.asarray(o[:, t0:] - o2[:, t0:]))) > 1e-3


@pytest.mark.parametrize("name", list(CASES))
def test_padded_tail_changes_nothing(x64, name):
    """A length of 37 in chunks of 16 is padded to 48 inside (11 identity steps): the final
    state is the reference's state at step 37, and the outputs at the 37 steps equal those of a
    run on 48 real steps (whose final state differs)."""
    case, xs, s0 = _inputs(name, 37, seed=5)
    o, s_end = case.chunked(*xs, chunk_size=16, initial_state=s0)
    _close(s_end, case.reference(*xs, initial_state=s0)[1], rtol=1e-10, atol=1e-12)
    # a tail of different steps (not identities) changes the final state but not o[:37]
    _, ys, _ = _inputs(name, 48, seed=11)
    o2, s2 = case.chunked(*[jnp.concatenate([x, y[:, 37:]], axis=1) for x, y in zip(xs, ys)],
                          chunk_size=16, initial_state=s0)
    _close(o2[:, :37], o, rtol=1e-10, atol=1e-12)
    assert max(float(jnp.max(jnp.abs(a - b))) for a, b in
               zip(jax.tree.leaves(s2), jax.tree.leaves(s_end))) > 1e-3


@pytest.mark.parametrize("name", list(CASES))
def test_final_state_continues_a_second_segment(x64, name):
    case, xs, s0 = _inputs(name, 50, seed=6)
    o, s_end = case.chunked(*xs, chunk_size=16, initial_state=s0)
    o1, s1 = case.chunked(*[x[:, :29] for x in xs], chunk_size=16, initial_state=s0)
    o2, s2 = case.chunked(*[x[:, 29:] for x in xs], chunk_size=16, initial_state=s1)
    _close((jnp.concatenate([o1, o2], axis=1), s2), (o, s_end), rtol=1e-10, atol=1e-12)


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("name", list(CASES))
def test_bfloat16_long_sequence_finite_and_close_to_float32(name):
    """L = 16,384 with decays from ~1 to exp(-12) per step: bfloat16 inputs give finite float32
    outputs, close to the float32 run on the unrounded inputs."""
    length = 16384
    case, xs, s0 = _inputs(name, length, seed=7, strong=True, dtype=jnp.float32, b=1, h=2,
                           dk=4, dv=4)
    run = jax.jit(lambda xs, s0: case.chunked(*xs, chunk_size=64, initial_state=s0))
    o32, s32 = run(xs, s0)
    o16, s16 = run([x.astype(jnp.bfloat16) for x in xs], s0)
    assert o16.dtype == jnp.float32 and o16.shape == o32.shape
    for x in jax.tree.leaves((o16, s16, o32, s32)):
        assert np.all(np.isfinite(np.asarray(x)))
    assert _rel(o16, o32) < 0.05


@pytest.mark.parametrize("name", list(CASES))
def test_strong_decays_float32_match_float64(x64, name):
    """Log decays down to -12 per step (a chunk-local cumulative sum of ~-770 over 64 steps,
    exp of which overflows float32 if formed as exp(-cum)), mLSTM input gates up to ~150:
    float32 chunked equals the float64 reference."""
    case, xs, s0 = _inputs(name, 300, seed=8, strong=True)
    want = case.reference(*xs, initial_state=s0)
    got = case.chunked(*[x.astype(jnp.float32) for x in xs], chunk_size=64,
                       initial_state=jax.tree.map(lambda x: x.astype(jnp.float32), s0))
    for x in jax.tree.leaves(got):
        assert x.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(x)))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert _rel(g, w) < 1e-4


def test_gla_log_decay_forms_agree(x64):
    """A scalar log decay equals the same decay broadcast over d_k (the per-key-dimension path)."""
    case, (q, k, v, g), s0 = _inputs("scalar_decay", 45, seed=9)
    a = lr.gated_linear_attention(q, k, v, g, chunk_size=16, initial_state=s0)
    b = lr.gated_linear_attention(q, k, v, jnp.broadcast_to(g[..., None], q.shape),
                                  chunk_size=16, initial_state=s0)
    _close(a, b, rtol=1e-10, atol=1e-12)


def test_bad_inputs_name_the_parameter():
    q = jnp.zeros((1, 8, 2, 4))
    v = jnp.zeros((1, 8, 2, 3))
    with pytest.raises(ValueError, match="chunk_size"):
        lr.gated_linear_attention(q, q, v, chunk_size=0)
    with pytest.raises(ValueError, match="log_decay"):
        lr.gated_linear_attention(q, q, v, jnp.zeros((1, 8, 3)))
    with pytest.raises(ValueError, match="beta"):
        lr.delta_rule(q, q, v, jnp.zeros((1, 8, 2, 4)))
    with pytest.raises(ValueError, match="^v "):
        lr.delta_rule(q, q, jnp.zeros((1, 7, 2, 3)), jnp.zeros((1, 8, 2)))
    with pytest.raises(ValueError, match="log_w"):
        lr.rwkv7(q, q, v, jnp.zeros((1, 8, 2)), q, q)
    with pytest.raises(ValueError, match="forget"):
        lr.mlstm(q, q, v, jnp.zeros((1, 8, 2)), jnp.zeros((1, 8, 2)), forget="tanh")
    with pytest.raises(ValueError, match="initial_state"):
        lr.gated_linear_attention(q, q, v, initial_state=jnp.zeros((1, 2, 3, 4)))


@pytest.mark.parametrize("name", ["gla", "rwkv7"])
def test_float32_gradient_batch_one_runs(name):
    """Batch 1, 2 heads, 2 chunks in float32: XLA:CPU segfaulted running this gradient before
    `_decayed_scores` flattened its leading axes (a crash kills the test process)."""
    case, xs, s0 = _inputs(name, 128, seed=12, dtype=jnp.float32, b=1, h=2, dk=32, dv=32)
    g = jax.jit(jax.grad(lambda xs: jnp.sum(case.chunked(*xs, chunk_size=64)[0] ** 2)))(xs)
    for x in jax.tree.leaves(g):
        assert np.all(np.isfinite(np.asarray(x)))
