"""Every experiment config builds its model and trains one step at a tiny size (no data needed:
batches are synthesised to the task's shapes), so no config rots."""

import glob
import os

import jax
import numpy as np
import pytest

from sptlib import data
from sptlib.configs import common, presets, testing
from sptlib.train import flops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LRA = common.load_module(os.path.join(ROOT, "experiments", "lra.py"))


def fake_info(cfg):
    d = cfg.data
    cont = d.input_type == "continuous"
    classes = {"listops": 10, "image": 10, "scifar": 10, "speech_commands": 35}.get(d.task, 2)
    # The tests' own length (`tiny` sets max_length) wins over the task's.
    length = int(d.max_length) or data.sequence_length(d)
    return dict(vocab_size=0 if cont else 260, num_classes=classes,
                max_length=length, input_type=d.input_type,
                d_input=cfg.model.d_input if cont else 1, pair=d.task == "retrieval",
                per_position=d.task in ("associative_recall", "selective_copying"))


def fake_batch(info, batch_size, rng):
    B, L = batch_size, info["max_length"]
    b = {"mask": np.ones((B, L), bool), "example_mask": np.ones((B,), bool),
         "label": rng.integers(0, info["num_classes"], B).astype(np.int32)}
    b["mask"][:, L - L // 4:] = False  # some padding, so masks are exercised
    if info["input_type"] == "continuous":
        b["raw"] = rng.integers(0, 256, (B, L, info["d_input"])).astype(np.int32)
        b["inputs"] = (b["raw"] / 127.5 - 1.0).astype(np.float32)
    else:
        b["inputs"] = rng.integers(2, info["vocab_size"], (B, L)).astype(np.int32)
    if info["pair"]:
        b["inputs2"], b["mask2"] = b["inputs"][::-1].copy(), b["mask"].copy()
    if info["per_position"]:  # the probes: a class at a fifth of the positions, -1 elsewhere
        scored = rng.random((B, L)) < 0.2
        b["targets"] = np.where(scored, rng.integers(0, info["num_classes"], (B, L)),
                                -1).astype(np.int32)
    return b


def train_one_step(cfg):
    """Builds every stage's model and objective and runs one real step; returns the losses."""
    from sptlib import models, objectives
    from sptlib.train import optim, sharding, steps

    info = fake_info(cfg)
    with cfg.unlocked():  # what the trainer fills in from task.info
        cfg.model.vocab_size = cfg.model.vocab_size or info["vocab_size"]
        cfg.model.max_length = cfg.model.max_length or info["max_length"]
    mesh = sharding.create_mesh(cfg.mesh)
    rules = [tuple(r) for r in cfg.logical_axis_rules]
    rng = np.random.default_rng(0)
    losses = {}
    for name in cfg.stage_order:
        st = cfg.stages[name]
        obj = objectives.make_objective(st.objective, info, cfg.model)
        model = models.build_model(cfg.model, obj.head_cfg)
        host = fake_batch(info, st.batch_size, rng)
        abstract, _ = steps.state_logical_specs(model, obj, host)
        tx = optim.make_optimizer(st.optim, abstract["params"], st.num_steps)
        state, shardings = steps.init_train_state(model, tx, host, jax.random.key(0), mesh, rules,
                                                  objective=obj)
        step = steps.make_train_step(model, obj, tx, mesh, shardings, rules)
        state, metrics = step(state, sharding.shard_batch(host, mesh, rules))
        loss = float(np.asarray(metrics["loss"][0] if isinstance(metrics["loss"], tuple)
                                else metrics["loss"]))
        assert np.isfinite(loss), (name, loss)
        losses[name] = loss
    return losses


def test_every_lra_task_model_regime_config_resolves():
    """All 7 × 9 × 4 LRA cells build a consistent config (cheap: no JAX)."""
    from sptlib.train import config as train_config
    for task in LRA.TASKS:
        for model in presets.MODELS:
            for regime in presets.REGIMES:
                c = LRA.get_config(f"{task},{model},{regime}")
                train_config.validate(c)
                assert c.data.task == task
                if regime.startswith("spt"):
                    assert c.stage_order == ("pretrain", "finetune")
                    assert c.stages.finetune.init_from == "pretrain"
                    assert (c.stages.finetune.num_steps == c.stages.scratch.num_steps)
                    if regime == "spt-masked":
                        # Rates: tests/test_config_fidelity.py (against the released configs).
                        assert c.stages.pretrain.objective.kind == "masked"
                    else:
                        assert c.model.causal
                elif regime == "scratch-equal-compute":
                    # As many training examples as pretraining + finetuning (their batches differ
                    # where the released pretraining config's does).
                    pt, ft = c.stages.pretrain, c.stages.finetune
                    assert c.stages.scratch.num_steps == ft.num_steps + round(
                        pt.num_steps * pt.batch_size / ft.batch_size)
    # Paper facts spot-checked (the SPT paper and its released configs).
    c = LRA.get_config("listops,s4,spt-masked")
    assert (c.model.n_layers, c.model.d_model, c.stages.pretrain.objective.mask_rate) == (
        8, 128, 0.10)
    c = LRA.get_config("pathx256,transformer,scratch")
    assert (c.model.n_layers, c.model.d_model, c.model.attention.window) == (4, 128, 8192)
    c = LRA.get_config("image,transformer,spt-masked")
    assert (c.model.n_layers, c.model.d_model, c.model.attention.n_heads,
            c.model.ffn_mult) == (3, 64, 4, 2)


# One real tiny step per task (alternating models) and per model (alternating tasks), not the
# full cross product: every task's data shapes / heads and every mixer are exercised.
_CELLS = sorted({(t, ("transformer", "s4d")[i % 2], ("spt-masked", "scratch")[i % 2])
                 for i, t in enumerate(LRA.TASKS)}
                | {(("listops", "image", "pathfinder")[i % 3], m, ("spt-masked", "spt-causal")[
                    m == "transformer-causal"]) for i, m in enumerate(presets.MODELS)})


# Compiling two stages costs ~10-50 s per cell on a busy 2-core machine: four cells (both
# input types, retrieval, masked and causal SPT, attention and SSM) run by default, the rest are slow.
_FAST = {("listops", "transformer", "spt-masked"), ("image", "s4d", "scratch"),
         ("retrieval", "s4d", "scratch"), ("pathfinder", "transformer-causal", "spt-causal")}
_CELLS = sorted(set(_CELLS) | _FAST)


@pytest.mark.parametrize("task,model,regime", [
    c if c in _FAST else pytest.param(*c, marks=pytest.mark.slow) for c in _CELLS])
def test_lra_config_trains_one_tiny_step(task, model, regime):
    cfg = testing.tiny(LRA.get_config(f"{task},{model},{regime}"))
    losses = train_one_step(cfg)
    assert set(losses) == set(cfg.stage_order)


_FILES = sorted(p for p in glob.glob(os.path.join(ROOT, "experiments", "*.py"))
                if os.path.basename(p) not in ("__init__.py", "smoke.py", "lra.py",
                                               # the user's data: test_your_data_doc trains it
                                               "files.py"))


@pytest.mark.slow
@pytest.mark.parametrize("path", _FILES, ids=os.path.basename)
def test_other_experiment_files_train_one_tiny_step(path):
    """Every other file's default config and every model of its compare grid train one step."""
    module = common.load_module(path)
    base = module.get_config()
    assert len(base.compare.seeds) >= 1 and base.compare.models and base.compare.regimes
    pos = getattr(module, "POSITIONAL", ())
    for model in base.compare.models:
        regime = "spt-masked" if "spt-masked" in base.compare.regimes else base.compare.regimes[0]
        cfg = module.get_config(common.format_arg({"model": model, "regime": regime}))
        assert "model" in pos and "regime" in pos
        train_one_step(testing.tiny(cfg))


def test_parse_and_format_arg_round_trip():
    a = common.parse_arg("image,s4d,regime=scratch,scale=0.5", ("task", "model", "regime"))
    assert a == {"task": "image", "model": "s4d", "regime": "scratch", "scale": "0.5"}
    assert common.parse_arg(common.format_arg(a), ("task",)) == a
    with pytest.raises(ValueError, match="Too many positional"):
        common.parse_arg("a,b,c", ("x", "y"))


def test_flops_estimate_matches_hand_count():
    """A dense Transformer stage: 6 · N · tokens + 12 · L · d · tokens · layers."""
    c = LRA.get_config("image,transformer,scratch")
    est = flops.estimate_flops(c, "scratch", num_params=1000)
    tokens = c.stages.scratch.num_steps * 50 * 1024  # released finetuning batch 50
    assert est["tokens"] == tokens
    assert est["flops"] == pytest.approx(6 * 1000 * tokens + 12 * 1024 * 64 * tokens * 3)
    assert est["tpu_v4_hours"] == pytest.approx(est["flops"] / (275e12 * 0.3) / 3600)


def test_experiment_paths_resolve_to_the_package_from_any_folder(tmp_path, monkeypatch):
    """`experiments/X.py` names the packaged file where the current folder has no such file; a
    user's own file at that relative path, or anywhere else, is loaded as given."""
    monkeypatch.chdir(tmp_path)
    packaged = os.path.join(ROOT, "experiments", "lra.py")
    assert os.path.samefile(common.resolve_config_path("experiments/lra.py"), packaged)
    assert os.path.samefile(common.resolve_config_path("./experiments/lra.py"), packaged)
    assert common.resolve_config("experiments/lra.py:listops,s4d").endswith("lra.py:listops,s4d")
    assert common.resolve_config_path("experiments/nope.py") == "experiments/nope.py"
    assert "experiments/quickstart.py" in common.packaged_experiments()
    assert "experiments/__init__.py" not in common.packaged_experiments()
    # The user's own experiments/lra.py, relative to the current folder, wins.
    (tmp_path / "experiments").mkdir()
    own = tmp_path / "experiments" / "lra.py"
    own.write_text("def get_config(arg=''):\n    return {'own': arg}\n")
    assert common.resolve_config_path("experiments/lra.py") == "experiments/lra.py"
    assert common.load_module("experiments/lra.py").get_config("x") == {"own": "x"}
    other = tmp_path / "mine.py"
    other.write_text("def get_config():\n    return 7\n")
    assert common.load_module(str(other)).get_config() == 7


def test_bench_and_aot_find_the_packaged_configs_from_any_folder(tmp_path, monkeypatch):
    """`sptlib.bench`'s `lra.py:...` specs and `sptlib.aot --all` need no repository root."""
    from sptlib.bench import train_step
    from sptlib.protocol import aot
    monkeypatch.chdir(tmp_path)
    cfg = train_step.load_config("lra.py:listops,s4d,spt-masked")
    assert cfg.data.task == "listops" and cfg.model.mixer == "s4d"
    assert train_step.load_config("smoke.py").stages.pretrain.num_steps == 30
    assert len(aot.paper_configs()) >= 14
