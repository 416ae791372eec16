"""Data-driven priors and controls beside SPT: the mlpinit regime (per-token stage 1, then the full
model with fresh mixers), Transformer width/depth variants as grid entries, the bag-of-words
control (`sptlib.configs.variants`, `sptlib.models.bow`)."""

import json
import os
import pathlib
import re

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib.protocol import compare
from sptlib import data as data_lib
from sptlib.configs import common, testing, variants
from sptlib.train import flops
from sptlib.models import build_model
from sptlib.models import config as model_config_lib

ROOT = pathlib.Path(__file__).parents[1]
LRA = common.load_module(str(ROOT / "experiments" / "lra.py"))


def _model_cfg(mixer, **kw):
    c = model_config_lib.model_config()
    c.update(dict(mixer=mixer, n_layers=2, d_model=16, vocab_size=20, max_length=12,
                  positions="sinusoidal" if mixer == "attention" else "none"))
    c.s4d.d_state = 8
    c.update(kw)
    return c


def _paths(tree):
    return {"/".join(k) for k in flax.traverse_util.flatten_dict(tree)}


# ------------------------------------------------------------------------------------------------
# mlpinit's stage-1 model: every mixer bypassed.
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mixer,prenorm", [("attention", True), ("s4d", False)])
def test_bypassed_model_is_per_token_and_lacks_exactly_the_mixers(mixer, prenorm):
    """Changing token j leaves every output i != j unchanged once the mixers are bypassed (and
    changes them in the full model, so the check can fail); the bypassed parameter tree is the
    full one minus the `/mixer/` subtrees."""
    head = {"kind": "token_logits"}
    x = jax.random.randint(jax.random.PRNGKey(1), (2, 12), 2, 20)
    j = 5
    x2 = x.at[:, j].set((x[:, j] + 3) % 18 + 2)
    out = {}
    for bypass in (False, True):
        model = build_model(_model_cfg(mixer, prenorm=prenorm, bypass_mixers=bypass), head)
        variables = model.init(jax.random.PRNGKey(0), x)
        out[bypass] = (_paths(variables["params"]), model.apply(variables, x),
                       model.apply(variables, x2))
    full, bypassed = out[False][0], out[True][0]
    assert bypassed == {p for p in full if not re.search(variants.MIXER_PATTERN, p)}
    assert len(full - bypassed) >= 2  # some mixer tensors were there to bypass
    others = [i for i in range(12) if i != j]
    _, y, y2 = out[True]
    np.testing.assert_array_equal(np.asarray(y[:, others]), np.asarray(y2[:, others]))
    assert not np.allclose(y[:, j], y2[:, j])
    _, y, y2 = out[False]
    assert not np.allclose(y[:, others], y2[:, others])


def test_bypass_refuses_gss_blocks():
    c = _model_cfg("gss", bypass_mixers=True)
    c.gss.d_state = 8
    model = build_model(c, {"kind": "classify", "num_classes": 2})
    with pytest.raises(ValueError, match="GSS"):
        model.init(jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32))


# ------------------------------------------------------------------------------------------------
# The mlpinit regime's config.
# ------------------------------------------------------------------------------------------------

def test_mlpinit_regime_config():
    scratch = LRA.get_config("listops-cpu,s4d,scratch")
    for objective in variants.MLPINIT_OBJECTIVES:
        c = LRA.get_config(f"listops-cpu,s4d,mlpinit,mlpinit_objective={objective}")
        st = c.stages
        assert c.stage_order == ("mlpinit", "finetune")
        assert st.mlpinit.bypass_mixers and st.mlpinit.objective.kind == objective
        assert st.mlpinit.num_steps == LRA.CPU["pretrain_steps"] and not st.mlpinit.init_from
        assert st.finetune.init_from == "mlpinit"
        # Same finetune budget and optimiser as scratch.
        assert st.finetune.num_steps == scratch.stages.scratch.num_steps
        assert st.finetune.optim.to_dict() == scratch.stages.scratch.optim.to_dict()
        assert st.finetune.batch_size == scratch.stages.scratch.batch_size
        head = () if objective == "classify" else ("^head/",)
        assert tuple(st.finetune.dont_load) == (variants.MIXER_PATTERN,) + head
        assert "bypass_mixers" not in st.finetune and "bypass_mixers" not in st.scratch
        # The compute estimate of stage 1 counts no mixer: 6 · params · tokens only.
        est = flops.estimate_flops(c, "mlpinit", num_params=1000)
        assert est["flops"] == 6 * 1000 * est["tokens"]
        assert flops.estimate_flops(c, "finetune", num_params=1000)["flops"] > 6 * 1000 * (
            flops.estimate_flops(c, "finetune", num_params=1000)["tokens"])
    c = LRA.get_config("listops-cpu,s4d,mlpinit,mlpinit_objective=masked")
    assert c.stages.mlpinit.objective.mask_rate == 0.10  # the paper's ListOps rate
    with pytest.raises(ValueError, match="mlpinit objective"):
        LRA.get_config("listops-cpu,s4d,mlpinit,mlpinit_objective=causal")
    # Paper presets build the regime too, for every task (config only, no JAX).
    for task in LRA.TASKS:
        c = LRA.get_config(f"{task},transformer,mlpinit")
        assert c.stage_order == ("mlpinit", "finetune")
        assert c.stages.mlpinit.objective.kind == c.stages.scratch.objective.kind


def test_mlpinit_stage2_loads_exactly_the_non_mixer_tensors(tmp_path):
    """Real pipeline, real orbax checkpoints: stage 2 loads every tensor but the mixers (listed
    in its results), keeps the mixers at their fresh init, and stage 1's train step is counted
    with fewer FLOPs. A mis-shaped or missing non-mixer tensor stops the load, named."""
    from sptlib.protocol import stages
    from sptlib.train import setup
    from sptlib.train import transfer

    c = testing.tiny(LRA.get_config("listops-cpu,transformer,mlpinit"), steps=2, max_length=32)
    with c.unlocked():
        c.model.n_layers = 2
        c.data.lra_dir = str(tmp_path / "data")
        c.data.generate.update(num_train=16, num_val=8, num_test=8, min_length=4,
                               max_length=32)
        for s in c.stages.values():
            s.async_checkpoints = False
    wd = tmp_path / "run"
    stages.run(c, str(wd))
    res = json.loads((wd / "finetune" / "results.json").read_text())
    init = res["init"]
    built = setup.build_stage(c, "finetune", info=data_lib.task_info(c.data),
                              abstract=True)
    every = _paths(built.state.params)
    mixers = {p for p in every if re.search(variants.MIXER_PATTERN, p)}
    assert mixers and init["kind"] == "init_from"
    assert set(init["loaded_tensors"]) == every - mixers
    assert set(init["not_loaded"]) == mixers and not init["skipped_from_checkpoint"]
    assert "head/logits/kernel" in init["loaded_tensors"]  # classify stage 1: the task's head
    stage1 = json.loads((wd / "mlpinit" / "results.json").read_text())
    assert 0 < stage1["flops_per_step"] < res["flops_per_step"]
    # A non-mixer tensor of the wrong shape, or missing from the checkpoint: a loud error.
    step_dir = transfer.resolve_init_checkpoint("mlpinit", str(wd))
    params = {p: np.zeros(x.shape, x.dtype) for p, x in
              flax.traverse_util.flatten_dict(built.state.params, sep="/").items()}
    bad = dict(params)
    bad["encoder/embed/embedding"] = np.zeros((3, 3), np.float32)
    with pytest.raises(transfer.IncompatibleCheckpointError, match="encoder/embed/embedding"):
        transfer.load_pretrained(step_dir, flax.traverse_util.unflatten_dict(bad, sep="/"),
                                 dont_load=(variants.MIXER_PATTERN,))
    extra = dict(params, **{"backbone/extra_norm/scale": np.ones((4,), np.float32)})
    with pytest.raises(transfer.IncompatibleCheckpointError, match="extra_norm"):
        transfer.load_pretrained(step_dir, flax.traverse_util.unflatten_dict(extra, sep="/"),
                                 dont_load=(variants.MIXER_PATTERN,))


# ------------------------------------------------------------------------------------------------
# Width/depth variants.
# ------------------------------------------------------------------------------------------------

def _count(c, head):
    model = build_model(c, head)
    x = jnp.zeros((1, 8), jnp.int32)
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), x))
    return sum(int(np.prod(v.shape)) for v in jax.tree.leaves(shapes["params"]))


def _wide_grid_counts():
    from sptlib.data import tokenizers
    """{model: (layers, heads, head_dim, ffn_mult, parameters)} of the CPU wide grid."""
    out = {}
    for name in LRA.GRIDS["wide"][0]:
        m = LRA.get_config(f"listops-cpu,{name},scratch,grid=wide").model
        m.vocab_size = tokenizers.LISTOPS_VOCAB_SIZE  # what the trainer fills in
        head_dim = m.attention.head_dim or m.d_model // m.attention.n_heads
        out[name] = (m.n_layers, m.attention.n_heads, head_dim, m.ffn_mult,
                     _count(m, {"kind": "classify", "num_classes": 10}))
    return out


def test_wide_and_deep_have_the_parameter_counts_the_docs_state():
    counts = _wide_grid_counts()
    deep = counts["transformer-deep"]
    L, d = deep[0], 64
    assert deep[:2] == (4, 2)
    for name, k in (("transformer-wide2", 2), ("transformer-wide", 4)):
        layers, heads, head_dim, ffn, n = counts[name]
        assert (layers, heads, head_dim, ffn) == (L // k, 2 * k, 32, 2 * k)
        # Equal parameters but for the per-layer vectors a merged layer has once instead of k
        # times: attention output bias, FFN output bias, two layer norms (6 d per merged layer).
        assert deep[4] - n == (L // k) * (k - 1) * 6 * d
    docs = (ROOT / "docs" / "models.md").read_text()
    for name, (layers, heads, _, ffn, n) in counts.items():
        row = f"| `{name}` | {layers} × {heads} | {ffn} | {n:,} |"
        assert row in docs, f"docs/models.md wide/deep table is stale: {row}"
    # A variant of a depth that k does not divide is refused, naming both.
    with pytest.raises(ValueError, match="n_layers=4 is not a multiple of k=3"):
        LRA.get_config("listops-cpu,transformer-wide3,scratch,grid=wide")


# ------------------------------------------------------------------------------------------------
# The bag-of-words control.
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("encoder", ["token", "linear"])
def test_bow_ignores_token_order(encoder):
    """A permuted input (and its mask) gives the same logits; the Transformer's do change, so
    the check can fail."""
    rng = np.random.default_rng(0)
    perm = rng.permutation(12)
    if encoder == "token":
        x = jnp.asarray(rng.integers(2, 20, (3, 12)), jnp.int32)
    else:
        x = jnp.asarray(rng.normal(size=(3, 12, 2)), jnp.float32)
    mask = jnp.asarray(np.arange(12)[None] < np.array([[12], [9], [5]]))
    head = {"kind": "classify", "num_classes": 4}
    for name in ("bow", "transformer"):
        c = LRA.get_config(f"listops,{name},scratch").model
        c.update(d_model=16, n_layers=1, vocab_size=20, max_length=12)
        c.attention.n_heads = 2
        if encoder == "linear":
            c.update(encoder="linear", d_input=1, mask_channel=True)
        model = build_model(c, head)
        variables = model.init(jax.random.PRNGKey(0), x, mask)
        y = model.apply(variables, x, mask)
        y_perm = model.apply(variables, x[:, perm], mask[:, perm])
        if name == "bow":
            assert set(variables["params"]) == {"encoder", "head"}  # no mixer anywhere
            np.testing.assert_allclose(np.asarray(y_perm), np.asarray(y), rtol=1e-5, atol=1e-6)
        else:
            assert not np.allclose(y_perm, y, atol=1e-4)


def test_grids_hold_variants_priors_and_the_bow_control(tmp_path):
    """`grid=priors` / `grid=wide` expand to their models × regimes × 3 seeds, with the bow
    control in every grid under scratch only (no JAX)."""
    cfg = str(ROOT / "experiments" / "lra.py")
    _, specs = compare.expand(cfg + ":listops-cpu,grid=priors", {}, workdir=str(tmp_path))
    cells = sorted({(s.model, s.regime) for s in specs})
    assert cells == sorted([(m, g) for m in ("transformer", "s4d")
                            for g in ("scratch", "spt-masked", "mlpinit")] + [("bow", "scratch")])
    assert len(specs) == 3 * len(cells)
    by = {(s.model, s.regime): s.config for s in specs}
    assert by[("s4d", "mlpinit")].stage_order == ("mlpinit", "finetune")
    assert by[("bow", "scratch")].model.pattern == "bow"
    from sptlib.train import preflight
    preflight.check_model(by[("bow", "scratch")].model)  # no mixer, no layers: accepted
    _, specs = compare.expand(cfg + ":listops-cpu,grid=wide", {}, workdir=str(tmp_path))
    assert sorted({s.model for s in specs}) == sorted(
        ["transformer-deep", "transformer-wide2", "transformer-wide", "bow"])
    for grid in LRA.GRIDS:
        assert "bow" in LRA.get_config(f"listops,grid={grid}").compare.models
    # The quickstart keeps its 10-minute grid; the control is one flag away there.
    _, qs = compare.expand(str(ROOT / "experiments" / "quickstart.py"), {},
                           workdir=str(tmp_path / "qs"), models=["transformer", "s4d", "bow"])
    assert {s.config.model.pattern for s in qs if s.model == "bow"} == {"bow"}
    assert os.path.basename(specs[0].workdir) == "seed0"


def test_report_shows_mlpinit_gain_and_stage_flops():
    """The table reports mlpinit against scratch and each stage's training FLOPs (steps x the
    traced step's FLOPs), so stage 1's cost sits beside its gain."""
    from sptlib.protocol import report
    recs = []
    for seed in range(3):
        for regime, stages, acc in (("scratch", {"scratch": (400, 2e9)}, 0.30),
                                    ("mlpinit", {"mlpinit": (400, 5e8), "finetune": (400, 2e9)},
                                     0.34)):
            recs.append(dict(model="transformer", regime=regime, seed=seed, status="finished",
                             test_accuracy=acc + 0.01 * seed, val_accuracy=acc,
                             stages={k: {"steps": n, "flops_per_step": f}
                                     for k, (n, f) in stages.items()}, wall_time_s=60.0))
    text = report.markdown(recs)
    assert "| transformer | mlpinit − scratch | +4.0 ± " in text
    # parameters and state / sequence: "–" for records without them (the compute table's columns)
    assert "| transformer | scratch | scratch 400 | – | – | 8.00e+11 |" in text
    assert ("| mlpinit 400, finetune 400 | – | – | mlpinit 2.00e+11, finetune 8.00e+11 (total "
            "1.00e+12) |" in text)
