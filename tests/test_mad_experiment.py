"""experiments/mad.py: every probe's config builds, its task info agrees, bad settings are refused."""

import os

import pytest

from sptlib.configs import common
from sptlib.data import mad, task_info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXP = common.load_module(os.path.join(ROOT, "experiments", "mad.py"))


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


def test_suite_runs_a_grid_per_setting_and_tables_mad_scores(tmp_path, monkeypatch):
    import json
    import subprocess
    calls = []

    def fake_call(cmd):  # write the grid's records as compare would
        calls.append(cmd)
        work = next(c for c in cmd if c.startswith("--workdir=")).split("=", 1)[1]
        os.makedirs(work, exist_ok=True)
        acc = 1.0 if "baseline" in work else 0.5
        recs = [{"model": "s4d", "regime": "scratch", "seed": s, "status": "finished",
                 "test_accuracy": acc if s else 0.1} for s in range(3)]
        with open(os.path.join(work, "comparison.json"), "w") as f:
            json.dump(recs, f)
        return 0

    monkeypatch.setattr(subprocess, "call", fake_call)
    EXP.main([f"--workdir={tmp_path}", "--tasks=mad_memorization,mad_compression",
              "--settings=all", "--seeds=0,1,2"])
    names = sorted(os.listdir(tmp_path / "mad_memorization"))
    assert names == ["baseline", "vocab_size=1024", "vocab_size=2048", "vocab_size=4096",
                     "vocab_size=512", "vocab_size=8192"]
    assert len(calls) == 6 + 1 + 3 + 3 + 4  # memorisation: 1 + 5; compression: 1 + 3 + 3 + 4
    assert any(c[3].endswith("mad.py:mad_memorization,vocab_size=512") for c in calls)
    assert all("--seeds=0,1,2" in c for c in calls)
    table = (tmp_path / "mad_table.md").read_text()
    assert "| mad_memorization | baseline | s4d | scratch | 70.0 ± 129.1 (3) | 2/3" in table
    # (0.1, 1, 1): t_2 = 4.303, s = 0.5196, half-width 4.303 * 0.5196 / sqrt(3) = 1.291.
    # MAD score: memorisation's mean over 6 settings (0.7 once, (0.1 + 0.5 + 0.5) / 3 five
    # times), compression's over 11 (0.7 once, 0.3667 ten times), then their mean.
    mem = (0.7 + 5 * 1.1 / 3) / 6
    comp = (0.7 + 10 * 1.1 / 3) / 11
    assert f"| s4d | scratch | 2 | {100 * (mem + comp) / 2:.1f} |" in table
