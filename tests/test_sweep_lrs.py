"""`--lrs` moves every learning rate of a classification stage by one factor (log dt included).

Before, `presets.set_optim` turned the release's `dt_lr="lr"` into a number and the sweep rescaled
`lr` and `ssm_lr` only, so log dt stayed at the recipe's lr while the rest of the model moved.
"""

import pytest

from sptlib.configs import paper, presets
from sptlib.protocol import sweeps

LR_KEYS = ("lr", "ssm_lr", "ssm_dt_lr")
CASES = [(t, m) for t in paper.TASKS for m in ("s4", "s4d", "dlr", "transformer")]


def _lrs(cfg):
    return {(s, k): cfg.stages[s].optim.get(k) for s in sweeps.lr_stages(cfg) for k in LR_KEYS}


@pytest.mark.parametrize("task,model", CASES)
def test_every_lr_moves_by_the_same_factor(task, model):
    cfg = presets.build(task, model, "spt-masked")
    before = _lrs(cfg)
    assert before, "the finetune stage is an lr stage"
    factor = 3.0
    new = factor * float(cfg.stages[sweeps.lr_stages(cfg)[0]].optim.lr)
    with cfg.unlocked():
        sweeps.apply_lr(cfg, new)
    after = _lrs(cfg)
    for key, old in before.items():
        if old is None:  # follows lr / ssm_lr at optimiser build time
            assert after[key] is None, key
        else:
            assert after[key] == pytest.approx(factor * old, rel=1e-12), key


def test_release_dt_lr_follows_the_swept_lr():
    """The paper's S4 Text recipe gives log dt the global lr: after the sweep it is the new lr."""
    cfg = presets.build("text", "s4", "scratch")
    o = cfg.stages.scratch.optim
    assert o.ssm_dt_lr == o.lr != o.ssm_lr
    with cfg.unlocked():
        sweeps.apply_lr(cfg, 0.123)
    assert o.lr == o.ssm_dt_lr == pytest.approx(0.123)


def test_pretraining_keeps_the_recipe_lr():
    cfg = presets.build("listops", "s4", "spt-masked")
    before = {k: cfg.stages.pretrain.optim.get(k) for k in LR_KEYS}
    with cfg.unlocked():
        sweeps.apply_lr(cfg, 1.0)
    assert {k: cfg.stages.pretrain.optim.get(k) for k in LR_KEYS} == before
