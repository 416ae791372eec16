"""Mixed precision: bf16 compute leaves the training curve where fp32 puts it.

Parameters, optimizer state, the residual stream, softmax statistics, the head and the loss stay
float32; matmuls, attention and norms run in the compute dtype (`config.model.dtype`). The test
trains the same small Transformer 200 masked-denoising steps in float32 and in bfloat16 from the
same initialisation on the same batches and compares the loss curves (on the CPU kernels and,
in CI's second pass, on the jnp ones); `auto` resolves by the stage's devices.
"""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib import data as data_lib
from sptlib.models import config as model_config
from sptlib.train import setup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _smoke():
    spec = importlib.util.spec_from_file_location("smoke", os.path.join(ROOT,
                                                                         "experiments/smoke.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def _batches(n, batch, length, vocab, seed=0):
    """Learnable token sequences: x_t = (x_0 + t * step) mod (vocab - 2) + 2 (ids 0/1 are pad
    and mask), with a random start and stride per row and padding at the end of some rows."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        start = rng.integers(0, vocab - 2, (batch, 1))
        stride = rng.integers(1, 4, (batch, 1))
        tokens = (start + stride * np.arange(length)[None]) % (vocab - 2) + 2
        lengths = rng.integers(length // 2, length + 1, batch)
        mask = np.arange(length)[None] < lengths[:, None]
        out.append({"inputs": np.where(mask, tokens, 0).astype(np.int32), "mask": mask,
                    "label": np.zeros(batch, np.int32), "example_mask": np.ones(batch, bool)})
    return out


def _curve(dtype, batches):
    config = _smoke()
    with config.unlocked():
        config.model.dtype = dtype
        config.model.attention.positions = "rotary"  # neighbours matter in this task
        config.model.d_model = 64
        config.stages.pretrain.optim.warmup_steps = 20
        config.stages.pretrain.num_steps = len(batches)
    info = data_lib.task_info(config.data)
    built = setup.build_stage(config, "pretrain", info=info)
    state, losses = built.state, []
    for batch in batches:
        state, metrics = built.train_step(state, batch)
        total, count = metrics["loss"]
        losses.append(float(total) / float(count))
    return np.array(losses), state


@pytest.mark.timeout(600)
def test_bf16_loss_curve_agrees_with_fp32():
    batches = _batches(200, 8, 64, vocab=17)
    fp32, state32 = _curve("float32", batches)
    bf16, state16 = _curve("bfloat16", batches)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state16.params))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state16.opt_state)
               if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating))
    assert fp32[-20:].mean() < 0.5 * fp32[:5].mean()  # it learns: the comparison means something
    # 20-step windows of the loss agree along the whole curve within 5% of the starting loss
    # (during the steep descent a small shift in time is a large relative difference), and the
    # final window within 10% relative.
    window = lambda c: np.convolve(c, np.ones(20) / 20, mode="valid")
    np.testing.assert_allclose(window(bf16), window(fp32), atol=0.05 * fp32[:5].mean())
    np.testing.assert_allclose(window(bf16)[-1], window(fp32)[-1], rtol=0.10)
    assert not np.array_equal(bf16, fp32)  # bf16 really ran


def test_auto_dtype_resolves_by_platform():
    assert model_config.resolve_dtype("auto", "tpu") == "bfloat16"
    assert model_config.resolve_dtype("auto", "gpu") == "bfloat16"
    assert model_config.resolve_dtype("auto", "cpu") == "float32"
    assert model_config.resolve_dtype("float32", "tpu") == "float32"
    m = model_config.resolve_model_config(model_config.model_config(), {"max_length": 8}, "tpu")
    assert m.dtype == "bfloat16"
