"""SPT fidelity: self-pretraining must transfer to finetuning through the real pipeline.

A tiny masked-SPT -> finetune run on generated 8 x 8 Lines gratings (L = 64, 4 classes, chance
25%) against scratch at the same finetuning budget, each through `sptlib.pipeline.run` with real
orbax checkpoints (finetune starts from the best pretrain checkpoint with a fresh head). Measured
on this configuration (one seed, 200 test images): SPT 50.5% vs scratch 34.5% after 200 steps. The
assertion leaves room for numerical drift across machines, but fails when the pretrained
encoder/backbone does not reach the finetuning stage or is altered on the way (e.g. `dont_load`
too broad, the mask channel not zeroed, a different input layout) — those runs finish at scratch's
level.
"""

import pytest

from sptlib import experiments_local as local
from sptlib import pipeline

PRETRAIN_STEPS, FINETUNE_STEPS = 2000, 200


def _config(regime):
    c = local.local_lines("transformer", regime, resolution=8, num_train=2000, num_eval=200,
                          n_layers=1, d_model=32, n_heads=2, steps=FINETUNE_STEPS,
                          pretrain_steps=PRETRAIN_STEPS, batch_size=32, lr=2e-3,
                          eval_every=FINETUNE_STEPS, target="l1", noise=0.25, style="gratings",
                          compare=dict(models=("transformer",), regimes=(regime,), seeds=(0,)))
    with c.unlocked():
        for stage in c.stages.values():
            stage.async_checkpoints = False
        # One evaluation/checkpoint per stage keeps the test cheap.
        c.stages.pretrain.eval_every = c.stages.pretrain.checkpoint_every = PRETRAIN_STEPS
    return c


def _test_accuracy(config, workdir):
    out = pipeline.run(config, workdir)
    last = config.stage_order[-1]
    return out["summary"]["stages"][last]["test_accuracy_last"]


def test_spt_then_finetune_beats_scratch_at_equal_finetune_steps(tmp_path):
    spt = _test_accuracy(_config("spt-masked"), tmp_path / "spt")
    scratch = _test_accuracy(_config("scratch"), tmp_path / "scratch")
    assert spt >= scratch + 0.08, (spt, scratch)
    assert spt >= 0.40, spt
