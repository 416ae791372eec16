"""Free hybrid stacks (`config.model.layers`), the block options norm="rms" / ffn="swiglu", a
hybrid checkpoint into another hybrid (one line naming the layer), and the model's state size."""

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from sptlib.errors import ConfigError
from sptlib.layers import state as state_lib
from sptlib.layers.blocks import Norm, SwiGLU
from sptlib.models import build
from sptlib.models.config import model_config


def _cfg(layers="", n_layers=4, **kw):
    m = model_config()
    m.update(d_model=8, n_layers=n_layers, vocab_size=10, max_length=16, dtype="float32",
             layers=layers, **kw)
    m.attention.n_heads = 2
    m.s4d.d_state = 4
    return m


def _names(m):
    return [name for name, _ in build.layer_specs(m)]


def test_pattern_repeats_to_n_layers_with_per_layer_options():
    assert _names(_cfg("s4d*3,attention", 8)) == ["s4d"] * 3 + ["attention"] + ["s4d"] * 3 + [
        "attention"]
    specs = build.layer_specs(_cfg("s4d, attention(n_heads=4, impl=chunked)", 2))
    att = dict(specs[1][1])
    assert att["n_heads"] == 4 and att["impl"] == "chunked" and att["dtype"] == jnp.float32
    assert dict(specs[0][1])["d_state"] == 4  # config.model.s4d under it


def test_explicit_list_with_per_layer_options():
    m = ml_collections.ConfigDict(dict(
        _cfg().to_dict(), layers=["s4d", {"mixer": "attention", "n_heads": 1}, "s4d",
                                  {"mixer": "s4d", "d_state": 2}]))
    specs = build.layer_specs(m)
    assert [n for n, _ in specs] == ["s4d", "attention", "s4d", "s4d"]
    assert dict(specs[1][1])["n_heads"] == 1 and dict(specs[3][1])["d_state"] == 2


@pytest.mark.parametrize("layers,n_layers,needle", [
    ("s4d*3,attention", 6, "config.model.layers='s4d*3,attention' is a unit of 4 layers, "
                           "which does not divide config.model.n_layers=6"),
    ("s4d,mamab", 2, "unknown mixer 'mamab' (did you mean 'mamba'?"),
    ("s4d,attention(n_head=2)", 2, "mixer 'attention' takes no option 'n_head' (did you mean "
                                   "'n_heads'?"),
    ("s4d*x", 2, "the repeat count after '*' must be a positive integer"),
    ("s4d,,attention", 2, "an empty entry"),
])
def test_bad_layers_are_one_line(layers, n_layers, needle):
    with pytest.raises(ConfigError) as e:
        build.layer_specs(_cfg(layers, n_layers))
    assert "\n" not in str(e.value) and needle in str(e.value), str(e.value)


def test_list_of_the_wrong_length_and_layers_with_a_pattern():
    m = ml_collections.ConfigDict(dict(_cfg().to_dict(), layers=["s4d", "attention"]))
    with pytest.raises(ConfigError, match="a list of 2 layers, but config.model.n_layers=4"):
        build.layer_specs(m)
    with pytest.raises(ConfigError, match="set one"):
        build.layer_specs(_cfg("s4d,attention", pattern="gss_hybrid"))


def test_old_patterns_keep_working():
    assert _names(_cfg(pattern="gss_hybrid")) == ["gss", "attention", "gss", "gss"]
    assert _names(_cfg(pattern="uniform", mixer="s4d")) == ["s4d"] * 4
    assert _names(_cfg("gss,attention,gss,gss")) == _names(_cfg(pattern="gss_hybrid"))


def _model(m):
    model = build.build_model(m, {"kind": "classify", "num_classes": 3})
    x = jnp.ones((2, 16), jnp.int32)
    v = model.init(jax.random.PRNGKey(0), x, jnp.ones((2, 16), bool))
    return model, nn.meta.unbox(v), x


def test_a_hybrid_model_runs_with_rms_norm_and_swiglu():
    model, v, x = _model(_cfg("s4d,attention", 2, norm="rms", ffn="swiglu"))
    y = model.apply(v, x, jnp.ones((2, 16), bool))
    assert y.shape == (2, 3) and bool(jnp.all(jnp.isfinite(y)))
    flat = flax.traverse_util.flatten_dict(v["params"], sep="/")
    assert "backbone/layer_0/block/mixer/A_re" in flat
    assert "backbone/layer_1/block/mixer/query" in flat
    assert "backbone/layer_1/block/ffn/wi_gate/kernel" in flat
    assert "backbone/layer_0/block/mixer_norm/rms_norm/scale" in flat


def test_rms_norm_and_swiglu_by_hand():
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 8))
    n = Norm("rms")
    y = n.apply(n.init(jax.random.PRNGKey(1), x), x)
    ref = x / np.sqrt(np.mean(np.square(x), -1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    f = SwiGLU(8, mult=2)
    p = nn.meta.unbox(f.init(jax.random.PRNGKey(2), x))["params"]
    g = x @ p["wi_gate"]["kernel"] + p["wi_gate"]["bias"]
    u = x @ p["wi_up"]["kernel"] + p["wi_up"]["bias"]
    h = g / (1 + np.exp(-g)) * u
    np.testing.assert_allclose(f.apply({"params": p}, x), h @ p["wo"]["kernel"] + p["wo"]["bias"],
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="config.model.ffn='geglu' not in"):
        _model(_cfg(ffn="geglu", mixer="s4d"))


def test_a_hybrid_checkpoint_loads_only_into_the_same_hybrid(monkeypatch):
    from sptlib.train import transfer
    _, saved, _ = _model(_cfg("s4d,attention", 2))
    _, other, _ = _model(_cfg("attention,s4d", 2))
    _, same, _ = _model(_cfg("s4d,attention", 2))
    shapes = lambda t: jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), t)
    monkeypatch.setattr(transfer, "saved_tree", lambda _: {"params": shapes(saved["params"])})
    plan, _ = transfer.plan_load("ckpt", {"params": same["params"], "model_state": {}}, ())
    assert plan["params"]
    with pytest.raises(transfer.IncompatibleCheckpointError) as e:
        transfer.plan_load("ckpt", {"params": other["params"], "model_state": {}}, ())
    line = str(e.value)
    assert "\n" not in line and "layer 0 of the backbone differs (a hybrid stack loads only " \
                                "into the same config.model.layers)" in line, line


def test_model_state_size_sums_the_layers():
    m = _cfg("s4d*3,attention", 4)
    got = build.model_state_size(m, length=16)
    s4d = state_lib.state_size("s4d", d_model=8, options=dict(d_state=4))
    att = 2 * 2 * 4 * 16  # K and V: heads x head_dim x length
    assert got == state_lib.StateSize(3 * s4d.elements + att, 4 * (3 * s4d.elements + att))
    assert s4d.elements == 8 * 4  # 8 channels x 2 conjugate-pair modes x 2 real numbers
    assert build.model_state_size(_cfg(pattern="bow"), 16).elements == 0
