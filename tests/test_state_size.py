"""State-size accounting (`sptlib.layers.state`): every built-in mixer's declared state equals
the real numbers its `initial_state` holds per sequence; attention's is its KV cache; a user's
mixer falls back to its `initial_state`; comparison records and comparison.md carry it."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from sptlib.layers import MIXERS, get_mixer, state as state_lib
from sptlib.models.config import model_config
from sptlib.protocol import report

WIDTH = 16
SMALL = {"mamba2": {"head_dim": 16}, "rwkv7": {"head_dim": 8}}  # options that fit WIDTH


def _options(name):
    return dict(model_config().get(name) or {}, **SMALL.get(name, {}))


# Every mixer with a recurrent form (hyena has none: its count is a cache, tests/test_hyena.py).
@pytest.mark.parametrize("name", sorted(n for n in MIXERS
                                        if hasattr(get_mixer(n), "initial_state")))
def test_declared_state_equals_initial_state(name):
    mixer = get_mixer(name)(d_model=WIDTH, causal=True, dropout=0.0, **_options(name))
    x = jnp.zeros((1, 8, WIDTH))
    variables = jax.eval_shape(lambda: mixer.init(jax.random.PRNGKey(0), x))
    actual = state_lib.actual_elements(mixer, variables, 32)
    assert mixer.state_elements(32) == actual
    assert state_lib.state_size(name, d_model=WIDTH, options=_options(name), length=32) == \
        state_lib.StateSize(actual, 4 * actual)


def test_hand_counts():
    att = state_lib.state_size("attention", d_model=16, options=dict(n_heads=4), length=100)
    assert att.elements == 2 * 4 * 4 * 100  # K and V, heads x head_dim x length
    half = state_lib.state_size("attention", d_model=16, options=dict(n_heads=4), length=100,
                                dtype=jnp.bfloat16)
    assert half.bytes == 2 * half.elements
    s4d = state_lib.state_size("s4d", d_model=16, options=dict(d_state=64))
    assert s4d.elements == 16 * 32 * 2  # 32 complex modes per channel, two reals each
    mamba = state_lib.state_size("mamba", d_model=16, options=dict(d_state=16, expand=2,
                                                                    d_conv=4))
    assert mamba.elements == 3 * 32 + 32 * 16
    with pytest.raises(ValueError, match="needs max_length"):
        state_lib.state_size("attention", d_model=16)


class _Recurrent(nn.Module):
    d_model: int
    causal: bool = True
    dropout: float = 0.0

    @nn.compact
    def __call__(self, x, *, mask=None, deterministic=True):
        return nn.Dense(self.d_model)(x)

    def initial_state(self, batch_size, max_length=None):
        return {"h": jnp.zeros((batch_size, 3, self.d_model), jnp.complex64),
                "t": jnp.zeros((), jnp.int32)}  # shared counter: not per sequence


class _Stateless(nn.Module):
    d_model: int
    causal: bool = True
    dropout: float = 0.0

    def __call__(self, x, *, mask=None, deterministic=True):
        return x


def test_a_user_mixer_falls_back_to_its_initial_state():
    assert state_lib.state_size(_Recurrent, d_model=5).elements == 3 * 5 * 2
    with pytest.raises(ValueError, match="declares no recurrent state"):
        state_lib.state_size(_Stateless, d_model=5)


def test_records_and_comparison_md_show_the_state():
    from sptlib.experiments import smoke
    from sptlib.models import build, resolve_model_config
    from sptlib.data import task_info
    from sptlib.protocol import records
    c = smoke.get_config()
    m = resolve_model_config(c.model, task_info(c.data), "cpu")
    want = build.model_state_size(m, int(m.max_length))
    assert records._state_size(c) == (want.elements, want.bytes)
    n_heads, hd = m.attention.n_heads, m.d_model // m.attention.n_heads
    assert want.elements == m.n_layers * 2 * n_heads * hd * m.max_length  # attention only
    rec = {"model": "a", "regime": "scratch", "seed": 0, "status": "finished",
           "test_accuracy": 0.6, "val_accuracy": 0.6, "state_elements": 1536,
           "state_bytes": 6144, "stages": {"scratch": {"steps": 3, "num_params": 12345}}}
    md = report.markdown([rec])
    assert "| parameters | state / sequence | train FLOPs |" in md
    assert "| a | scratch | scratch 3 | 0.0123M | 1,536 (6.0 KiB) | – |" in md
