"""Causal LM models and evaluation: no leakage from the future, step form == convolution form,
longer windows agree with the training window on its positions, the LM report's arithmetic."""

import math
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib import models, objectives

from sptlib.protocol import lengthgen, lmeval, lmreport
from sptlib.configs import common
from sptlib.data import lm
from sptlib.layers import get_mixer
from sptlib.layers.blocks import FeedForward, Norm

EXP = os.path.join(os.path.dirname(__file__), "..", "experiments", "gss_lm.py")
V = lm.BYTE_LM_VOCAB_SIZE


def _config(name, **model_over):
    c = common.load_module(EXP).get_config(f"model={name}")
    with c.unlocked():
        m = c.model
        m.vocab_size, m.max_length = V, 0
        m.d_model, m.n_layers = 16, 2
        m.gss.d_state = m.dss.d_state = 8
        m.gss.d_ssm = 4
        m.attention.n_heads, m.attention.head_dim, m.attention.chunk_size = 2, 8, 16
        m.update(model_over)
    return c


def _model(name, **model_over):
    c = _config(name, **model_over)
    obj = objectives.make_objective(c.stages.scratch.objective, {"vocab_size": V}, c.model)
    model = models.build_model(c.model, obj.head_cfg)
    return model, obj


def _ids(length, seed=0, batch=2):
    return jnp.asarray(np.random.default_rng(seed).integers(2, V, size=(batch, length)), jnp.int32)


def _init(model, length=32):
    return nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), _ids(length)))


@pytest.mark.parametrize("name", ["gss", "gss-hybrid", "transformer"])
def test_causal_and_longer_windows_agree_with_the_training_window(name):
    """(1) Changing token j never changes the predictions before it; (2) a 4x longer window
    (attention through the chunked kernel, as lmeval runs it) gives the training window's losses
    on its positions."""
    L = 16
    model, obj = _model(name)
    v = _init(model, L)
    ones = lambda n: jnp.ones((2, n), bool)  # noqa: E731
    fn = jax.jit(lambda x: lmeval.per_position_bits(model.apply, v, obj, x, ones(x.shape[1]))[0])
    x = _ids(L, seed=2)
    j = 9
    x2 = x.at[:, j].set((x[:, j] + 5 - 2) % (V - 2) + 2)
    bits, bits2 = fn(x), fn(x2)
    # Position i predicts token i + 1: entries i < j - 1 see the changed token neither as
    # context nor as target.
    np.testing.assert_allclose(bits[:j - 1], bits2[:j - 1], atol=1e-4)
    assert not np.allclose(bits[j - 1], bits2[j - 1], atol=1e-4)  # its target changed
    assert not np.allclose(bits[j:], bits2[j:], atol=1e-4)  # the future sees it
    attention = dict(_config(name).model.attention.to_dict(), impl="chunked")
    long_model, _ = _model(name, attention=attention)
    xl = jnp.concatenate([x, _ids(3 * L, seed=3)], axis=1)
    long, _ = jax.jit(lambda x: lmeval.per_position_bits(long_model.apply, v, obj, x,
                                                         ones(4 * L)))(xl)
    np.testing.assert_allclose(long[:L - 1], bits, atol=1e-4)


def _stack_step_logits(model, params, ids):
    """The recurrent form of a causal SSM stack (GSS blocks, or residual blocks around a mixer
    with a step form), token by token: encoder -> layer steps -> final norm -> head."""
    bb = model.backbone
    x = model.encoder.apply({"params": params["encoder"]}, ids)
    batch, length, d = x.shape
    layers = []
    for i, (mixer, opts) in enumerate(bb.layers):
        p = params["backbone"][f"layer_{i}"]["block"]
        name = "gss" if mixer == "gss" else mixer
        p_mix = p if mixer == "gss" else p["mixer"]
        mod = get_mixer(name)(d_model=d, causal=True, **dict(opts))
        state = mod.apply({"params": p_mix}, batch, length, method=mod.initial_state)
        layers.append([mixer, mod, p, p_mix, state])
    outs = []
    for t in range(length):
        h = x[:, t]
        for layer in layers:
            mixer, mod, p, p_mix, state = layer
            if mixer == "gss":
                h, layer[4] = mod.apply({"params": p_mix}, h, state, method=mod.step)
                continue
            n = Norm(bb.config.norm).apply({"params": p["mixer_norm"]}, h)
            y, layer[4] = mod.apply({"params": p_mix}, n, state, method=mod.step)
            h = h + y
            if bb.config.ffn_mult:
                n = Norm(bb.config.norm).apply({"params": p["ffn_norm"]}, h)
                h = h + FeedForward(d, bb.config.ffn_mult).apply({"params": p["ffn"]}, n)
        h = Norm(bb.config.norm).apply({"params": params["backbone"]["final_norm"]}, h)
        outs.append(model.head.apply({"params": params["head"]}, h[:, None])[:, 0])
    return jnp.stack(outs, axis=1)


@pytest.mark.parametrize("name", ["gss", "dss"])
def test_step_form_loss_equals_convolution_form(name):
    model, obj = _model(name, scan_layers=False)
    v = _init(model, 12)
    x = _ids(12, seed=1)
    conv = model.apply(v, x, jnp.ones(x.shape, bool))
    step = _stack_step_logits(model, v["params"], x)
    np.testing.assert_allclose(step, conv, atol=2e-4, rtol=2e-4)
    mask = jnp.ones(x.shape, bool)
    b_conv, n = lmeval.per_position_bits(model.apply, v, obj, x, mask)
    b_step, _ = lmeval.per_position_bits(lambda *a, **k: step, v, obj, x, mask)
    np.testing.assert_allclose(float(b_step.sum() / n.sum()), float(b_conv.sum() / n.sum()),
                               rtol=1e-5)


def test_learned_positions_are_refused_past_the_training_length():
    c = _config("transformer", positions="learned")
    with pytest.raises(lengthgen.LengthGeneralizationUnsupported, match="learned"):
        lmeval._eval_config(c, 2, 512, 8192)
    c = _config("transformer")  # sinusoidal: extrapolates
    long = lmeval._eval_config(c, 4, 512, 8192)
    assert long.data.max_length == 2048 and long.model.attention.impl == "chunked"
    assert long.data.lm.eval_tokens == 8192


def test_bucket_edges():
    assert lmeval.bucket_edges(8191, 512) == [0, 512, 1024, 2048, 4096, 8191]
    assert lmeval.bucket_edges(511, 512) == [0, 511]


def test_cpu_default_models_have_about_equal_parameters():
    counts = {}
    mod = common.load_module(EXP)
    for name in mod.MODELS:
        c = mod.get_config(f"model={name}")
        with c.unlocked():
            c.model.vocab_size, c.model.max_length = V, 512
        obj = objectives.make_objective(c.stages.scratch.objective, {"vocab_size": V}, c.model)
        model = models.build_model(c.model, obj.head_cfg)
        shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 64), jnp.int32))
        counts[name] = sum(math.prod(x.shape) for x in jax.tree.leaves(nn.unbox(shapes)))
    assert max(counts.values()) / min(counts.values()) < 1.2, counts


def _rec(model, seed, flops, sec, history, factors):
    return {"model": model, "regime": "scratch", "seed": seed, "status": "finished",
            "lm": {"train_length": 512, "eval_tokens": 8192, "split": "test",
                   "train_step_flops": flops, "train_steps_per_s": 1.0 / sec,
                   "history": history, "num_params": 100, "errors": {},
                   "factors": {k: {"bits_per_token": v, "buckets": {"0-512": v}}
                               for k, v in factors.items()}}}


def test_equal_compute_reads_each_curve_at_the_smallest_budget(tmp_path):
    hist = [(10, 4.0), (20, 3.0)]
    recs = [_rec("a", 0, 1.0, 2.0, hist, {"1x": 3.0, "8x": 2.5}),
            _rec("b", 0, 2.0, 0.5, hist, {"1x": 2.0, "8x": 2.4})]
    eq = lmreport.equal_compute(recs)
    # FLOP budget = min(1*20, 2*20) = 20: a at step 20 (3.0), b at step 10 (4.0).
    assert eq["a"]["bits_at_flops"] == [3.0] and eq["b"]["bits_at_flops"] == [4.0]
    # Seconds budget = min(2*20, 0.5*20) = 10: a at step 5 (before its first point: none),
    # b at step 20 (3.0).
    assert eq["a"]["bits_at_seconds"] == [] and eq["b"]["bits_at_seconds"] == [3.0]
    md = lmreport.markdown(recs)
    assert "| a | 3.000 (1) | 2.500 (1) | -0.500 |" in md
    saved = []
    paths = lmreport.write_plots(recs, str(tmp_path), lambda fig, p: saved.append(p))
    assert sorted(paths) == ["equal_compute", "length_generalisation"] and len(saved) == 2


@pytest.mark.slow
def test_tiny_lm_comparison_end_to_end(tmp_path):
    """Real runs (orbax checkpoints on disk) through sptlib.protocol.compare: lmeval scores the best
    checkpoint at 1x and 4x, its 1x value equals the trainer's own test evaluation on the same
    text, and the report gets the LM table and the plots."""
    from sptlib.protocol import compare
    over = {"stages.scratch.num_steps": 2, "stages.scratch.eval_every": 1,
            "stages.scratch.checkpoint_every": 1, "stages.scratch.log_every": 1,
            "stages.scratch.batch_size": 2, "stages.scratch.eval_batch_size": 2,
            "data.max_length": 32, "data.lm.packages": ("ml_collections",),
            "data.lm.max_bytes": 100_000, "data.lm.validation_percent": 20,
            "data.lm.test_percent": 20, "data.lm.eval_tokens": 512, "model.d_model": 16,
            "model.gss.d_ssm": 4, "model.gss.d_state": 8, "model.dss.d_state": 8}
    _, specs = compare.expand(EXP, over, workdir=str(tmp_path), models=["gss", "transformer"],
                              seeds=[0])
    records, paths = compare.run_comparison(specs, str(tmp_path), length_factors=(1, 4))
    for rec in records:
        lm_rec = rec["lm"]
        assert set(lm_rec["factors"]) == {"1x", "4x"} and lm_rec["eval_tokens"] == 512
        assert lm_rec["factors"]["1x"]["bits_per_token"] == pytest.approx(lm_rec["test_bits"],
                                                                         abs=1e-4)
        assert lm_rec["train_step_flops"] > 0 and len(lm_rec["history"]) == 2
    md = open(paths["markdown"]).read()
    assert "Language modelling: bits per token" in md and "Equal compute" in md
    assert os.path.exists(paths["length_generalisation"])
