"""Optimizer: hand-computed AdamW steps per group, schedules, clipping, groups by module tag."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

sys.path.insert(0, os.path.dirname(__file__))
import _mp_common as common  # noqa: E402

from sptlib.layers.param_groups import SSMParam  # noqa: E402
from sptlib.layers.ssm import S4DMixer  # noqa: E402
from sptlib.train import optim, steps  # noqa: E402


def naive_adamw(p, grads, lr, wd, b1=0.9, b2=0.999, eps=1e-8, clip=None, all_grads=None):
    """Textbook AdamW (decoupled decay, bias correction) over a list of gradients."""
    p = np.array(p, np.float64)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        g = np.asarray(g, np.float64)
        if clip is not None:
            norm = np.sqrt(sum(np.sum(np.square(np.asarray(x[t - 1], np.float64)))
                               for x in all_grads))
            g = g * min(1.0, clip / norm)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        mh, vh = m / (1 - b1 ** t), v / (1 - b2 ** t)
        p = p - lr(t - 1) * (mh / (np.sqrt(vh) + eps) + wd * p)
    return p


def params_and_grads(seed=0, steps=2):
    rng = np.random.default_rng(seed)
    params = {"backbone": {"layer_0": {"mixer": {
        "log_dt": rng.normal(size=(4,)), "A_re": rng.normal(size=(4, 2)),
        "C": rng.normal(size=(4, 2))}}},
        "head": {"kernel": rng.normal(size=(3, 2)), "bias": rng.normal(size=(2,))}}
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
    grads = [jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape) * (1 + 5 * k),
                                                jnp.float32), params)
             for k in range(steps)]
    return params, grads


def boxed(params):
    """`params` as `model.init` returns them: log_dt and A_re tagged by their (SSM) module."""
    def box(path, x):
        names = (None,) * x.ndim
        ssm = path[-1].key in ("log_dt", "A_re")
        return SSMParam(x, names) if ssm else nn.LogicallyPartitioned(x, names)
    return jax.tree_util.tree_map_with_path(box, params)


def run(tx, params, grads):
    state = tx.init(params)
    for g in grads:
        updates, state = tx.update(g, state, params)
        params = jax.tree.map(lambda p, u: p + u, params, updates)
    return params


def test_ssm_group_own_lr_and_no_weight_decay():
    cfg = optim.optim_config()
    cfg.lr, cfg.ssm_lr, cfg.weight_decay, cfg.ssm_weight_decay = 1e-2, 1e-3, 0.1, 0.0
    cfg.schedule = "constant"
    params, grads = params_and_grads()
    out = run(optim.make_optimizer(cfg, boxed(params), 100), params, grads)
    for path, p in jax.tree_util.tree_flatten_with_path(params)[0]:
        name = path[-1].key
        ssm = name in ("log_dt", "A_re")  # C is the SSM's output map: default group
        lr, wd = (1e-3, 0.0) if ssm else (1e-2, 0.1)
        gs = [np.asarray(_get(g, path)) for g in grads]
        expect = naive_adamw(p, gs, lambda t, lr=lr: lr, wd)
        np.testing.assert_allclose(np.asarray(_get(out, path)), expect, rtol=2e-5, atol=1e-6,
                                   err_msg=name)
    # And the two groups really differ: the same gradient on an SSM param moves it 10x less.
    d_ssm = np.abs(np.asarray(out["backbone"]["layer_0"]["mixer"]["log_dt"]) -
                   np.asarray(params["backbone"]["layer_0"]["mixer"]["log_dt"]))
    assert np.all(d_ssm < 2.1e-3)


def _get(tree, path):
    for k in path:
        tree = tree[k.key]
    return tree


def test_warmup_cosine_and_constant_schedules():
    cfg = optim.optim_config()
    cfg.lr, cfg.warmup_steps, cfg.schedule, cfg.min_lr_ratio = 1.0, 10, "cosine", 0.1
    s = optim.make_schedule(1.0, cfg, 110)
    assert float(s(0)) == 0.0
    assert float(s(5)) == pytest.approx(0.5)
    assert float(s(10)) == pytest.approx(1.0)
    # Half-way through the decay: 0.1 + 0.9 * (1 + cos(pi / 2)) / 2 = 0.55.
    assert float(s(60)) == pytest.approx(0.55, abs=1e-6)
    assert float(s(110)) == pytest.approx(0.1, abs=1e-6)
    cfg.schedule = "constant"
    s = optim.make_schedule(2.0, cfg, 110)
    assert [float(s(t)) for t in (5, 10, 100)] == pytest.approx([1.0, 2.0, 2.0])
    cfg.schedule = "linear"
    with pytest.raises(ValueError, match="schedule"):
        optim.make_schedule(1.0, cfg, 10)


def test_warmup_applies_to_both_groups_and_clipping_is_global():
    cfg = optim.optim_config()
    cfg.lr, cfg.ssm_lr, cfg.warmup_steps, cfg.schedule = 1e-2, 1e-3, 2, "constant"
    cfg.grad_clip, cfg.weight_decay = 1.0, 0.0
    params, grads = params_and_grads(seed=1, steps=3)
    out = run(optim.make_optimizer(cfg, boxed(params), 100), params, grads)
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    all_grads = [[np.asarray(_get(g, path)) for g in grads] for path, _ in flat]
    for (path, p), gs in zip(flat, all_grads):
        peak = 1e-3 if path[-1].key in ("log_dt", "A_re") else 1e-2
        expect = naive_adamw(p, gs, lambda t, peak=peak: peak * min(t / 2, 1.0), 0.0,
                             clip=1.0, all_grads=all_grads)
        np.testing.assert_allclose(np.asarray(_get(out, path)), expect, rtol=2e-5, atol=1e-6)


def test_no_decay_1d():
    cfg = optim.optim_config()
    cfg.lr, cfg.weight_decay, cfg.no_decay_1d, cfg.schedule = 0.1, 0.5, True, "constant"
    params, _ = params_and_grads()
    zeros = jax.tree.map(jnp.zeros_like, params)
    out = run(optim.make_optimizer(cfg, boxed(params), 10), params, [zeros])
    np.testing.assert_array_equal(out["head"]["bias"], params["head"]["bias"])
    np.testing.assert_allclose(out["head"]["kernel"], params["head"]["kernel"] * (1 - 0.05),
                               rtol=1e-6)


def test_real_ssm_model_params_are_labelled_and_not_decayed():
    model, _ = common.build({"kind": "classify", "num_classes": 3}, mixer="s4d")
    b = common.token_batch(batch=2)
    boxed_params = jax.jit(lambda r: model.init(r, b["inputs"], b["mask"])["params"],
                           compiler_options={"xla_backend_optimization_level": 0})(
                               jax.random.PRNGKey(0))
    params = nn.unbox(boxed_params)
    labels = optim.param_labels(boxed_params)
    # The trainer's path: abstract shapes from state_logical_specs keep the same groups.
    abstract, _ = steps.state_logical_specs(model, None, b)
    assert optim.param_labels(abstract["params"]) == labels
    flat = {jax.tree_util.keystr(p): l for p, l in jax.tree_util.tree_flatten_with_path(labels)[0]}
    assert any(l == "ssm" for l in flat.values()) and any(l == "default" for l in flat.values())
    assert all(l == "ssm_dt" for k, l in flat.items() if "log_dt" in k)
    cfg = optim.optim_config()
    cfg.lr, cfg.ssm_lr, cfg.weight_decay, cfg.schedule = 0.1, 0.1, 0.5, "constant"
    zeros = jax.tree.map(jnp.zeros_like, params)
    out = run(optim.make_optimizer(cfg, boxed_params, 10), params, [zeros])
    for (path, p), o in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(out)):
        factor = 1.0 if flat[jax.tree_util.keystr(path)] in ("ssm", "ssm_dt") else 1 - 0.05
        np.testing.assert_allclose(o, p * factor, rtol=1e-6, err_msg=jax.tree_util.keystr(path))


class _NotAnSSM(nn.Module):
    """A layer whose parameters happen to carry SSM names."""

    @nn.compact
    def __call__(self, x):
        box = lambda: nn.with_logical_partitioning(nn.initializers.ones, ("embed",))  # noqa: E731
        return x * self.param("B", box(), x.shape[-1:]) + self.param("log_dt", box(), x.shape[-1:])


def test_groups_come_from_the_module_not_the_leaf_name():
    """A non-SSM parameter named `B` (or `log_dt`) stays in the default group, S4D's `B` is in
    the SSM group, and unboxed arrays (no group) are refused rather than guessed by name."""
    x = jnp.ones((1, 8, 4))
    params = {"other": _NotAnSSM().init(jax.random.PRNGKey(0), x)["params"],
              "s4d": S4DMixer(d_model=4, d_state=4).init(jax.random.PRNGKey(0), x)["params"]}
    labels = optim.param_labels(params)
    assert labels["other"] == {"B": "default", "log_dt": "default"}
    assert labels["s4d"]["B"] == "ssm" and labels["s4d"]["log_dt"] == "ssm_dt"
    assert labels["s4d"]["C"] == "default"
    # The default group really decays `other/B` and the SSM group (wd 0) leaves `s4d/B` alone.
    cfg = optim.optim_config()
    cfg.lr, cfg.ssm_lr, cfg.weight_decay, cfg.ssm_weight_decay = 0.1, 0.1, 0.5, 0.0
    cfg.schedule = "constant"
    plain = nn.unbox(params)
    out = run(optim.make_optimizer(cfg, params, 10), plain,
              [jax.tree.map(jnp.zeros_like, plain)])
    np.testing.assert_allclose(out["other"]["B"], plain["other"]["B"] * (1 - 0.05), rtol=1e-6)
    np.testing.assert_array_equal(out["s4d"]["B"], plain["s4d"]["B"])
    with pytest.raises(ValueError, match="carries no optimiser group"):
        optim.param_labels(plain)


def test_log_dt_takes_its_own_lr_and_the_cosine_its_own_horizon():
    """`ssm_dt_lr` moves log dt alone (the paper code's `lr.dt: null`: log dt at the global lr,
    A and B at 1e-3, all without weight decay); `decay_steps` sets the cosine horizon."""
    x = jnp.ones((1, 8, 4))
    params = S4DMixer(d_model=4, d_state=4).init(jax.random.PRNGKey(0), x)["params"]
    cfg = optim.optim_config()
    cfg.lr, cfg.ssm_lr, cfg.ssm_dt_lr, cfg.schedule = 0.01, 1e-3, 0.01, "constant"
    rates = {k: float(v(5)) for k, v in optim.learning_rates(cfg, 10).items()}
    assert rates == pytest.approx({"default": 0.01, "ssm": 1e-3, "ssm_dt": 0.01})
    cfg.ssm_dt_lr = None
    assert float(optim.learning_rates(cfg, 10)["ssm_dt"](5)) == pytest.approx(1e-3)
    cfg.schedule, cfg.warmup_steps, cfg.decay_steps = "cosine", 0, 20
    # Half of a 20-step horizon at step 10, not the floor of a 10-step stage.
    assert float(optim.make_schedule(1.0, cfg, 10)(10)) == pytest.approx(0.5)
    cfg.decay_steps = 0
    assert float(optim.make_schedule(1.0, cfg, 10)(10)) == pytest.approx(0.0, abs=1e-7)
    assert optim.param_labels(params)["log_dt"] == "ssm_dt"
