"""The synthetic probes as sptlib tasks: registry, splits, the tagging objective, one real grid."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib import objectives
from sptlib.data import data_config, get_task, probes, task_info
from sptlib.protocol import compare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENT = os.path.join(ROOT, "experiments", "probes.py")


def _cfg(task, **sizes):
    c = data_config()
    c.task = task
    c.probes.update({**dict(num_train=40, num_val=12, num_test=12, seed=3), **sizes})
    return c


def _split(task, split):
    src = task.source(split)
    return np.stack([src[i]["inputs"] for i in range(len(src))]), \
        np.stack([src[i]["targets"] for i in range(len(src))])


@pytest.mark.parametrize("name,length", [("associative_recall", 128), ("selective_copying", 256)])
def test_tasks_build_with_disjoint_deterministic_splits(name, length):
    task = get_task(_cfg(name))
    assert task.info == task_info(_cfg(name))
    assert task.info["max_length"] == length and task.info["per_position"]
    assert task.info["vocab_size"] == probes.info(name, length=length)["vocab_size"]
    splits = {s: _split(task, s) for s in ("train", "validation", "test")}
    assert [len(splits[s][0]) for s in splits] == [40, 12, 12]
    rows = {s: {x.tobytes() for x in splits[s][0]} for s in splits}
    assert not rows["train"] & rows["validation"] and not rows["train"] & rows["test"]
    assert not rows["validation"] & rows["test"]
    again = get_task(_cfg(name))  # a fresh build, same seed: the same sequences and answers
    for s in splits:
        for a, b in zip(splits[s], _split(again, s)):
            np.testing.assert_array_equal(a, b)
    # The test split is the held-out set the standalone runner (experiments/selective.py) scores.
    held = probes.generate(name, 12, seed=3, held_out=True, length=length)
    np.testing.assert_array_equal(splits["test"][0], held["inputs"])
    other = get_task(_cfg(name, seed=4))
    assert not rows["train"] & {x.tobytes() for x in _split(other, "train")[0]}
    batch = next(task.make_iterator("train", batch_size=8, seed=0))
    assert batch["targets"].shape == batch["inputs"].shape == (8, length)
    assert "label" not in batch


def test_probe_options_reach_the_generator():
    cfg = _cfg("associative_recall", num_pairs=4, key_vocab=8, value_vocab=5, num_queries=2)
    cfg.max_length = 20
    task = get_task(cfg)
    assert task.info["num_classes"] == 5 and task.info["max_length"] == 20
    _, t = _split(task, "train")
    assert ((t >= 0).sum(1) == 2).all() and t.max() < 5
    cfg.probes.num_pairs = cfg.probes.key_vocab = 12  # 24 pair tokens + 2 queries exceed 20
    with pytest.raises(ValueError, match="fit"):
        task_info(cfg)


def _logits(batch, length, classes):
    """Fixed logits: class (b + t) % classes wins at position t of example b, by margin 2."""
    b, t = np.meshgrid(np.arange(batch), np.arange(length), indexing="ij")
    out = np.zeros((batch, length, classes), np.float32)
    np.put_along_axis(out, ((b + t) % classes)[..., None], 2.0, axis=-1)
    return out


def test_tagging_loss_and_accuracy_at_scored_positions_match_a_hand_count():
    batch_size, length, classes = 3, 5, 4
    logits = _logits(batch_size, length, classes)
    targets = np.array([[-1, 1, -1, 0, -1],     # pos 1 right (1), pos 3 wrong (3 wins)
                        [2, -1, -1, -1, 1],      # pos 0 wrong (1 wins), pos 4 right (1)
                        [2, 3, 0, 1, 2]], np.int32)  # a filler example: never counted
    batch = {"inputs": np.full((batch_size, length), 5, np.int32),
             "mask": np.ones((batch_size, length), bool), "targets": targets,
             "example_mask": np.array([True, True, False])}
    obj = objectives.make_objective(objectives.objective_config("tagging"),
                                    {"num_classes": classes, "input_type": "tokens",
                                     "per_position": True})
    assert obj.head_cfg == {"kind": "token_logits", "num_outputs": classes}
    with pytest.raises(ValueError, match="per-position"):
        objectives.make_objective(objectives.objective_config("tagging"), {"num_classes": 2})
    loss, m, _ = obj.loss(lambda v, **kw: jnp.asarray(logits), {"params": {}}, batch,
                          jax.random.PRNGKey(0), train=False)
    # Independent truth: softmax of [2, 0, 0, 0]-like rows; the right class has p = e^2/(e^2+3).
    right, wrong = -np.log(np.e ** 2 / (np.e ** 2 + 3)), -np.log(1 / (np.e ** 2 + 3))
    np.testing.assert_allclose(float(loss), (2 * right + 2 * wrong) / 4, rtol=1e-5)
    np.testing.assert_allclose([float(x) for x in m["loss"]], [2 * right + 2 * wrong, 4],
                               rtol=1e-5)
    assert [float(x) for x in m["accuracy"]] == [2.0, 4.0]
    assert [float(x) for x in m["exact"]] == [0.0, 2.0]
    # Every answer of example 0 right: it becomes exact.
    batch["targets"] = np.where(np.arange(length) == 3, 3, targets)
    _, m, _ = obj.loss(lambda v, **kw: jnp.asarray(logits), {"params": {}}, batch,
                       jax.random.PRNGKey(0), train=False)
    assert [float(x) for x in m["exact"]] == [1.0, 2.0]


@pytest.mark.parametrize("regimes", [
    ("spt-masked",),  # masked SPT, then the tagging finetune: ~16 s on 2 shared cores
    pytest.param(("scratch", "spt-masked"), marks=pytest.mark.slow)])  # ~20 s alone
def test_compare_grid_on_associative_recall_runs(regimes, tmp_path):
    """A real grid (a 1-layer transformer x regimes, 1 seed, 2 steps per stage) -> its table."""
    wd = str(tmp_path / "cmp")
    arg = ("associative_recall,steps=2,pretrain_steps=2,batch=4,d_model=16,n_layers=1,"
           "num_train=16,num_eval=8,eval_every=2")
    base, specs = compare.expand(f"{EXPERIMENT}:{arg}", {}, workdir=wd, models=["transformer"],
                                 regimes=list(regimes), seeds=[0])
    assert [(s.model, s.regime) for s in specs] == [("transformer", g) for g in regimes]
    spt = specs[-1].config
    assert spt.stage_order == ("pretrain", "finetune") and spt.model.causal
    assert spt.stages.pretrain.objective.kind == "masked"
    assert spt.stages.finetune.objective.kind == "tagging"
    records, paths = compare.run_comparison(specs, wd, log=lambda s: None)
    assert [r["status"] for r in records] == ["finished"] * len(regimes)
    for r in records:
        assert 0.0 <= r["test_accuracy"] <= 1.0
    assert records[-1]["stages"]["pretrain"]["steps"] == 2
    assert records[-1]["stages"]["finetune"]["objective"] == "tagging"
    table = open(paths["markdown"]).read()
    assert all(g in table for g in regimes)


def test_standalone_grid_chooses_lr_on_validation_only(tmp_path):
    """experiments/selective.py: the lr of each (model, task) is the best mean validation
    accuracy of the sweep seeds; test accuracies, however adversarial, never change it."""
    import json

    from sptlib.configs import common
    runner = common.load_module(os.path.join(ROOT, "experiments", "selective.py"))
    val = {1e-3: 0.4, 3e-3: 0.9, 1e-2: 0.9}  # a tie: the first of the best (3e-3)

    def write(test_of):
        for lr, v in val.items():
            rec = {"validation_accuracy": v, "test_accuracy": test_of(lr), "test_exact": 0.0,
                   "seconds": 1.0, "params": 1}
            with open(runner.record_path(str(tmp_path), "m", "t", 0, lr), "w") as f:
                json.dump(rec, f)

    lrs = list(val)
    write(lambda lr: 0.5)
    assert runner.chosen_lr(str(tmp_path), "m", "t", lrs, [0]) == 3e-3
    write(lambda lr: 1.0 if lr == 1e-3 else 0.0)  # test favours another lr
    assert runner.chosen_lr(str(tmp_path), "m", "t", lrs, [0]) == 3e-3
    val[1e-3] = 0.95  # validation decides
    write(lambda lr: 0.0)
    assert runner.chosen_lr(str(tmp_path), "m", "t", lrs, [0]) == 1e-3
    # A sweep run missing (seed 1 swept too, but not run): no choice yet.
    assert runner.chosen_lr(str(tmp_path), "m", "t", lrs, [0, 1]) is None
