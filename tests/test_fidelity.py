"""SPT fidelity: self-pretraining must transfer to finetuning through the real pipeline.

A tiny masked-SPT -> finetune run on generated 8 x 8 Lines gratings (L = 64, 4 classes, chance
25%) against scratch at the same finetuning budget, each through `sptlib.protocol.stages.run` with real
orbax checkpoints (finetune starts from the best pretrain checkpoint with a fresh head), with
PyTorch's initialisation (`model.init_scheme="torch"`, the option that reproduces the PyTorch
peer). Measured on this configuration (one seed, 200 test images): SPT 64.5% vs scratch 33.0%
after 200 finetuning steps; with the Linen initialisation SPT reaches only 50.5% (scratch 34.5%;
37.0% when the finetune stage does not load the backbone). The thresholds leave room for
numerical drift across machines but fail for the Linen numbers.
"""

import math

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib.configs import cpu_sized
from sptlib import models
from sptlib.protocol import stages
from sptlib.models.config import model_config

PRETRAIN_STEPS, FINETUNE_STEPS = 2000, 200


def _config(regime, init_scheme="torch"):
    c = cpu_sized.lines("transformer", regime, resolution=8, num_train=2000, num_eval=200,
                          n_layers=1, d_model=32, n_heads=2, steps=FINETUNE_STEPS,
                          pretrain_steps=PRETRAIN_STEPS, batch_size=32, lr=2e-3,
                          eval_every=FINETUNE_STEPS, target="l1", noise=0.25, style="gratings",
                          init_scheme=init_scheme,
                          compare=dict(models=("transformer",), regimes=(regime,), seeds=(0,)))
    with c.unlocked():
        for stage in c.stages.values():
            stage.async_checkpoints = False
        # One evaluation/checkpoint per stage keeps the test cheap.
        c.stages.pretrain.eval_every = c.stages.pretrain.checkpoint_every = PRETRAIN_STEPS
    return c


def _test_accuracy(config, workdir):
    out = stages.run(config, workdir)
    last = config.stage_order[-1]
    return out["summary"].stages[last]["test_accuracy_last"]


def test_spt_then_finetune_beats_scratch_at_equal_finetune_steps(tmp_path):
    spt = _test_accuracy(_config("spt-masked"), tmp_path / "spt")
    scratch = _test_accuracy(_config("scratch"), tmp_path / "scratch")
    assert spt >= scratch + 0.20, (spt, scratch)
    assert spt >= 0.57, spt


def _transformer_params(scheme, d_model=64, heads=4):
    c = model_config()
    c.update(dict(mixer="attention", encoder="linear", mask_channel=True, d_model=d_model,
                  positions="sinusoidal", init_scheme=scheme))
    c.attention.n_heads = heads
    m = models.build_model(c, {"kind": "classify", "num_classes": 4})
    p = m.init(jax.random.PRNGKey(0), jnp.zeros((1, 8, 2)), jnp.ones((1, 8), bool))["params"]
    return {"/".join(k): np.asarray(v) for k, v in
            flax.traverse_util.flatten_dict(nn.unbox(p)).items()}


def test_torch_init_scheme_follows_pytorch_formulas():
    """init_scheme=torch draws what nn.Linear (kaiming-uniform a=sqrt(5): U(+-1/sqrt(fan_in))
    for kernel and bias) and nn.MultiheadAttention (xavier-uniform in-projection over
    [d, 3d], zero in/out biases) draw; the Linen default keeps zero biases."""
    d = 64
    p = _transformer_params("torch", d)
    blk = "backbone/layers/layer/block/"
    uniform = {  # parameter -> bound of its U(-b, b)
        "encoder/dense/kernel": 1 / math.sqrt(2), "encoder/dense/bias": 1 / math.sqrt(2),
        blk + "ffn/wi/kernel": 1 / math.sqrt(d), blk + "ffn/wi/bias": 1 / math.sqrt(d),
        blk + "ffn/wo/kernel": 1 / math.sqrt(2 * d), blk + "ffn/wo/bias": 1 / math.sqrt(2 * d),
        blk + "mixer/out": 1 / math.sqrt(d), "head/logits/kernel": 1 / math.sqrt(d),
        "head/logits/bias": 1 / math.sqrt(d),
        **{blk + f"mixer/{n}": math.sqrt(6 / (d + 3 * d)) for n in ("query", "key", "value")}}
    for name, bound in uniform.items():
        v = p[name]
        assert np.abs(v).max() <= bound, name
        # std of U(-b, b) is b / sqrt(3); loose enough for the smallest (64 values) draw.
        assert abs(v.std() - bound / math.sqrt(3)) < 0.2 * bound / math.sqrt(3), name
    for name in ("query_bias", "key_bias", "value_bias", "out_bias"):
        assert not p[blk + "mixer/" + name].any(), name
    linen = _transformer_params("linen", d)
    assert not linen["encoder/dense/bias"].any() and not linen[blk + "ffn/wi/bias"].any()
    assert abs(linen[blk + "ffn/wi/kernel"].std() - 1 / math.sqrt(d)) < 0.1 / math.sqrt(d)


def test_unknown_init_scheme_is_refused():
    with pytest.raises(ValueError, match="init_scheme"):
        _transformer_params("xavier")
