"""The public API (docs/api.md) from outside: docs/examples/public_api.py, run as a real
subprocess, puts an sptlib mixer in its own Linen and NNX models and loads the backbone of a real
orbax checkpoint written by a tiny sptlib masked-SPT pretraining run here (the example itself
checks that the loaded backbone reproduces sptlib's own outputs)."""

import json
import os
import subprocess
import sys

import numpy as np

from sptlib import api
from sptlib.configs import testing
from sptlib.protocol import stages
from sptlib.train import checkpoint_io, transfer

from sptlib.experiments import files as files_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "docs", "examples", "public_api.py")


def pretrain_run(tmp_path):
    """A 2-step masked-SPT pretraining run on a token file; returns its stage folder."""
    rng = np.random.default_rng(0)
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"inputs": rng.integers(0, 9, 12).tolist(),
                                        "label": i % 2}) + "\n" for i in range(40)))
    c = files_experiment.get_config(f"model=transformer,regime=spt-masked,train={path}")
    testing.tiny(c, steps=2)
    with c.unlocked():
        c.stage_order = ("pretrain",)
    stages.run(c, str(tmp_path / "wd"))
    return tmp_path / "wd" / "pretrain"


def run_example(stage, python=sys.executable, example=EXAMPLE, cwd=None):
    """Runs the example (any interpreter, e.g. an installed wheel's) on `stage`."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    return subprocess.run([python, example, "--stage", str(stage)], capture_output=True,
                          text=True, timeout=600, env=env, cwd=cwd)


def test_public_api_example_loads_an_spt_checkpoint(tmp_path):
    stage = pretrain_run(tmp_path)
    params, model_cfg = api.load_backbone(stage)
    assert model_cfg.mixer == "attention" and model_cfg.d_model == 16
    # Every backbone tensor of the checkpoint, in the shapes its metadata records.
    step = transfer.resolve_init_checkpoint(str(stage), None, "best")
    saved = checkpoint_io._flat(checkpoint_io.saved_tree(step)["params"]["backbone"])
    loaded = checkpoint_io._flat(params)
    assert sorted(saved) == sorted(loaded) and len(loaded) > 5
    assert all(tuple(saved[k].shape) == loaded[k].shape for k in saved)
    p = run_example(stage, cwd=tmp_path)  # outside the checkout's root
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.strip().splitlines()
    assert lines[0] == "linen: (2, 3)" and lines[1] == "nnx: (2, 3)", lines
    assert lines[2].startswith("checkpoint -> linen: (2, 2)") and str(stage) in lines[2]
    assert lines[3] == "checkpoint -> nnx: (2, 2)"
