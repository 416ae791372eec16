"""The comparison runner and report: a fake trainer for the bookkeeping, plus one real tiny
comparison (the real trainer, 2 runs, length generalisation at 2x)."""

import json
import os
import textwrap

import pytest

from sptlib.protocol import compare
from sptlib import errors
from sptlib.protocol import report

# A minimal experiment file: the runner needs only stage_order, stages.<s>.objective.kind,
# seed, data.{task, data_fraction} and the compare section.
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
        c.stages = {n: dict(num_steps=10, objective=dict(kind=k)) for n, k in
                    (("pretrain", "masked"), ("finetune", "classify"), ("scratch", "classify"))}
        regime = a.get("regime", "scratch")
        c.stage_order = ("scratch",) if regime.startswith("scratch") else ("pretrain", "finetune")
        if regime == "scratch-equal-compute":
            c.stages.scratch.num_steps = 20
        presets.add_compare(c, models=("m1", "m2"), regimes=("scratch", "spt-masked"),
                            seeds=(0, 1, 2), title="fake")
        c.lock()
        return c
''')

# Test accuracy the fake trainer reaches, per (model, regime, seed).
ACC = {("m1", "scratch"): [0.50, 0.52, 0.54], ("m1", "spt-masked"): [0.80, 0.82, 0.84],
       ("m2", "scratch"): [0.70, 0.70, 0.76], ("m2", "spt-masked"): [0.81, 0.83, 0.85]}


def write_stage(workdir, stage, *, steps, val, test, history, wall=1.5, test_last=None):
    """A stage's results.json in the trainer's format (what the runner reads back)."""
    d = os.path.join(workdir, stage)
    os.makedirs(d, exist_ok=True)
    res = {"stage": stage, "status": "finished", "final_step": steps, "best_step": 10,
           "validation": {"best": {"accuracy": val}}, "test": {"best": {"accuracy": test}},
           "wall_time_s": wall, "history": history}
    if test_last is not None:
        res["test"]["last"] = {"accuracy": test_last}
    with open(os.path.join(d, "results.json"), "w") as f:
        json.dump(res, f)


class FakeTrainer:
    """Writes stage results.json files in the trainer's format; can stop after `limit` runs."""

    def __init__(self, limit=None, fail=()):
        self.calls, self.limit, self.fail = [], limit, set(fail)

    def __call__(self, config, workdir):
        if self.limit is not None and len(self.calls) >= self.limit:
            raise KeyboardInterrupt  # the user pressing Ctrl-C mid-comparison
        model, regime = config.model.name, ("spt-masked" if "pretrain" in config.stage_order
                                            else "scratch")
        self.calls.append((model, regime, config.seed, workdir))
        if (model, regime, config.seed) in self.fail:
            raise RuntimeError("boom")
        acc = ACC[(model, regime)][config.seed]
        for stage in config.stage_order:
            write_stage(workdir, stage, steps=config.stages[stage].num_steps, val=acc - 0.01,
                        test=acc, test_last=acc - 0.05,
                        history=[{"step": 5, "accuracy": acc - 0.1},
                                 {"step": 10, "accuracy": acc - 0.01}])
        return {}


@pytest.fixture
def experiment(tmp_path):
    path = tmp_path / "fake_experiment.py"
    path.write_text(_EXPERIMENT)
    return str(path)


def test_expand_grid_and_overrides(experiment, tmp_path):
    base, specs = compare.expand(experiment + ":m1", {"model.width": 4, "compare.seeds": (5,)},
                                 workdir=str(tmp_path / "w"),
                                 regimes=["scratch", "scratch-equal-compute", "spt-masked"])
    assert base.compare.seeds == (5,)
    assert [(s.model, s.regime, s.seed) for s in specs] == [
        (m, g, 5) for m in ("m1", "m2") for g in ("scratch", "scratch-equal-compute",
                                                   "spt-masked")]
    by = {(s.model, s.regime): s for s in specs}
    assert by[("m2", "spt-masked")].config.stage_order == ("pretrain", "finetune")
    assert by[("m2", "spt-masked")].config.model.name == "m2"
    assert by[("m1", "scratch-equal-compute")].config.stages.scratch.num_steps == 20
    assert all(s.config.model.width == 4 and s.config.seed == 5 for s in specs)
    assert by[("m1", "scratch")].workdir == str(tmp_path / "w" / "m1" / "scratch" / "seed5")
    _, specs = compare.expand(experiment, {}, workdir="w", data_fractions=[0.1], seeds=[0])
    assert specs[0].config.data.data_fraction == 0.1
    assert specs[0].workdir == os.path.join("w", "m1", "scratch-frac0.1", "seed0")
    with pytest.raises(ValueError, match="unknown regime"):
        compare.expand(experiment, {}, workdir="w", regimes=["pretrain-only"])


def test_interrupted_comparison_resumes_only_missing_runs(experiment, tmp_path):
    wd = str(tmp_path / "cmp")
    _, specs = compare.expand(experiment, {}, workdir=wd)
    assert len(specs) == 12
    first = FakeTrainer(limit=5)
    with pytest.raises(KeyboardInterrupt):
        compare.run_comparison(specs, wd, run_fn=first, log=lambda s: None)
    assert len(first.calls) == 5
    partial = json.load(open(os.path.join(wd, "comparison.json")))
    assert len(partial) == 5 and all(r["status"] == "finished" for r in partial)

    second = FakeTrainer()
    records, paths = compare.run_comparison(specs, wd, run_fn=second, log=lambda s: None)
    done_first = {c[3] for c in first.calls}
    assert len(second.calls) == 7
    assert not done_first & {c[3] for c in second.calls}
    assert len(records) == 12 and all(r["status"] == "finished" for r in records)

    third = FakeTrainer()
    compare.run_comparison(specs, wd, run_fn=third, log=lambda s: None)
    assert third.calls == []  # everything finished: nothing reruns

    rec = {(r["model"], r["regime"], r["seed"]): r for r in records}
    r = rec[("m1", "spt-masked", 2)]
    assert r["test_accuracy"] == pytest.approx(0.84)  # best-validation checkpoint, not last
    assert r["val_accuracy"] == pytest.approx(0.83)
    assert r["stages"]["pretrain"]["steps"] == 10 and r["pretrain_steps"] == 10
    assert r["wall_time_s"] == pytest.approx(3.0)
    assert r["curve"] == {"step": [5, 10], "accuracy": pytest.approx([0.74, 0.83])}
    for key in ("markdown", "json", "bars", "curves"):
        assert os.path.getsize(paths[key]) > 0
    with open(paths["bars"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    md = open(paths["markdown"]).read()
    # m1 scratch: mean 52.0, s = 2.0, t_2 = 4.302653 -> ± 4.97 -> "52.0 ± 5.0 (3)".
    assert "| m1 | 52.0 ± 5.0 (3) | 82.0 ± 5.0 (3) |" in md
    # Gain: 30 points, Welch se = sqrt(4/3 + 4/3), df 4 -> 2.776445 * 1.632993 = 4.53.
    assert "| m1 | spt-masked − scratch | +30.0 ± 4.5 |" in md
    # Gap under scratch: m2 (72.0) − m1 (52.0) = +20.0.
    assert "| scratch | m2 − m1 | +20.0" in md


def test_failed_run_is_recorded_and_others_continue(experiment, tmp_path):
    wd = str(tmp_path / "cmp")
    _, specs = compare.expand(experiment, {}, workdir=wd, seeds=[0])
    fake = FakeTrainer(fail={("m2", "scratch", 0)})
    records, paths = compare.run_comparison(specs, wd, run_fn=fake, log=lambda s: None)
    status = {(r["model"], r["regime"]): r["status"] for r in records}
    assert status[("m2", "scratch")] == "failed"
    assert sum(v == "finished" for v in status.values()) == 3
    assert "RuntimeError: boom" in open(paths["markdown"]).read()
    assert os.path.exists(os.path.join(wd, "m2", "scratch", "seed0", "error.txt"))
    # The failed cell is retried on the next invocation, the others are not.
    again = FakeTrainer()
    compare.run_comparison(specs, wd, run_fn=again, log=lambda s: None)
    assert [(c[0], c[1]) for c in again.calls] == [("m2", "scratch")]


def test_report_without_intervals_and_length_table(tmp_path):
    recs = [{"model": "a", "regime": "scratch", "seed": 0, "status": "finished",
             "test_accuracy": 0.6, "val_accuracy": 0.6, "stages": {"scratch": {"steps": 3}},
             "length_generalization": {"2x": 0.55, "4x": 0.5}}]
    md = report.markdown(recs)
    assert "| a | 60.0 (1) |" in md
    assert "| a | scratch | 60.0 | 55.0 | 50.0 |" in md


def test_rand_init_adds_unstructured_variants_of_diagonal_ssms(tmp_path):
    """`--rand_init` on a real experiment file: s4d gets an `s4d-randinit` twin whose mixer is
    initialised randomly; models without a random initialiser (transformer, dlr) get none."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _, specs = compare.expand(os.path.join(root, "experiments", "reproduce_local.py"), {},
                              workdir=str(tmp_path), regimes=["scratch"], seeds=[0],
                              rand_init=True)
    models = [s.model for s in specs]
    assert models == ["transformer", "s4d", "dlr", "s4d-randinit"]
    by = {s.model: s.config for s in specs}
    assert by["s4d-randinit"].model.s4d.init_kind == "random"
    assert by["s4d"].model.s4d.init_kind == "lin"
    assert by["s4d-randinit"].model.mixer == "s4d"


def test_shards_split_the_grid_and_the_report_merges_them(experiment, tmp_path):
    """Two shards run disjoint halves that cover the grid, even in training steps to within one
    run (scratch 10, SPT 20); a later unsharded run trains nothing and reports all 12 runs."""
    wd = str(tmp_path / "cmp")
    _, specs = compare.expand(experiment, {}, workdir=wd)
    trainers = [FakeTrainer(), FakeTrainer()]
    for i, t in enumerate(trainers):
        records, paths = compare.run_comparison(specs, wd, run_fn=t, shard=(i, 2),
                                                log=lambda s: None)
        assert len(records) == len(t.calls) and set(paths) == {"json"}
        assert os.path.basename(paths["json"]) == f"comparison.shard{i}of2.json"
    dirs = [{c[3] for c in t.calls} for t in trainers]
    steps = [sum(10 if c[1] == "scratch" else 20 for c in t.calls) for t in trainers]
    assert sum(steps) == 180 and abs(steps[0] - steps[1]) <= 20  # within one run's steps
    assert not dirs[0] & dirs[1]
    assert dirs[0] | dirs[1] == {s.workdir for s in specs}
    assert not os.path.exists(os.path.join(wd, "comparison.md"))
    final = FakeTrainer()
    records, paths = compare.run_comparison(specs, wd, run_fn=final, log=lambda s: None)
    assert final.calls == [] and len(records) == 12
    assert "| m1 | 52.0 ± 5.0 (3) | 82.0 ± 5.0 (3) |" in open(paths["markdown"]).read()
    for bad in ("2/2", "1", "a/b", "0/0"):
        with pytest.raises(errors.ConfigError, match="--shard"):
            compare.parse_shard(bad)


# One real tiny comparison: the real trainer (sptlib.protocol.stages.run), 2 runs, length at 2x.
_REAL = textwrap.dedent('''
    from sptlib.experiments import smoke
    from sptlib.configs import common, presets

    POSITIONAL = ("model", "regime")

    def get_config(arg=""):
        common.parse_arg(arg, POSITIONAL)
        c = smoke.get_config()
        c.data.lra_dir = {lra!r}
        c.data.max_length = 48
        c.model.d_model = 16
        c.stage_order = ("scratch",)
        s = c.stages.scratch
        s.num_steps, s.eval_every, s.checkpoint_every, s.log_every = 4, 2, 2, 2
        s.batch_size, s.eval_batch_size = 8, 16
        with c.unlocked():
            presets.add_compare(c, models=("attention",), regimes=("scratch",),
                                seeds=(0, 1), length_factors=(2,), title="real")
        return c
''')


def test_one_real_tiny_comparison_end_to_end(tmp_path):
    path = tmp_path / "real.py"
    path.write_text(_REAL.format(lra=str(tmp_path / "lra")))
    wd = str(tmp_path / "cmp")
    base, specs = compare.expand(str(path), {}, workdir=wd)
    assert [(s.model, s.regime, s.seed) for s in specs] == [("attention", "scratch", 0),
                                                            ("attention", "scratch", 1)]
    records, paths = compare.run_comparison(specs, wd, length_factors=base.compare.length_factors,
                                            log=lambda s: None)
    assert [r["status"] for r in records] == ["finished", "finished"]
    prints = set()
    for spec, rec in zip(specs, records):
        own = json.loads(open(os.path.join(spec.workdir, "scratch", "results.json")).read())
        # The record is the run's own best-checkpoint test accuracy, not the last one's.
        assert rec["test_accuracy"] == own["test"]["best"]["accuracy"]
        assert rec["stages"]["scratch"]["steps"] == 4
        prints.add(own["params_fingerprint"])
        cached = json.loads(open(os.path.join(spec.workdir, "length_generalization.json")).read())
        assert set(cached) == {"2x"} and rec["length_generalization"] == cached
    assert len(prints) == 2  # two seeds, two different models
    assert "attention" in open(paths["markdown"]).read()

    # Rerun: nothing trains, the length cache answers, a new factor is computed on its own.
    asked = []

    def length_fn(config, workdir, factor):
        asked.append(factor)
        return 0.25

    records, _ = compare.run_comparison(specs, wd, length_factors=[2.0, 3.0],
                                        run_fn=lambda *a: pytest.fail("trained again"),
                                        length_eval_fn=length_fn, log=lambda s: None)
    assert asked == [3.0, 3.0]
    assert all(r["length_generalization"]["3x"] == 0.25 for r in records)
    assert [r["length_generalization"]["2x"] for r in records] == \
        [c["2x"] for c in (json.loads(open(os.path.join(s.workdir,
                                                        "length_generalization.json")).read())
                           for s in specs)]


def test_length_cache_never_stores_an_empty_result(experiment, tmp_path):
    wd = str(tmp_path / "cmp")
    _, specs = compare.expand(experiment, {}, workdir=wd, seeds=[0], models=["m1"],
                              regimes=["scratch"])

    def refuse(config, workdir, factor):
        raise ValueError("no longer inputs for this model")

    records, _ = compare.run_comparison(specs, wd, run_fn=FakeTrainer(), length_factors=[2.0],
                                        length_eval_fn=refuse, log=lambda s: None)
    assert records[0]["length_generalization"] == {}
    assert not os.path.exists(os.path.join(specs[0].workdir, "length_generalization.json"))
