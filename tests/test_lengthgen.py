"""Length generalisation (`sptlib.protocol.lengthgen`) on a real tiny ListOps run with checkpoints on disk."""

import json
import os
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from sptlib.protocol import lengthgen, stages
from sptlib.configs import common
from sptlib.data import listops
from sptlib.train import checkpoint as ckpt_lib
from sptlib.train import transfer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(tmp_path, mixer):
    c = common.load_module(os.path.join(ROOT, "experiments", "smoke.py")).get_config()
    c.data.lra_dir = str(tmp_path / "lra")
    c.data.max_length = 48  # generated examples run to 128 tokens: most are truncated at 48
    c.model.mixer = mixer
    c.model.positions = "sinusoidal" if mixer == "attention" else "none"
    c.model.d_model = 16
    c.model.s4d.d_state = 8
    c.stage_order = ("scratch",)
    s = c.stages.scratch
    s.num_steps, s.eval_every, s.checkpoint_every, s.log_every = 6, 3, 3, 3
    return c


@pytest.fixture(scope="module", params=["s4d", "attention"])
def finished_run(request, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp(request.param)
    config = _config(tmp_path, request.param)
    workdir = tmp_path / "run"
    stages.run(config, str(workdir))
    return config, workdir


def test_factor_one_reproduces_the_runs_own_test_accuracy(finished_run):
    config, workdir = finished_run
    results = json.loads((workdir / "scratch" / "results.json").read_text())
    # The stage's own evaluation of its best checkpoint is the independent truth.
    assert lengthgen.evaluate(config, workdir, 1.0) == pytest.approx(
        results["test"]["best"]["accuracy"], abs=1e-6)


def test_longer_inputs_are_read_untruncated(finished_run):
    config, workdir = finished_run
    from sptlib import data as data_lib
    long_cfg = lengthgen.longer_config(config, 2.0, 48)
    assert long_cfg.data.max_length == 96
    short = data_lib.get_task(config.data)
    longer = data_lib.get_task(long_cfg.data)
    short.source("test"), longer.source("test")
    assert longer.num_truncated["test"] < short.num_truncated["test"]


def _constant_classifier(workdir, copy_to, cls):
    """A copy of the run whose only checkpoint predicts class `cls` for every input: the head's
    kernel is zero and its bias one-hot (the rest of the state is the run's own)."""
    shutil.copytree(workdir, copy_to)
    ck_dir = copy_to / "scratch" / "checkpoints"
    step = transfer.resolve_init_checkpoint("scratch", copy_to, "best")
    meta = ckpt_lib.saved_tree(step)
    item = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), meta)
    with ocp.PyTreeCheckpointer() as c:
        tree = c.restore(step / "state", args=ocp.args.PyTreeRestore(
            item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item)))
    logits = tree["params"]["head"]["logits"]
    logits["kernel"] = np.zeros_like(logits["kernel"])
    logits["bias"] = 5.0 * np.eye(logits["bias"].shape[0], dtype=logits["bias"].dtype)[cls]
    for p in ck_dir.iterdir():
        shutil.rmtree(p)
    ck = ckpt_lib.StageCheckpointer(ck_dir, async_saves=False)
    ck.save(6, tree, None, metrics={"accuracy": 0.0, "score": 0.0})
    ck.close()


def test_factor_two_on_a_model_with_a_known_answer(finished_run, tmp_path):
    """A classifier that ignores its input scores exactly the share of its class among the test
    labels, at any length: the 2x evaluation must read the whole test split, labels aligned."""
    config, workdir = finished_run
    _, labels = listops.read_split(listops.split_path(config.data.lra_dir, "test"))
    cls = int(np.bincount(labels).argmax())
    _constant_classifier(workdir, tmp_path / "const", cls)
    expected = float(np.mean(labels == cls))
    assert 0.0 < expected < 1.0
    assert lengthgen.evaluate(config, tmp_path / "const", 2.0) == pytest.approx(expected,
                                                                                abs=1e-6)


def test_fixed_length_task_and_learned_positions_are_refused(finished_run):
    config, _ = finished_run
    img = common.load_module(
        os.path.join(ROOT, "experiments", "reproduce_local.py")).get_config("s4d,scratch")
    with pytest.raises(lengthgen.LengthGeneralizationUnsupported, match="fixed input length"):
        lengthgen.longer_config(img, 2.0, 256)
    # evaluate refuses before reading data or checkpoints (this workdir does not exist).
    with pytest.raises(lengthgen.LengthGeneralizationUnsupported, match="fixed input length"):
        lengthgen.evaluate(img, "/nonexistent/run", 2.0)
    learned = _config_with(config, positions="learned")
    with pytest.raises(lengthgen.LengthGeneralizationUnsupported, match="learned"):
        lengthgen.longer_config(learned, 2.0, 48)


def _config_with(config, **model):
    import ml_collections
    c = ml_collections.ConfigDict(config.to_dict())
    c.model.update(model)
    return c
