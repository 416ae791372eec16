"""The stage loop in-process: pretrain -> finetune transfer from the *best* checkpoint, NaN stop.

Truths: the pretrain checkpoint files read back independently; a fresh init with the stage's seed
(bitwise) for the finetuning head; a finetune with learning rate 0, whose final parameters must
therefore be exactly its initial ones.
"""

import importlib.util
import json

import flax
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath

from sptlib import data as data_lib
from sptlib import errors
from sptlib import models
from sptlib import objectives
from sptlib.protocol import stages
from sptlib.train import checkpoint as ckpt_lib
from sptlib.train import loop
from sptlib.train import optim
from sptlib.train import results as results_lib
from sptlib.train import sharding
from sptlib.train import steps

_SMOKE = epath.Path(__file__).parent.parent / "experiments" / "smoke.py"


def _load_smoke():
    spec = importlib.util.spec_from_file_location("smoke_config", _SMOKE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tiny_config(lra_dir):
    c = _load_smoke().get_config()
    c.data.lra_dir = str(lra_dir)
    c.data.max_length = 64
    c.data.generate.update(num_train=96, num_val=32, num_test=32, min_length=10, max_length=64)
    c.model.mixer = "attention"  # the loop, not a mixer, is under test here
    c.model.d_model = 16
    c.model.n_layers = 1
    c.model.attention.n_heads = 2
    for name in ("pretrain", "finetune"):
        s = c.stages[name]
        s.batch_size, s.eval_batch_size = 8, 16
        s.optim.warmup_steps = 0
        s.optim.schedule = "constant"
    return c


def _read_params(step_dir):
    """The `params` saved in a checkpoint step, read as NumPy by a reader of its own."""
    meta = ckpt_lib.saved_tree(epath.Path(step_dir))["params"]
    item = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), meta)
    with ocp.PyTreeCheckpointer() as c:
        out = c.restore(epath.Path(step_dir) / "state", args=ocp.args.PyTreeRestore(
            item={"params": item},
            restore_args=ocp.checkpoint_utils.construct_restore_args({"params": item}),
            partial_restore=True))
    return out["params"]


def _flat(tree):
    return flax.traverse_util.flatten_dict(tree, sep="/")


def _same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_finetune_starts_from_best_pretrain_checkpoint(tmp_path):
    c = _tiny_config(tmp_path / "lra")
    pre, fin = c.stages.pretrain, c.stages.finetune
    pre.num_steps, pre.eval_every, pre.checkpoint_every, pre.keep = 6, 3, 3, 1
    pre.optim.lr = 1e-2
    # "Best" = highest validation loss: with a falling loss that is the early step 3, not the
    # last one, so taking the latest checkpoint by mistake would be caught.
    pre.best_mode = "max"
    pre.profile.start_step, pre.profile.num_steps = 1, 1
    fin.num_steps, fin.eval_every, fin.checkpoint_every = 1, 1, 1
    fin.optim.lr, fin.optim.ssm_lr = 0.0, 0.0  # final finetune params == its initial params
    out = stages.run(c, tmp_path / "wd")
    res_pre, res_fin = out["stages"]["pretrain"], out["stages"]["finetune"]
    assert res_pre.best_step == 3 and res_pre.final_step == 6
    best_dir = tmp_path / "wd" / "pretrain" / "checkpoints" / "3"
    assert res_fin.init["kind"] == "init_from"
    assert epath.Path(res_fin.init["checkpoint"]) == epath.Path(best_dir)
    # Retention: latest (6) and best (3) both kept with keep=1.
    assert sorted(int(p.name) for p in (tmp_path / "wd" / "pretrain" / "checkpoints").iterdir()
                  if p.name.isdigit()) == [3, 6]
    # Profiler trace of the requested window.
    assert any(p.is_file() for p in (tmp_path / "wd" / "pretrain" / "profile").rglob("*"))
    # The resolved stage it ran as, beside its checkpoints (sptlib.train.resolve).
    from sptlib.train import resolve
    saved = json.loads((tmp_path / "wd" / "pretrain" / resolve.RESOLVED_FILE).read_text())
    expected = resolve.resolve_stage(c, "pretrain", info=data_lib.get_task(c.data).info)
    assert saved == json.loads(json.dumps(expected.to_json()))

    pre_best = _flat(_read_params(best_dir))
    pre_last = _flat(_read_params(tmp_path / "wd" / "pretrain" / "checkpoints" / "6"))
    fin_params = _flat(_read_params(tmp_path / "wd" / "finetune" / "checkpoints" / "1"))
    body = [k for k in fin_params if not k.startswith("head/")]
    assert body and all(k in pre_best for k in body)
    assert all(_same(fin_params[k], pre_best[k]) for k in body)
    assert not all(_same(fin_params[k], pre_last[k]) for k in body)  # best != last really

    # The head is a fresh init: rebuild the stage's initial state independently, same seed.
    task = data_lib.get_task(c.data)
    model_cfg = models.resolve_model_config(c.model, task.info)
    objective = objectives.make_objective(fin.objective, task.info, model_cfg)
    model = models.build_model(model_cfg, objective.head_cfg)
    batch = next(task.make_iterator("train", batch_size=fin.batch_size, seed=c.seed))
    abstract, _ = steps.state_logical_specs(model, objective, batch)
    tx = optim.make_optimizer(fin.optim, abstract["params"], fin.num_steps)
    fresh, _ = steps.init_train_state(model, tx, batch, jax.random.PRNGKey(c.seed),
                                      sharding.create_mesh(c.mesh), c.logical_axis_rules,
                                      objective=objective)
    fresh_head = _flat(jax.device_get(fresh.params))
    heads = [k for k in fin_params if k.startswith("head/")]
    assert heads and all(_same(fin_params[k], fresh_head[k]) for k in heads)
    # The pretraining head (token logits over the vocabulary) is absent.
    vocab = task.info["vocab_size"]
    assert any(v.shape[-1] == vocab for k, v in pre_best.items() if k.startswith("head/"))
    assert all(fin_params[k].shape[-1] == task.info["num_classes"] for k in heads
               if fin_params[k].ndim)
    # Results carry the FLOPs of one train step (sptlib.train.flops; checked in test_aot.py).
    assert res_pre.flops_per_step > 0
    # Results carry the best and last metrics on validation and test.
    for split in ("validation", "test"):
        assert set(getattr(res_pre, split)) == {"best", "last"}
        assert getattr(res_pre, split)["best"] != getattr(res_pre, split)["last"]


def test_nonfinite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    c = _tiny_config(tmp_path / "lra")
    s = c.stages.pretrain
    s.num_steps, s.eval_every, s.checkpoint_every, s.log_every = 6, 100, 1, 100
    s.optim.lr = 1e30  # the first update blows the parameters up; the next loss is inf/NaN
    c.stage_order = ("pretrain",)
    with pytest.raises(errors.NonFiniteLossError, match="diverged: non-finite") as e:
        stages.run(c, tmp_path / "wd")
    ck_dir = tmp_path / "wd" / "pretrain" / "checkpoints"
    kept = sorted(int(p.name) for p in ck_dir.iterdir() if p.name.isdigit())
    # Step 1's update is the one that blew up: its checkpoint (parameters whose loss is not
    # finite) is moved aside, not offered as "the last good checkpoint".
    assert kept == []
    assert [p.name.split("-")[0] for p in (ck_dir / "diverged").iterdir()] == ["1"]
    assert "no checkpoint with a finite loss was saved before it" in str(e.value)
    res = results_lib.read_stage(tmp_path / "wd" / "pretrain")
    assert res.status == "diverged" and res.last_good_step is None


def test_relative_workdir_runs_pretrain_then_finetune(tmp_path, monkeypatch):
    """The README runs `--workdir=runs/quickstart`, a relative path; orbax accepts only absolute
    local paths, so the engine must resolve it (this failed every quickstart run once)."""
    monkeypatch.chdir(tmp_path)
    config = _tiny_config("lra")
    for name in ("pretrain", "finetune"):
        s = config.stages[name]
        s.num_steps, s.eval_every, s.checkpoint_every, s.log_every = 4, 2, 2, 2
    config.stage_order = ("pretrain", "finetune")
    results = stages.run(config, "runs/rel")
    for stage in ("pretrain", "finetune"):
        assert (tmp_path / "runs" / "rel" / stage / "checkpoints" / "4").is_dir()
    assert results["stages"]["finetune"].init["kind"] == "init_from"


def test_stop_request_after_the_last_step_still_stops_the_caller(tmp_path, monkeypatch):
    """SIGTERM / Ctrl-C arriving during the last step or the final evaluation: the stage
    finishes and saves its results, and the caller (the next stage; a grid's next run) must
    stop too instead of going on as if nothing was asked."""
    import signal

    c = _tiny_config(tmp_path / "lra")
    s = c.stages.pretrain
    s.num_steps, s.eval_every, s.checkpoint_every, s.log_every = 2, 100, 100, 100
    train = loop._Run.train

    def train_then_signal(self, state, stop):
        state = train(self, state, stop)
        stop._handle(signal.SIGTERM, None)  # as the handler does when the signal lands now
        return state

    monkeypatch.setattr(loop._Run, "train", train_then_signal)
    with pytest.raises(errors.PreemptedError, match="finished, then stopped on request"):
        stages.run(c, tmp_path / "wd")
    assert results_lib.read_stage(tmp_path / "wd" / "pretrain").status == "finished"
    assert not (tmp_path / "wd" / "finetune").exists()  # the next stage did not start
