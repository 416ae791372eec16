"""Checkpoints: retention (latest k + best), corrupt/partial fallback, init_from transfer.

Truths: hand-computed retention sets; arrays read back from the files with a second, independent
orbax reader (NumPy, no target sharding); a fresh init with the same seed for the head.
"""

import json
import logging
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath

from sptlib import errors
from sptlib import models
from sptlib.models import config as model_config_lib
from sptlib.train import checkpoint as ckpt_lib
from sptlib.train import checkpoint_io
from sptlib.train import config as config_lib
from sptlib.train import convergence
from sptlib.train import optim
from sptlib.train import sharding
from sptlib.train import steps
from sptlib.train import transfer
from sptlib.train.state import TrainState

VOCAB, LENGTH = 12, 16


def _toy_state(seed=0, scale=1.0):
    """A small TrainState-shaped tree of distinct arrays (no model needed)."""
    r = np.random.default_rng(seed)
    return TrainState(step=jnp.int32(seed),
                      params={"backbone": {"w": jnp.asarray(r.normal(size=(3, 4)) * scale,
                                                            jnp.float32)},
                              "head": {"b": jnp.asarray(r.normal(size=(5,)), jnp.float32)}},
                      opt_state=(jnp.zeros(3), {}), model_state={},
                      rng=jnp.asarray([seed, 7], jnp.uint32))


def _read_file_arrays(step_dir):
    """Independent read of a saved state: every array as NumPy, no target, no sharding."""
    with ocp.PyTreeCheckpointer() as c:
        meta = ckpt_lib.saved_tree(epath.Path(step_dir))
        item = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), meta)
        return c.restore(epath.Path(step_dir) / "state", args=ocp.args.PyTreeRestore(
            item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item)))


def _tree_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.asarray(x).dtype == np.asarray(y).dtype
        and np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in zip(la, lb))


def test_retention_keeps_latest_k_and_best(tmp_path):
    ck = ckpt_lib.StageCheckpointer(tmp_path / "ck", keep=2, async_saves=True)
    # step: validation accuracy (None = checkpoint without evaluation); best_mode max.
    plan = {1: 0.3, 2: 0.9, 3: 0.4, 4: None, 5: 0.5, 6: None}
    for step, acc in plan.items():
        metrics = None if acc is None else {"accuracy": acc,
                                            "score": convergence.score_of({"accuracy": acc},
                                                                       "accuracy", "max")}
        assert ck.save(step, _toy_state(step), {"next_index": step}, metrics=metrics)
    ck.wait_until_finished()
    # Latest two (5, 6) plus the best (2, accuracy .9) survive pruning.
    assert ck.all_steps() == [2, 5, 6]
    assert ck.best_step() == 2
    assert ck.latest_step() == 6
    # A second save of an existing step is refused, not an error.
    assert not ck.save(6, _toy_state(6), None)
    ck.close()
    # best_mode=min: the score is the negated loss.
    assert convergence.score_of({"loss": 2.0}, "loss", "min") > \
        convergence.score_of({"loss": 3.0}, "loss", "min")
    assert convergence.score_of({"loss": float("nan")}, "loss", "min") == -float("inf")
    # resolve_init_checkpoint reads the same scores from disk: best -> 2, latest -> 6.
    assert transfer.resolve_init_checkpoint(str(tmp_path / "ck"), None).name == "2"
    assert transfer.resolve_init_checkpoint(str(tmp_path / "ck"), None, "latest").name == "6"
    with pytest.raises(errors.NoCheckpointError, match="no checkpoint"):
        transfer.resolve_init_checkpoint("nosuchstage", tmp_path)


@pytest.mark.parametrize("damage", ["truncate", "partial"])
def test_corrupt_latest_falls_back_to_previous(tmp_path, caplog, damage):
    directory = tmp_path / "ck"
    ck = ckpt_lib.StageCheckpointer(directory, keep=3, async_saves=False)
    for step in (10, 20, 30):
        ck.save(step, _toy_state(step), {"next_index": step * 4})
    ck.close()
    state_dir = directory / "30" / "state"
    if damage == "truncate":
        # Corrupt every data file of the latest step (as a crash mid-copy would).
        for f in state_dir.rglob("*"):
            if f.is_file() and f.parent.name == "d":
                f.write_bytes(b"\0" * 7)
    else:
        # A partial checkpoint: the state item is missing altogether.
        shutil.rmtree(state_dir)
    ck = ckpt_lib.StageCheckpointer(directory, keep=3)
    with caplog.at_level(logging.WARNING):
        state, it_state, step = ck.restore_latest(checkpoint_io.abstract_like(_toy_state(0)))
    assert step == 20
    assert it_state == {"next_index": 80}
    assert _tree_equal(state, _toy_state(20))
    assert "step 30" in caplog.text and "falling back" in caplog.text
    # The bad folder was moved aside (kept for inspection), and is no longer a step.
    assert ck.all_steps() == [10, 20]
    assert [p.name.split("-")[0] for p in (directory / "corrupt").iterdir()] == ["30"]
    ck.close()


def _saved_three(directory, steps=(10, 20, 30)):
    ck = ckpt_lib.StageCheckpointer(directory, keep=3, async_saves=False)
    for step in steps:
        ck.save(step, _toy_state(step), {"next_index": step * 4})
    ck.close()
    return {p.name: sorted(str(f.relative_to(p)) for f in p.rglob("*"))
            for p in directory.iterdir()}


def _toy_changed(change):
    st = _toy_state(0)
    w = st.params["backbone"]["w"]
    w = jnp.zeros((3, 5), w.dtype) if change == "shape" else w.astype(jnp.bfloat16)
    return st.replace(params={**st.params, "backbone": {"w": w}})


@pytest.mark.parametrize("change,needle", [("shape", "(3, 4) float32 in the checkpoint but "
                                                     "(3, 5) float32"),
                                            ("dtype", "float32 in the checkpoint but (3, 4) "
                                                      "bfloat16")])
def test_checkpoint_of_another_config_stops_and_moves_nothing(tmp_path, change, needle):
    """A changed model is not corruption: stop naming stage, parameter and both shapes; keep
    every checkpoint where it was (the issue: healthy ones were quarantined, then retrained)."""
    directory = tmp_path / "ck"
    before = _saved_three(directory)
    ck = ckpt_lib.StageCheckpointer(directory, keep=3)
    with pytest.raises(errors.CheckpointMismatchError) as e:
        ck.restore_latest(checkpoint_io.abstract_like(_toy_changed(change)), stage="pretrain")
    ck.close()
    msg = str(e.value)
    assert "stage 'pretrain'" in msg and "'params/backbone/w'" in msg and needle in msg
    assert "new --workdir" in msg and "config.json" in msg
    after = {p.name: sorted(str(f.relative_to(p)) for f in p.rglob("*"))
             for p in directory.iterdir()}
    assert after == before and not (directory / "corrupt").exists()


def test_no_readable_checkpoint_left_stops_unless_told_to_start_over(tmp_path):
    directory = tmp_path / "ck"
    _saved_three(directory, steps=(10, 20))
    for step in (10, 20):
        shutil.rmtree(directory / str(step) / "state")  # unreadable: the state is gone
    ck = ckpt_lib.StageCheckpointer(directory, keep=3)
    with pytest.raises(errors.NoReadableCheckpointError,
                       match=r"stage 'finetune': no readable checkpoint.*"
                             r"stages\.finetune\.start_over_if_unreadable=True"):
        ck.restore_latest(checkpoint_io.abstract_like(_toy_state(0)), stage="finetune")
    # Both moved aside (never deleted) and reported.
    assert sorted(q["step"] for q in ck.quarantined) == [10, 20]
    moved = sorted(p.name.split("-")[0] for p in (directory / "corrupt").iterdir())
    assert moved == ["10", "20"] and all(
        (directory / "corrupt" / p.name / "data").exists()
        for p in (directory / "corrupt").iterdir())
    ck.close()
    # The next run finds no step at all, but still does not restart on its own.
    ck = ckpt_lib.StageCheckpointer(directory, keep=3)
    with pytest.raises(errors.NoReadableCheckpointError, match="corrupt/10-"):
        ck.restore_latest(checkpoint_io.abstract_like(_toy_state(0)), stage="finetune")
    ck.close()
    # Asked explicitly: a fresh start (None), nothing left to quarantine.
    ck = ckpt_lib.StageCheckpointer(directory, keep=3)
    assert ck.restore_latest(checkpoint_io.abstract_like(_toy_state(0)), stage="finetune",
                             start_over=True) is None
    ck.close()


def test_iterator_state_roundtrip():
    for s in ({"next_index": 3, "nested": [1, 2]}, b'{"a": 1}', None):
        enc = checkpoint_io.encode_iterator_state(s)
        assert checkpoint_io.decode_iterator_state(json.loads(json.dumps(enc))) == s


# ----------------------------------------------------------------------------------------------
# init_from: parameter transfer with a real model.
# ----------------------------------------------------------------------------------------------

def _model_cfg(**kw):
    m = model_config_lib.model_config()
    m.mixer, m.d_model, m.n_layers, m.vocab_size, m.max_length = "attention", 16, 2, VOCAB, LENGTH
    m.attention.n_heads = 2
    m.update(kw)
    return m


def _init(model_cfg, head, seed):
    model = models.build_model(model_cfg, head)
    batch = {"inputs": np.full((2, LENGTH), 3, np.int32), "mask": np.ones((2, LENGTH), bool),
             "label": np.zeros((2,), np.int32), "example_mask": np.ones((2,), bool)}
    mesh = sharding.create_mesh(sharding.mesh_config())
    rules = sharding.default_rules()
    abstract, _ = steps.state_logical_specs(model, None, batch)
    tx = optim.make_optimizer(optim.optim_config(), abstract["params"], 10)
    return steps.init_train_state(model, tx, batch, jax.random.PRNGKey(seed), mesh, rules)


def _abstract_params(model_cfg, head):
    model = models.build_model(model_cfg, head)
    batch = {"inputs": np.full((1, LENGTH), 3, np.int32), "mask": np.ones((1, LENGTH), bool)}
    return steps.state_logical_specs(model, None, batch)[0]["params"]


PRETRAIN_HEAD = {"kind": "token_logits", "num_outputs": VOCAB}
FINETUNE_HEAD = {"kind": "classify", "num_classes": 3}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A saved 'pretrain' checkpoint (token head) at step 5 of a 2-layer model."""
    directory = tmp_path_factory.mktemp("pre") / "checkpoints"
    state, _ = _init(_model_cfg(), PRETRAIN_HEAD, seed=1)
    ck = ckpt_lib.StageCheckpointer(directory, keep=1)
    ck.save(5, state, None)
    ck.close()
    return directory / "5"


def test_init_from_loads_backbone_and_keeps_fresh_head(pretrained, caplog):
    fresh, _ = _init(_model_cfg(), FINETUNE_HEAD, seed=2)
    fresh_head = jax.device_get(fresh.params["head"])
    with caplog.at_level(logging.INFO):
        params, model_state, report = transfer.load_pretrained(
            pretrained, fresh.params, fresh.model_state, dont_load=("^head/",))
    saved = _read_file_arrays(pretrained)["params"]
    # Every encoder/backbone tensor equals the file, bitwise.
    for coll in ("encoder", "backbone"):
        assert jax.tree.structure(params[coll]) == jax.tree.structure(saved[coll])
        assert _tree_equal(params[coll], saved[coll])
    # The head is the fresh init (same seed => bitwise), and nothing of the pretraining head
    # (its [d_model, vocab] output layer) made it in.
    assert _tree_equal(params["head"], fresh_head)
    pre_shapes = {tuple(x.shape) for x in jax.tree.leaves(saved["head"])}
    assert (16, VOCAB) in pre_shapes
    assert all(tuple(x.shape) != (16, VOCAB) for x in jax.tree.leaves(params["head"]))
    assert sorted(report["not_loaded"]) == sorted(
        "head/" + "/".join(k) for k in
        __import__("flax").traverse_util.flatten_dict(fresh_head))
    assert report["skipped_from_checkpoint"] and all(
        p.startswith("head/") for p in report["skipped_from_checkpoint"])
    n_backbone = len(jax.tree.leaves(saved["encoder"])) + len(jax.tree.leaves(saved["backbone"]))
    assert len(report["loaded"]) == n_backbone
    assert "not loaded (fresh init)" in caplog.text and "skipped (dont_load)" in caplog.text
    assert model_state == {}


@pytest.mark.parametrize("change", [{"d_model": 32}, {"n_layers": 3}])
def test_init_from_incompatible_model_names_first_mismatch(pretrained, change):
    # Shapes suffice: the mismatch is found before any array is read.
    other_params = _abstract_params(_model_cfg(**change), FINETUNE_HEAD)
    saved = _read_file_arrays(pretrained)["params"]
    # Truth: the first (sorted) non-head path whose shape differs or which one side lacks.
    flat = __import__("flax").traverse_util.flatten_dict
    a = {"/".join(k): v.shape for k, v in flat(saved).items() if k[0] != "head"}
    b = {"/".join(k): v.shape for k, v in flat(other_params).items()
         if k[0] != "head"}
    first = sorted(p for p in set(a) | set(b) if a.get(p) != b.get(p))[0]
    with pytest.raises(errors.IncompatibleCheckpointError) as e:
        transfer.load_pretrained(pretrained, other_params, {}, dont_load=("^head/",))
    assert f"'{first}'" in str(e.value)
    assert "does not fit the model" in str(e.value)


def test_batchnorm_statistics_are_carried_from_pretrain_into_finetune(tmp_path):
    """Every S4 LRA preset uses BatchNorm: its running statistics (model state, not params) must
    reach the finetuned model. Truth: the statistics read back from the file; they are made
    unlike a fresh init (mean 0, var 1) so that a silent skip cannot pass."""
    cfg = _model_cfg(norm="batch")
    state, _ = _init(cfg, PRETRAIN_HEAD, seed=1)
    r = np.random.default_rng(0)
    stats = jax.tree.map(lambda x: jnp.asarray(r.normal(size=x.shape) ** 2 + 0.5, x.dtype),
                         state.model_state)
    assert jax.tree.leaves(stats), "a batch-norm model has batch_stats"
    ck = ckpt_lib.StageCheckpointer(tmp_path / "ck", keep=1)
    ck.save(3, state.replace(model_state=stats), None)
    ck.close()
    fresh, _ = _init(cfg, FINETUNE_HEAD, seed=2)
    _, model_state, report = transfer.load_pretrained(tmp_path / "ck" / "3", fresh.params,
                                                      fresh.model_state, dont_load=("^head/",))
    from_file = _read_file_arrays(tmp_path / "ck" / "3")["model_state"]
    assert _tree_equal(model_state, from_file) and _tree_equal(model_state, stats)
    assert not _tree_equal(model_state, fresh.model_state)
    n_stats = len(jax.tree.leaves(stats))
    assert sum(p.startswith("model_state/batch_stats/") for p in report["loaded"]) == n_stats


def test_weight_verification_catches_a_wrong_placement(pretrained, monkeypatch):
    """The bitwise read-back after loading fires when what sits in the model is not the file's
    (simulated: one tensor comes back off by one ulp from placement)."""
    fresh, _ = _init(_model_cfg(), FINETUNE_HEAD, seed=2)
    real = transfer.to_host
    calls = []

    def off_by_one_ulp(x):
        out = np.array(real(x))
        if not calls and out.dtype == np.float32 and out.size:
            out.flat[0] = np.nextafter(out.flat[0], np.float32(np.inf))
        calls.append(1)
        return out

    monkeypatch.setattr(transfer, "to_host", off_by_one_ulp)
    with pytest.raises(RuntimeError, match="differs from the checkpoint file"):
        transfer.load_pretrained(pretrained, fresh.params, fresh.model_state,
                                 dont_load=("^head/",))
    monkeypatch.setattr(transfer, "to_host", real)  # and the same load passes unpatched
    transfer.load_pretrained(pretrained, fresh.params, fresh.model_state, dont_load=("^head/",))


def test_unknown_config_keys_are_errors():
    c = config_lib.base_config()
    with pytest.raises(AttributeError):
        c.stages.pretrain.num_stepz = 3
    with pytest.raises(AttributeError):
        c.nonexistent = 1
    with pytest.raises(KeyError, match="num_stepz"):
        config_lib.stage_config(num_stepz=3)
    c.stages.pretrain.num_steps = 7  # known keys stay writable
    s = config_lib.stage_config(objective="masked", optim={"lr": 0.5}, num_steps=9)
    assert (s.objective.kind, s.optim.lr, s.num_steps) == ("masked", 0.5, 9)
    bad = config_lib.base_config()
    bad.stage_order = ("pretrain", "nosuch")
    with pytest.raises(ValueError, match="nosuch"):
        config_lib.validate(bad)


_RESHARD_SCRIPT = r'''
import sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from sptlib.train import checkpoint as ckpt_lib
from sptlib.train import checkpoint_io
from sptlib.train.state import TrainState
assert jax.device_count() == 4, jax.devices()
mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "tensor"))
w = np.arange(32, dtype=np.float32).reshape(8, 4)
target = TrainState(step=jnp.int32(0), params={"w": jnp.zeros((8, 4))}, opt_state=(),
                    model_state={}, rng=jnp.zeros((2,), jnp.uint32))
shardings = TrainState(step=NamedSharding(mesh, P()),
                       params={"w": NamedSharding(mesh, P("data", "tensor"))}, opt_state=(),
                       model_state={}, rng=NamedSharding(mesh, P()))
ck = ckpt_lib.StageCheckpointer(sys.argv[1], keep=1)
state, it_state = ck.restore(7, checkpoint_io.abstract_like(target, shardings))
assert state.params["w"].sharding == shardings.params["w"], state.params["w"].sharding
assert len(state.params["w"].addressable_shards) == 4
assert state.params["w"].addressable_shards[0].data.shape == (4, 2)
assert np.array_equal(np.asarray(state.params["w"]), w) and int(state.step) == 7
assert it_state == {"next_index": 21}
print("RESHARD-OK")
'''


def test_restore_onto_a_different_mesh(tmp_path):
    """Saved from one device, restored sharded over a 2x2 mesh of 4 (fake CPU) devices."""
    import os
    import subprocess
    import sys
    state = TrainState(step=jnp.int32(7),
                       params={"w": jnp.arange(32, dtype=jnp.float32).reshape(8, 4)},
                       opt_state=(), model_state={}, rng=jnp.zeros((2,), jnp.uint32))
    ck = ckpt_lib.StageCheckpointer(tmp_path / "ck", keep=1)
    ck.save(7, state, {"next_index": 21})
    ck.close()
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    p = subprocess.run([sys.executable, "-c", _RESHARD_SCRIPT, str(tmp_path / "ck")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "RESHARD-OK" in p.stdout, p.stderr[-3000:]


_TWO_PROCESS_SCRIPT = r'''
import sys
import jax
jax.distributed.initialize(sys.argv[1], 2, int(sys.argv[2]))
import jax.numpy as jnp, numpy as np
from sptlib.train import checkpoint as ckpt_lib
from sptlib.train import checkpoint_io
from sptlib.train.state import TrainState
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
pi = jax.process_index()
mesh = Mesh(np.array(jax.devices()), ("data",))
glob = lambda x, spec=P(): jax.make_array_from_process_local_data(NamedSharding(mesh, spec), x)
state = TrainState(step=glob(np.int32(3)), params={"w": glob(np.ones((1,), np.float32) * pi,
                                                             P("data"))},
                   opt_state=(), model_state={}, rng=glob(np.zeros((2,), np.uint32)))
ck = ckpt_lib.StageCheckpointer(sys.argv[3], keep=1)
# Each process reads its own shard, so each has its own iterator position.
ck.save(3, state, {"next_index": 100 + pi, "shard": [pi, "x" * (5 * pi)]})
ck.wait_until_finished()
restored, it_state = ck.restore(3, checkpoint_io.abstract_like(state))
ck.close()
assert it_state == {"next_index": 100 + pi, "shard": [pi, "x" * (5 * pi)]}, it_state
assert np.asarray(restored.params["w"].addressable_data(0)).tolist() == [float(pi)]
print("PROCESS-OK", pi)
'''


def test_iterator_states_of_every_process_are_saved(tmp_path):
    """Two processes (jax.distributed on loopback): each resumes its own data position."""
    import os
    import socket
    import subprocess
    import sys
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    procs = [subprocess.Popen([sys.executable, "-c", _TWO_PROCESS_SCRIPT, f"127.0.0.1:{port}",
                               str(i), str(tmp_path / "ck")], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"PROCESS-OK {i}" in out, err[-3000:]
    saved = json.loads((tmp_path / "ck" / "3" / "data" / "metadata").read_text())
    assert saved["process_count"] == 2 and len(saved["states"]) == 2
