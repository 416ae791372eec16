"""experiments/mad.py: every probe's config builds, its task info agrees, bad settings are refused."""

import os

import pytest

from sptlib.configs import common
from sptlib.data import mad, task_info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXP = common.load_module(os.path.join(ROOT, "sptlib", "experiments", "mad.py"))


@pytest.mark.parametrize("task", [*mad.MAD_TASKS, "mqar", "induction_heads"])
def test_every_probe_config_builds_with_its_baseline(task):
    c = EXP.get_config(f"{task},s4d,spt-causal")
    info = task_info(c.data)
    assert info["per_position"] and c.data.task == task
    base = mad.MAD_SETTINGS[task][0] if task in mad.MAD_SETTINGS else EXP.OWN_SETTINGS[task]
    assert c.data.max_length == base["length"] and c.data.probes.num_train == base["num_train"]
    assert tuple(c.stage_order) == ("pretrain", "finetune")
    assert c.stages.pretrain.objective.kind == "causal"
    assert c.stages.finetune.objective.kind == "tagging"
    assert c.stages.pretrain.causal and c.stages.finetune.causal and c.model.causal
    assert set(c.compare.regimes) == {"scratch", "scratch-equal-compute", "spt-causal"}
    assert c.compare.length_factors == (() if task in EXP.NO_LENGTH else EXP.LENGTH_FACTORS)


def test_settings_override_and_models():
    c = EXP.get_config("mqar,transformer,scratch,length=128,num_pairs=16,vocab_size=64,"
                       "power_a=0.5,steps=7")
    assert c.data.max_length == 128 and c.data.probes.num_pairs == 16
    assert c.data.probes.power_a == 0.5 and c.stages.scratch.num_steps == 7
    models = EXP.available_models()
    assert models[:3] == ("transformer", "mamba2", "s4d")
    from sptlib.layers import MIXERS
    assert all(m in MIXERS for m in models[3:])  # new mixers join only once they exist
    with pytest.raises(ValueError, match=r"num_pairs 17 does not fit length 64"):
        task_info(EXP.get_config("mqar,length=64,num_pairs=17").data)
    with pytest.raises(ValueError, match=r"settings \['motif_size'\] are not its fields"):
        EXP.get_config("mqar,motif_size=2")
    with pytest.raises(ValueError, match="unknown probe task"):
        EXP.get_config("mad_copying")
