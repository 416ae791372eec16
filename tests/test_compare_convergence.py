"""Equal compute matched to the steps a converged SPT run spent (sptlib.protocol.equal_compute):
order, budgets read back from the SPT run's stage results, sharding, waiting, the report.

Truth: a fake trainer that stops each SPT stage at a step chosen here (pretrain + finetune per
seed and lr), so every equal-compute budget is known by hand.
"""

import json
import os
import textwrap

import pytest

from sptlib.protocol import compare, equal_compute, stops

from test_compare import write_stage  # noqa: E402 (tests/ is on sys.path under pytest)

_EXPERIMENT = textwrap.dedent('''
    import ml_collections
    from sptlib.configs import common, presets

    POSITIONAL = ("model", "regime")

    def get_config(arg=""):
        a = common.parse_arg(arg, POSITIONAL)
        c = ml_collections.ConfigDict()
        c.seed = 0
        c.data = dict(task="fake", data_fraction=1.0)
        c.model = dict(name=a.get("model", "m1"), width=8)
        c.stages = {n: dict(num_steps=100, patience=2, objective=dict(kind=k),
                            optim=dict(lr=1e-3, ssm_lr=1e-3)) for n, k in
                    (("pretrain", "masked"), ("finetune", "classify"), ("scratch", "classify"))}
        regime = a.get("regime", "scratch")
        c.stage_order = ("scratch",) if regime.startswith("scratch") else ("pretrain", "finetune")
        if regime == "scratch-equal-compute":
            c.stages.scratch.num_steps = 200  # the caps' sum: replaced by the spent steps
        presets.add_compare(c, models=("m1",), regimes=("scratch", "scratch-equal-compute",
                            "spt-masked"), seeds=(0, 1), title="fake")
        c.compare.equal_compute = "spent"
        c.lock()
        return c
''')

# Where the fake SPT run stops: pretrain at 30 + 10 * seed, finetune at 40 + lr * 1e4.
PRE = {0: 30, 1: 40}


def _spent(seed, lr):
    return PRE[seed] + 40 + int(round(lr * 1e4))


class StoppingTrainer:
    """Writes stage results as a run trained to convergence would: SPT stages stop early."""

    def __init__(self):
        self.calls = []

    def __call__(self, config, workdir):
        eq = "equal-compute" in workdir
        regime = ("spt-masked" if "pretrain" in config.stage_order
                  else "scratch-equal-compute" if eq else "scratch")
        lr = config.stages[config.stage_order[-1]].optim.lr
        self.calls.append((regime, config.seed, lr,
                           {s: config.stages[s].num_steps for s in config.stage_order},
                           {s: config.stages[s].patience for s in config.stage_order}))
        steps = {"pretrain": PRE[config.seed], "finetune": 40 + int(round(lr * 1e4)),
                 "scratch": 60 if not eq else config.stages.scratch.num_steps}
        acc = 0.5 + 10 * lr + 0.01 * config.seed + (0.1 if regime == "spt-masked" else 0)
        for stage in config.stage_order:
            if not (stage == "pretrain" and os.path.islink(os.path.join(workdir, stage))):
                write_stage(workdir, stage, steps=steps[stage], val=acc, test=acc,
                            history=[{"step": 10, "accuracy": acc}])
                path = os.path.join(workdir, stage, "results.json")
                with open(path) as f:
                    res = json.load(f)
                res["stop_reason"] = None if eq else "patience"
                with open(path, "w") as f:
                    json.dump(res, f)
        return {}


@pytest.fixture
def experiment(tmp_path):
    p = tmp_path / "exp.py"
    p.write_text(_EXPERIMENT)
    return str(p)


def _specs(experiment, tmp_path, **kw):
    return compare.expand(experiment, workdir=str(tmp_path / "grid"), lrs=(1e-3, 2e-3),
                          lr_seeds=(0,), **kw)[1]


def test_equal_compute_runs_after_its_spt_run_in_each_seed(experiment, tmp_path):
    names = [(s.regime, s.seed) for s in _specs(experiment, tmp_path)]
    assert names == [("scratch", 0)] * 2 + [("spt-masked", 0)] * 2 + [
        ("scratch-equal-compute", 0)] * 2 + [("scratch", 1), ("spt-masked", 1),
                                             ("scratch-equal-compute", 1)]


def test_equal_compute_trains_the_steps_its_spt_run_spent(experiment, tmp_path):
    specs = _specs(experiment, tmp_path)
    trainer = StoppingTrainer()
    records, paths = compare.run_comparison(specs, str(tmp_path / "grid"), run_fn=trainer,
                                            log=lambda s: None)
    eq = [c for c in trainer.calls if c[0] == "scratch-equal-compute"]
    # Seed 0 at each lr: its SPT run at the same lr; seed 1 at the lr chosen for it (2e-3: the
    # fake's validation accuracy rises with lr), matched to seed 1's SPT run (also at 2e-3).
    assert [(c[1], c[2], c[3]["scratch"], c[4]["scratch"]) for c in eq] == [
        (0, 1e-3, _spent(0, 1e-3), 0), (0, 2e-3, _spent(0, 2e-3), 0),
        (1, 2e-3, _spent(1, 2e-3), 0)]
    assert all(r["status"] == "finished" for r in records)
    rec = next(r for r in records if r["regime"] == "scratch-equal-compute" and r["seed"] == 1)
    assert rec["steps_matched_to"].endswith(os.path.join("spt-masked-lr0.002", "seed1"))
    assert rec["stages"]["scratch"]["steps"] == _spent(1, 2e-3) == 100
    # Every other stage keeps its cap and patience.
    assert all(c[3][s] == 100 and c[4][s] == 2 for c in trainer.calls if c[0] != eq[0][0]
               for s in c[3])
    text = open(paths["markdown"]).read()
    assert "## Where the stages stopped" in text


def test_equal_compute_waits_while_its_spt_run_is_unfinished(experiment, tmp_path):
    """Its SPT runs fail here (as when another shard has not finished them): the equal-compute
    runs are left `missing`, never trained at a guessed budget; a rerun after the SPT runs
    finished trains them at the spent steps."""
    specs = _specs(experiment, tmp_path, seeds=(0,))
    trainer = StoppingTrainer()

    def spt_fails(config, workdir):
        if "pretrain" in config.stage_order:
            raise RuntimeError("boom")
        return trainer(config, workdir)

    records, _ = compare.run_comparison(specs, str(tmp_path / "grid"), run_fn=spt_fails,
                                        log=lambda s: None)
    eq = [r for r in records if r["regime"] == "scratch-equal-compute"]
    assert [r["status"] for r in eq] == ["missing", "missing"]
    assert "its SPT run" in eq[0]["error"]
    assert not any(c[0] == "scratch-equal-compute" for c in trainer.calls)
    records, _ = compare.run_comparison(specs, str(tmp_path / "grid"), run_fn=trainer,
                                        log=lambda s: None)
    assert all(r["status"] == "finished" for r in records)
    assert [c[3]["scratch"] for c in trainer.calls if c[0] == "scratch-equal-compute"] == [
        _spent(0, 1e-3), _spent(0, 2e-3)]


def test_a_shard_holds_each_equal_compute_run_with_its_spt_runs(experiment, tmp_path):
    specs = _specs(experiment, tmp_path)
    for n in (2, 3):
        for i in range(n):
            mine = compare.shard_specs(specs, (i, n), group=equal_compute.group)
            for s in mine:
                if s.regime == "scratch-equal-compute":
                    spt = equal_compute.counterpart(s, specs)
                    assert spt in mine and mine.index(spt) < mine.index(s)


def test_stop_table_marks_cap_and_matched_budgets():
    recs = [{"model": "m", "regime": "spt-masked", "seed": k, "status": "finished",
             "test_accuracy": 0.5, "data_fraction": 1.0,
             "stages": {"pretrain": {"steps": 100, "best_step": 100, "stop_reason": "cap"},
                        "finetune": {"steps": 60 + k, "best_step": 20, "stop_reason": "patience"}}}
            for k in (0, 1)]
    recs.append({"model": "m", "regime": "scratch-equal-compute", "seed": 0,
                 "status": "finished", "test_accuracy": 0.5, "steps_matched_to": "x",
                 "stages": {"scratch": {"steps": 160, "best_step": 140, "stop_reason": None}}})
    text = stops.markdown(recs)
    assert "| 1 | m | spt-masked | pretrain | 100*, 100* | 100, 100 | 2/2 |" in text
    assert "| 1 | m | spt-masked | finetune | 60, 61 | 20, 20 | 0/2 |" in text
    assert "| 1 | m | scratch-equal-compute | scratch | 160= | 140 | – |" in text
    assert stops.markdown([dict(r, stages={"s": {"steps": 1}}) for r in recs]) == ""


def test_real_fmnist784_conv_grid_expands_as_documented(tmp_path):
    """experiments/real.py:fmnist784_conv: 70 runs (docstring), every stage with the patience,
    equal compute matched to spent steps and after its SPT runs, 1,000 and 10,000 images."""
    import math

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base, specs = compare.expand(os.path.join(root, "experiments", "real.py") + ":fmnist784_conv",
                                 {}, workdir=str(tmp_path))
    assert len(specs) == 70
    assert base.compare.equal_compute == equal_compute.SPENT
    assert sorted({math.ceil(s.data_fraction * 54000) for s in specs}) == [1000, 10000]
    for s in specs:
        assert all(s.config.stages[n].patience == 3 for n in s.config.stage_order)
        if s.regime != "scratch-equal-compute":  # (its steps are the SPT run's, read later)
            assert all(s.config.stages[n].num_steps == 200 for n in s.config.stage_order)
        assert s.config.data.resolution == 28
    for i, s in enumerate(specs):
        if s.regime == "scratch-equal-compute":
            spt = equal_compute.counterpart(s, specs)
            assert spt is not None and specs.index(spt) < i
