"""Objectives: hand-computed losses/counts with a fixed-output model, and real train steps."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import _mp_common as common  # noqa: E402

from sptlib import objectives, vocab  # noqa: E402
from sptlib.train import optim, sharding, steps  # noqa: E402


# ------------------------------------------------------------------ hand-computed values
class FixedOutput:
    """A fake `model.apply`: returns `variables['params']['out']`, records its inputs."""

    def __init__(self):
        self.calls = []

    def __call__(self, variables, inputs, mask, *, deterministic=True, rngs=None,
                 mutable=False, inputs2=None, mask2=None):
        self.calls.append(dict(inputs=np.asarray(inputs), mask=np.asarray(mask),
                               inputs2=None if inputs2 is None else np.asarray(inputs2),
                               deterministic=deterministic))
        return variables["params"]["out"]


def np_ce(logits, labels):
    """Naive cross-entropy per position: logsumexp - logit of the label."""
    logits = logits.astype(np.float64)
    m = logits.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[..., 0]
    return lse - np.take_along_axis(logits, labels[..., None], -1)[..., 0]


def batch_info(batch):
    """The task `info` a batch comes from (`_mp_common`'s batches)."""
    tokens = np.issubdtype(batch["inputs"].dtype, np.integer)
    return {"vocab_size": common.VOCAB if tokens else 0, "num_classes": 3,
            "input_type": "tokens" if tokens else "continuous", "pair": "inputs2" in batch}


def run_loss(cfg, batch, out, *, train=True, mask_channel=False, seed=1):
    obj = objectives.make_objective(cfg, batch_info(batch), {"mask_channel": mask_channel})
    fake = FixedOutput()
    loss, metrics, _ = obj.loss(fake, {"params": {"out": jnp.asarray(out)}},
                                jax.tree.map(jnp.asarray, batch), jax.random.PRNGKey(seed),
                                train=train)
    metrics = {k: (float(s), float(c)) for k, (s, c) in metrics.items()}
    return float(loss), metrics, fake.calls[-1]


def test_masked_tokens_counts_only_masked_real_positions():
    batch = common.token_batch(seed=3)
    rng = np.random.default_rng(0)
    out = rng.normal(size=batch["inputs"].shape + (common.VOCAB,)).astype(np.float32)
    cfg = objectives.objective_config("masked")
    cfg.mask_rate = 0.5
    loss, m, call = run_loss(cfg, batch, out)
    masked = call["inputs"] == vocab.MASK_ID
    counted = batch["mask"] & batch["example_mask"][:, None]
    # Masks fall only on real positions of counted examples; the rest is passed unchanged.
    assert not np.any(masked & ~counted)
    np.testing.assert_array_equal(call["inputs"][~masked], batch["inputs"][~masked])
    assert 0.3 < masked.sum() / counted.sum() < 0.7
    ce = np_ce(out, batch["inputs"])
    expect = ce[masked].sum()
    assert m["loss"][1] == masked.sum()
    np.testing.assert_allclose(m["loss"][0], expect, rtol=1e-5)
    np.testing.assert_allclose(loss, expect / masked.sum(), rtol=1e-5)
    correct = (out.argmax(-1) == batch["inputs"])[masked].sum()
    assert m["accuracy"] == (correct, masked.sum())
    assert m["masked_fraction"] == (masked.sum(), counted.sum())


def test_masked_eval_masks_fixed_by_batch_not_rng():
    batch = common.token_batch(seed=4)
    out = np.zeros(batch["inputs"].shape + (common.VOCAB,), np.float32)
    cfg = objectives.objective_config("masked")
    _, _, a = run_loss(cfg, batch, out, train=False, seed=1)
    _, _, b = run_loss(cfg, batch, out, train=False, seed=2)
    _, _, c = run_loss(cfg, batch, out, train=True, seed=1)
    _, _, d = run_loss(cfg, batch, out, train=True, seed=2)
    np.testing.assert_array_equal(a["inputs"], b["inputs"])
    assert not np.array_equal(c["inputs"], d["inputs"])
    assert a["deterministic"] and not c["deterministic"]


def test_span_masking_makes_contiguous_spans_at_the_rate():
    real = jnp.asarray(np.arange(400)[None, :] < np.array([[400], [300]]))
    masked = np.asarray(objectives.span_mask(jax.random.PRNGKey(0), real, 0.3, 5))
    assert not np.any(masked & ~np.asarray(real))
    # Independent masking of 2 x 350 positions would give ~0.3 * 0.7 * 700 ≈ 150 boundaries
    # (0 -> 1 switches); spans of mean length >= 3 give far fewer.
    starts = np.sum(masked[:, 1:] & ~masked[:, :-1]) + np.sum(masked[:, 0])
    assert masked.sum() / 700 == pytest.approx(0.3, abs=0.08)
    assert masked.sum() / starts >= 3.0
    single = np.asarray(objectives.span_mask(jax.random.PRNGKey(0), real, 0.3, 1))
    assert single.sum() / 700 == pytest.approx(0.3, abs=0.06)


def test_masked_pixels_zeroed_with_indicator_channel_pixel256():
    batch = common.pixel_batch(channels=2, seed=5)
    batch["mask"][0, -3:] = False  # some padding too
    rng = np.random.default_rng(1)
    out = rng.normal(size=batch["inputs"].shape + (256,)).astype(np.float32)
    cfg = objectives.objective_config("masked")
    cfg.mask_rate = 0.5
    cfg.target = "pixel256"
    loss, m, call = run_loss(cfg, batch, out, mask_channel=True)
    x = call["inputs"]
    assert x.shape == batch["inputs"].shape[:2] + (3,)
    masked = x[..., -1] == 1.0
    counted = batch["mask"] & batch["example_mask"][:, None]
    assert not np.any(masked & ~counted) and masked.sum() > 0
    np.testing.assert_array_equal(x[..., :2][masked], 0.0)
    np.testing.assert_array_equal(x[..., :2][~masked], batch["inputs"][~masked])
    ce = np_ce(out, batch["raw"])  # [batch, length, channels]
    expect = ce[masked].sum()
    assert m["loss"][1] == 2 * masked.sum()  # every channel of a masked position counts
    np.testing.assert_allclose(m["loss"][0], expect, rtol=1e-5)
    np.testing.assert_allclose(loss, expect / (2 * masked.sum()), rtol=1e-5)
    correct = (out.argmax(-1) == batch["raw"])[masked].sum()
    assert m["accuracy"][0] == correct


def test_masked_l1_and_no_indicator_channel():
    batch = common.pixel_batch(seed=6)
    out = np.random.default_rng(2).normal(size=batch["inputs"].shape).astype(np.float32)
    cfg = objectives.objective_config("masked")
    cfg.mask_rate = 1.0
    cfg.target = "l1"
    loss, m, call = run_loss(cfg, batch, out, mask_channel=False)
    assert call["inputs"].shape == batch["inputs"].shape
    counted = batch["mask"] & batch["example_mask"][:, None]
    np.testing.assert_array_equal(call["inputs"][counted], 0.0)
    expect = np.abs(out - batch["inputs"])[counted].sum()
    assert m["loss"][1] == counted.sum()
    np.testing.assert_allclose(m["loss"][0], expect, rtol=1e-5)
    np.testing.assert_allclose(loss, expect / counted.sum(), rtol=1e-5)
    assert "accuracy" not in m


def test_causal_ignores_last_position_and_padding():
    batch = common.token_batch(seed=7)
    out = np.random.default_rng(3).normal(
        size=batch["inputs"].shape + (common.VOCAB,)).astype(np.float32)
    loss, m, call = run_loss(objectives.objective_config("causal"), batch, out)
    np.testing.assert_array_equal(call["inputs"], batch["inputs"])  # nothing masked
    total, count, correct = 0.0, 0, 0
    for b in range(batch["inputs"].shape[0]):
        if not batch["example_mask"][b]:
            continue
        n = int(batch["mask"][b].sum())  # real prefix length
        for t in range(n - 1):
            target = batch["inputs"][b, t + 1]
            total += np_ce(out[b, t], np.array(target))
            correct += int(out[b, t].argmax() == target)
            count += 1
    assert m["loss"][1] == count
    np.testing.assert_allclose(m["loss"][0], total, rtol=1e-5)
    np.testing.assert_allclose(loss, total / count, rtol=1e-5)
    assert m["accuracy"] == (correct, count)


def test_causal_pixels_predict_next_raw_value():
    batch = common.pixel_batch(seed=8)
    out = np.random.default_rng(4).normal(size=batch["inputs"].shape + (256,)).astype(np.float32)
    loss, m, call = run_loss(objectives.objective_config("causal"), batch, out,
                             mask_channel=True)
    np.testing.assert_array_equal(call["inputs"][..., -1], 0.0)  # indicator present, unset
    ce = np_ce(out[:, :-1], batch["raw"][:, 1:])[..., 0]
    w = batch["example_mask"][:, None] & batch["mask"][:, 1:]
    np.testing.assert_allclose(loss, ce[w].mean(), rtol=1e-5)


@pytest.mark.parametrize("kind", ["classify", "retrieval"])
def test_classification_counts_real_examples_only(kind):
    batch = common.token_batch(seed=9, pair=kind == "retrieval")
    batch["example_mask"][2] = False
    logits = np.random.default_rng(5).normal(size=(8, 3)).astype(np.float32)
    loss, m, call = run_loss(objectives.objective_config(kind), batch, logits)
    keep = batch["example_mask"]
    ce = np_ce(logits, batch["label"])
    np.testing.assert_allclose(loss, ce[keep].mean(), rtol=1e-5)
    assert m["loss"][1] == keep.sum() == 6
    assert m["accuracy"] == ((logits.argmax(-1) == batch["label"])[keep].sum(), 6)
    if kind == "retrieval":
        np.testing.assert_array_equal(call["inputs2"], batch["inputs2"])


def test_label_smoothing_and_all_filler_batch():
    batch = common.token_batch(seed=10)
    logits = np.random.default_rng(6).normal(size=(8, 3)).astype(np.float32)
    cfg = objectives.objective_config("classify")
    cfg.label_smoothing = 0.1
    loss, _, _ = run_loss(cfg, batch, logits)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    soft = np.full((8, 3), 0.1 / 3)
    soft[np.arange(8), batch["label"]] += 0.9
    expect = -(soft * logp).sum(-1)[batch["example_mask"]].mean()
    np.testing.assert_allclose(loss, expect, rtol=1e-5)
    batch["example_mask"][:] = False
    loss, m, _ = run_loss(objectives.objective_config("classify"), batch, logits)
    assert loss == 0.0 and m["loss"] == (0.0, 0.0)


def test_heads_mask_channel_and_config_errors():
    info = {"vocab_size": 12, "num_classes": 10, "input_type": "tokens", "pair": False}
    mcfg = {"vocab_size": 0, "mask_channel": False}
    make = objectives.make_objective
    cfg = objectives.objective_config
    assert make(cfg("masked"), info, mcfg).head_cfg == {"kind": "token_logits", "num_outputs": 12}
    assert make(cfg("causal"), info, {"vocab_size": 20}).head_cfg == {
        "kind": "token_logits", "num_outputs": 20}  # the model's vocabulary when set
    assert make(cfg("classify"), info, mcfg).head_cfg == {"kind": "classify", "num_classes": 10}
    cont = dict(info, input_type="continuous", vocab_size=0)
    obj = make(cfg("masked"), cont, {"mask_channel": True})
    assert obj.head_cfg == {"kind": "pixel_logits"} and obj.mask_channel is True
    assert make(cfg("classify"), cont, None).mask_channel is False
    explicit = cfg("classify")
    explicit.mask_channel = True  # the objective's own setting wins over the model's
    assert make(explicit, cont, mcfg).mask_channel is True
    l1 = cfg("masked")
    l1.target = "l1"
    assert make(l1, cont, mcfg).head_cfg == {"kind": "regress"}
    with pytest.raises(ValueError, match="continuous"):
        make(l1, info, mcfg)
    tokens = cfg("masked")
    tokens.target = "tokens"
    with pytest.raises(ValueError, match="token inputs"):
        make(tokens, cont, mcfg)
    with pytest.raises(ValueError, match="paired"):
        make(cfg("retrieval"), info, mcfg)
    with pytest.raises(ValueError, match="kind"):
        cfg("mlm")
    bad = cfg("masked")
    bad.target = "pixels"
    with pytest.raises(ValueError, match="target"):
        make(bad, info, mcfg)
    pixels = jax.tree.map(jnp.asarray, common.pixel_batch(seed=1))
    with pytest.raises(ValueError, match="dtype"):  # built for tokens, given pixels
        make(cfg("masked"), info, mcfg).loss(FixedOutput(), {"params": {}}, pixels,
                                             jax.random.PRNGKey(0), train=True)


# ------------------------------------------------------------------ real steps
CASES = {
    "masked_tokens": ("masked", False, "auto", 1),
    "masked_pixel256": ("masked", True, "pixel256", 1),
    "masked_l1_span": ("masked", True, "l1", 3),
    "causal": ("causal", False, "auto", 1),
    "classify": ("classify", False, "auto", 1),
    "retrieval": ("retrieval", False, "auto", 1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_real_step_loss_decreases(case):
    kind, continuous, target, span = CASES[case]
    cfg = objectives.objective_config(kind)
    cfg.target, cfg.span_length, cfg.mask_rate = target, span, 0.3
    info = {"vocab_size": common.VOCAB, "num_classes": 3, "d_input": 1,
            "input_type": "continuous" if continuous else "tokens",
            "pair": kind == "retrieval", "max_length": common.LENGTH}
    # Continuous SPT uses the indicator channel; the causal token case uses a causal backbone.
    model_cfg = common.tiny_model_config(continuous=continuous, mask_channel=continuous,
                                         causal=kind == "causal")
    obj = objectives.make_objective(cfg, info, model_cfg)
    head = obj.head_cfg
    # Classification runs with BatchNorm (model_state), masked tokens with dropout.
    norm = "batch" if case == "classify" else "layer"
    dropout = 0.1 if case == "masked_tokens" else 0.0
    model, _ = common.build(head, continuous=continuous, mask_channel=continuous,
                            causal=kind == "causal", norm=norm, dropout=dropout)
    batch = (common.pixel_batch(seed=11) if continuous
             else common.token_batch(seed=11, pair=kind == "retrieval"))
    ocfg = optim.optim_config()
    ocfg.lr, ocfg.schedule = 3e-3, "constant"
    mesh = sharding.create_mesh(sharding.mesh_config(), jax.devices()[:1])
    rules = sharding.default_rules()
    abstract, _ = steps.state_logical_specs(model, obj, batch)
    tx = optim.make_optimizer(ocfg, abstract["params"], 10)
    state, shardings = steps.init_train_state(model, tx, batch, jax.random.PRNGKey(0), mesh,
                                              rules, objective=obj)
    fast = {"xla_backend_optimization_level": 0}  # compile time dominates these tests
    train_step = steps.make_train_step(model, obj, tx, mesh, shardings, rules,
                                       compiler_options=fast)
    eval_step = steps.make_eval_step(model, obj, mesh, shardings, rules, compiler_options=fast)
    gb = sharding.shard_batch(batch, mesh, rules)
    # Masked SPT draws new masks every step: compare the loss on fixed (evaluation) masks.
    # The other objectives are deterministic here (no dropout): their train loss at step k is
    # the loss of the parameters before update k.
    fixed = kind == "masked"
    before = eval_step(state, gb)["loss"] if fixed else None
    stats0 = jax.tree.map(np.asarray, state.model_state)
    snapshot = jax.tree.map(jnp.copy, state)  # the train step donates `state`
    losses = []
    for _ in range(6):
        state, metrics = train_step(state, gb)
        assert np.isfinite(float(metrics["loss"][0]))
        assert float(metrics["loss"][1]) > 0
        losses.append(metrics["loss"])
    before = before if fixed else losses[0]
    after = eval_step(state, gb)["loss"] if fixed else losses[-1]
    assert float(after[1]) == float(before[1]) > 0
    l0, l1 = float(before[0] / before[1]), float(after[0] / after[1])
    assert l1 < l0, (l0, l1)
    assert int(state.step) == 6
    if case == "masked_tokens":
        # Masks and dropout come from fold_in(state.rng, step): replaying from the same state
        # gives bitwise the same parameters (what makes resumed runs equal uninterrupted ones).
        replay = snapshot
        for _ in range(6):
            replay, _ = train_step(replay, gb)
        assert steps.params_fingerprint(replay.params) == steps.params_fingerprint(state.params)
    if norm == "batch":
        # BatchNorm statistics are model state: updated by training, not by evaluation.
        assert "batch_stats" in state.model_state
        stats1 = jax.tree.map(np.asarray, state.model_state)
        assert any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(stats0),
                                                         jax.tree.leaves(stats1)))
        eval_step(state, gb)
        for a, b in zip(jax.tree.leaves(stats1), jax.tree.leaves(state.model_state)):
            np.testing.assert_array_equal(a, b)
    else:
        assert state.model_state == {}


def test_spt_on_paired_batch_uses_both_documents_and_task_rates():
    batch = common.token_batch(seed=12, pair=True)
    out = np.random.default_rng(7).normal(
        size=(16,) + batch["inputs"].shape[1:] + (common.VOCAB,)).astype(np.float32)
    loss, m, call = run_loss(objectives.objective_config("causal"), batch, out)
    np.testing.assert_array_equal(call["inputs"],
                                  np.concatenate([batch["inputs"], batch["inputs2"]]))
    keep = np.concatenate([batch["example_mask"]] * 2)[:, None]
    real = np.concatenate([batch["mask"], batch["mask2"]])
    w = keep & real[:, :-1] & real[:, 1:]
    targets = np.concatenate([batch["inputs"], batch["inputs2"]])[:, 1:]
    assert m["loss"][1] == w.sum()
    np.testing.assert_allclose(loss, np_ce(out[:, :-1], targets)[w].mean(), rtol=1e-5)
