"""The learning-rate axis of the comparison runner (`sptlib.protocol.sweeps`): one run per lr,
the lr chosen on validation only, the later seeds at the sweep's choice, per data fraction, and
the grid split over processes (shared pretraining, the choice over the whole grid)."""

import os

import pytest

from sptlib.protocol import compare
from sptlib.protocol import report

from test_compare import _EXPERIMENT, write_stage  # noqa: E402 (tests/ is on sys.path under pytest)


_LR_EXPERIMENT = _EXPERIMENT.replace(
    'c.stages = {n: dict(num_steps=10, objective=dict(kind=k)) for n, k in',
    'c.stages = {n: dict(num_steps=10, objective=dict(kind=k),\n'
    '                         optim=dict(lr=2e-3, ssm_lr=1e-3)) for n, k in').replace(
    'seeds=(0, 1, 2), title="fake")',
    'seeds=(0, 1, 2), title="fake")\n    c.compare.lrs = (1e-3, 3e-3, 1e-2)')

# Per lr: validation accuracy favours 3e-3, test accuracy favours 1e-2 (a choice on test would
# pick 1e-2).
LR_VAL = {1e-3: 0.60, 3e-3: 0.70, 1e-2: 0.65}
LR_TEST = {1e-3: 0.61, 3e-3: 0.66, 1e-2: 0.90}


class LrTrainer:
    """Like the real trainer: a stage whose results.json says finished is not trained again."""

    def __init__(self, test=LR_TEST):
        self.trained, self.test = [], test

    def __call__(self, config, workdir):
        lr = config.stages.finetune.optim.lr if "finetune" in config.stage_order else \
            config.stages.scratch.optim.lr
        lr = min(LR_VAL, key=lambda x: abs(x - lr))
        for stage in config.stage_order:
            d = os.path.join(workdir, stage)
            if os.path.exists(os.path.join(d, "results.json")):
                continue
            self.trained.append((config.model.name, stage, config.seed, lr))
            val = LR_VAL[lr] + 0.01 * config.seed
            write_stage(workdir, stage, steps=10, val=val, wall=1.0,
                        test=self.test[lr] + 0.01 * config.seed,
                        history=[{"step": 10, "accuracy": val}])
        return {}


@pytest.fixture
def lr_experiment(tmp_path):
    path = tmp_path / "lr_experiment.py"
    path.write_text(_LR_EXPERIMENT)
    return str(path)


def test_lr_axis_expands_every_cell_and_sets_only_classification_lrs(lr_experiment, tmp_path):
    wd = str(tmp_path / "w")
    _, specs = compare.expand(lr_experiment, {}, workdir=wd, seeds=[0])
    assert len(specs) == 2 * 2 * 3
    assert [s.lr for s in specs[:3]] == [1e-3, 3e-3, 1e-2]  # lr innermost
    spt = [s for s in specs if s.model == "m1" and s.regime == "spt-masked"]
    assert [s.workdir for s in spt] == [os.path.join(wd, "m1", f"spt-masked-lr{lr}", "seed0")
                                        for lr in ("0.001", "0.003", "0.01")]
    assert spt[2].name == "m1/spt-masked/seed0 lr=0.01"
    st = spt[2].config.stages
    assert st.finetune.optim.lr == 1e-2 and st.finetune.optim.ssm_lr == pytest.approx(5e-3)
    assert st.pretrain.optim.lr == 2e-3  # denoising keeps the recipe's lr
    # --lrs replaces the config's axis; lrs=[] turns it off (the plain directory layout).
    _, specs = compare.expand(lr_experiment, {}, workdir=wd, seeds=[0], lrs=[5e-4])
    assert {s.lr for s in specs} == {5e-4}
    _, specs = compare.expand(lr_experiment, {}, workdir=wd, seeds=[0], lrs=[])
    assert {s.lr for s in specs} == {None}
    assert specs[0].workdir == os.path.join(wd, "m1", "scratch", "seed0")


def test_lr_is_chosen_on_validation_and_test_never_enters(lr_experiment, tmp_path):
    wd = str(tmp_path / "cmp")
    _, specs = compare.expand(lr_experiment, {}, workdir=wd)
    trainer = LrTrainer()
    records, paths = compare.run_comparison(specs, wd, run_fn=trainer, log=lambda s: None)
    assert len(records) == 36 and all(r["lr"] in LR_VAL for r in records)
    # One pretraining per (model, seed): the other lrs' SPT cells link it.
    pretrains = [t for t in trainer.trained if t[1] == "pretrain"]
    assert len(pretrains) == 2 * 3
    link = os.path.join(wd, "m1", "spt-masked-lr0.01", "seed1", "pretrain")
    assert os.path.islink(link) and os.path.samefile(
        link, os.path.join(wd, "m1", "spt-masked-lr0.001", "seed1", "pretrain"))
    md = open(paths["markdown"]).read()
    # Test accuracy at the validation-chosen lr 3e-3: 66, 67, 68 -> 67.0 (not 1e-2's 91.0).
    assert "| m1 | 67.0 ± 2.5 (3) | 67.0 ± 2.5 (3) |" in md
    assert "## Learning rate chosen on validation" in md
    assert "scaling" not in paths  # one data fraction: no scaling plot
    assert "| m1 | spt-masked | 61.0 (3) | **71.0 (3)** | 66.0 (3) | 0.003 |" in md
    _, rows = report.lr_selected(records)
    assert {row["lr"] for row in rows} == {3e-3}

    # The proof: any test accuracies (here: every lr but the chosen one made the best on test,
    # or test removed) leave the choice unchanged; changing validation changes it.
    for test in ({1e-3: 0.99, 3e-3: 0.0, 1e-2: 0.98}, {lr: float("nan") for lr in LR_VAL}):
        other = [dict(r, test_accuracy=test[r["lr"]]) for r in records]
        assert {(row["model"], row["regime"], row["lr"])
                for row in report.lr_selected(other)[1]} == {
            (row["model"], row["regime"], row["lr"]) for row in rows}
    flipped = [dict(r, val_accuracy=LR_TEST[r["lr"]]) for r in records]
    assert {row["lr"] for row in report.lr_selected(flipped)[1]} == {1e-2}

    # A rerun trains nothing (finished cells and linked pretraining stages are skipped).
    again = LrTrainer()
    compare.run_comparison(specs, wd, run_fn=again, log=lambda s: None)
    assert again.trained == []


def test_lr_choice_ignores_unfinished_runs_and_reports_them(tmp_path):
    def rec(lr, seed, val, status="finished"):
        return {"model": "a", "regime": "scratch", "seed": seed, "lr": lr, "status": status,
                "data_fraction": 1.0, "test_accuracy": val, "val_accuracy": val,
                "stages": {"scratch": {"steps": 3}}}
    records = [rec(1e-3, 0, 0.5), rec(1e-3, 1, 0.52), rec(1e-2, 0, 0.9, status="failed"),
               rec(1e-2, 1, 0.1)]
    shown, rows = report.lr_selected(records)
    assert rows[0]["lr"] == 1e-3 and rows[0]["validation"][1e-2] == (pytest.approx(0.1), 1)
    assert [r["status"] for r in shown] == ["finished", "finished", "failed"]
    md = report.markdown(shown)
    assert "| a | 51.0 ± 12.7 (2) |" in md and "not finished" in md


def test_lr_seeds_sweep_once_then_run_the_other_seeds_at_the_chosen_lr(lr_experiment, tmp_path):
    wd = str(tmp_path / "cmp")
    _, specs = compare.expand(lr_experiment, {}, workdir=wd, lr_seeds=[0])
    assert len(specs) == 4 * 3 + 4 * 2  # seed 0 at 3 lrs, seeds 1 and 2 once
    # Test accuracy favours 1e-2 everywhere; validation favours 3e-3.
    trainer = LrTrainer()
    records, paths = compare.run_comparison(specs, wd, run_fn=trainer, log=lambda s: None)
    later = [r for r in records if r["seed"] > 0]
    assert len(later) == 8 and {r["lr"] for r in later} == {3e-3}
    assert not any(r["lr_sweep"] for r in later)
    assert os.path.isdir(os.path.join(wd, "m2", "spt-masked-lr0.003", "seed2", "finetune"))
    md = open(paths["markdown"]).read()
    assert "| m1 | 67.0 ± 2.5 (3) | 67.0 ± 2.5 (3) |" in md  # 3e-3, seeds 0-2
    # Only seed 0 votes: (1) at each lr.
    assert "| m1 | scratch | 60.0 (1) | **70.0 (1)** | 65.0 (1) | 0.003 |" in md
    again = LrTrainer()
    compare.run_comparison(specs, wd, run_fn=again, log=lambda s: None)
    assert again.trained == []
    # A sweep that has not finished leaves the other seeds waiting, reported as missing.
    wd2 = str(tmp_path / "cmp2")
    _, specs = compare.expand(lr_experiment, {}, workdir=wd2, lr_seeds=[0], models=["m1"],
                              regimes=["scratch"], seeds=[0, 1])
    records, _ = compare.run_comparison(specs, wd2, run_fn=LrTrainer(), report_only=True,
                                        log=lambda s: None)
    assert [r["status"] for r in records] == ["missing"] * 4
    assert "lr sweep (seeds 0) is not finished or not in --seeds" in records[-1]["error"]


def test_lr_is_chosen_per_data_fraction(lr_experiment, tmp_path):
    wd = str(tmp_path / "cmp")
    _, specs = compare.expand(lr_experiment, {}, workdir=wd, seeds=[0, 1], models=["m1"],
                              regimes=["scratch"], data_fractions=[1.0, 0.1])
    assert len(specs) == 2 * 2 * 3
    assert specs[3].workdir == os.path.join(wd, "m1", "scratch-frac0.1-lr0.001", "seed0")
    records, paths = compare.run_comparison(specs, wd, run_fn=LrTrainer(), log=lambda s: None)
    assert paths["scaling"] == os.path.join(wd, "scaling.png")  # accuracy against the fraction
    assert open(paths["scaling"], "rb").read(4) == b"\x89PNG"
    # At fraction 0.1 validation favours 1e-3 (the fake's validation made so); 3e-3 at 1.0.
    small = [dict(r, val_accuracy=1.0 - r["lr"]) if r["data_fraction"] == 0.1 else r
             for r in records]
    chosen = {row["data_fraction"]: row["lr"] for row in report.lr_selected(small)[1]}
    assert chosen == {1.0: 3e-3, 0.1: 1e-3}
    md = report.markdown(report.lr_selected(small)[0])
    assert "## Training data fraction 0.1" in md


def test_shards_share_pretraining_and_choose_lrs_over_the_whole_grid(lr_experiment, tmp_path):
    """--jobs with an lr sweep: an SPT cell's lrs land in one shard (its pretraining trained
    once), a shard's deferred seeds use every shard's sweep runs (never a choice among its own
    lrs only), and a second round splits the seeds that waited for another shard's sweep."""
    wd = str(tmp_path / "cmp")
    _, specs = compare.expand(lr_experiment, {}, workdir=wd, lr_seeds=[0])
    first = [LrTrainer(), LrTrainer()]
    for i in (1, 0):  # shard 1 ends before shard 0 starts: its later seeds wait for 0's sweep
        compare.run_comparison(specs, wd, run_fn=first[i], shard=(i, 2), log=lambda s: None)
    waiting = compare.sweeps.waiting(specs, compare._val_accuracy, compare.is_finished)
    assert len(waiting) >= 2 and all(s.lr == 3e-3 for s in waiting)
    second = [LrTrainer(), LrTrainer()]
    for i, t in enumerate(second):  # --jobs's second round: both start from the same state
        compare.run_comparison(specs, wd, run_fn=t, shard=(i, 2), deferred_only=True,
                               log=lambda s: None)
    assert all(t.trained for t in second)  # the waiting seeds are spread over both shards
    trained = [x for t in first + second for x in t.trained]
    # One pretraining per (model, seed) in the whole grid; every later seed at the chosen lr.
    assert sorted(x[::2] for x in trained if x[1] == "pretrain") == sorted(
        (m, s) for m in ("m1", "m2") for s in range(3))
    assert {x[3] for x in trained if x[2] > 0} == {3e-3}
    assert len(trained) == len(set(trained)) == 12 + 2 + 8 + 4  # each stage trained once
    final = LrTrainer()
    records, _ = compare.run_comparison(specs, wd, run_fn=final, log=lambda s: None)
    assert final.trained == [] and all(r["status"] == "finished" for r in records)
