"""Learning-curve sections of the comparison report (`sptlib.protocol.learning_curves`)."""

import json
import os

from sptlib.protocol import learning_curves, report


def test_plateau_step_hand_computed():
    # Drop 6.0 -> 2.0 = 4.0; 90% of it is 3.6: step 300 has dropped 3.7, step 200 only 2.0.
    assert learning_curves.plateau_step([100, 200, 300, 400], [6.0, 4.0, 2.3, 2.0]) == 300
    # 3.5 < 3.6 at step 300, so the plateau is the minimum's step.
    assert learning_curves.plateau_step([100, 200, 300, 400], [6.0, 4.0, 2.5, 2.0]) == 400
    # A loss that never drops below its first value has no plateau.
    assert learning_curves.plateau_step([100, 200], [5.0, 5.1]) is None
    assert learning_curves.plateau_step([], []) is None


def _run(tmp_path, model, regime, seed, frac, test_acc, *, pretrain=None, curve=None):
    wd = tmp_path / f"{model}-{regime}-{seed}-{frac}"
    stages = {"scratch": {"steps": 300}}
    if pretrain is not None:
        stages = {"pretrain": {"steps": pretrain[-1][0]}, "finetune": {"steps": 300}}
        os.makedirs(wd / "pretrain")
        (wd / "pretrain" / "results.json").write_text(json.dumps(
            {"stage": "pretrain", "status": "finished", "final_step": pretrain[-1][0],
             "history": [{"step": s, "loss": v, "accuracy": 0.1} for s, v in pretrain]}))
    return {"model": model, "regime": regime, "seed": seed, "data_fraction": frac,
            "status": "finished", "test_accuracy": test_acc, "val_accuracy": test_acc,
            "workdir": str(wd), "stages": stages, "curve": curve,
            "pretrain_steps": pretrain[-1][0] if pretrain else 0}


def test_sections_and_plot(tmp_path):
    curve = {"step": [100, 300, 600], "accuracy": [0.25, 0.5, 0.75]}
    recs = [
        _run(tmp_path, "transformer", "spt-masked", 0, 1.0, 0.9,
             pretrain=[(100, 6.0), (200, 4.0), (300, 2.3), (400, 2.0)]),
        _run(tmp_path, "transformer", "spt-masked", 1, 1.0, 0.8,
             pretrain=[(100, 6.0), (200, 4.0), (300, 2.5), (400, 2.0)]),
        _run(tmp_path, "transformer", "scratch-equal-compute", 0, 1.0, 0.7, curve=curve),
        _run(tmp_path, "transformer", "scratch-equal-compute", 0, 0.5, 0.5,
             curve={"step": [100, 300, 600], "accuracy": [0.25, 0.25, 0.5]}),
    ]
    text = learning_curves.markdown(recs)
    # Denoising: mean first/last loss over the two seeds and each seed's plateau step.
    assert "| 1 | transformer | spt-masked | 2 | 6.0000 (step 100) | 2.0000 (step 400) | 300, 400 |" \
        in text
    # Accuracy against steps from the equal-compute runs; the longest run's end is a column.
    assert "| data fraction | model | seeds | 100 | 300 | 600 |" in text
    assert "| 1 | transformer | 1 | 25.0 | 50.0 | 75.0 |" in text
    assert "| 0.5 | transformer | 1 | 25.0 | 25.0 | 50.0 |" in text
    # Against training-set size: one column per fraction, n seeds in brackets.
    assert "| transformer | scratch-equal-compute | 50.0 (1) | 70.0 (1) |" in text
    unfinished = {**recs[3], "status": "missing", "seed": 1}
    paths = report.write_report(recs + [unfinished], str(tmp_path), "t")
    assert os.path.getsize(paths["denoising"]) > 1000
    md = (tmp_path / "comparison.md").read_text()
    assert "Denoising curve" in md
    # An unfinished run names its data fraction (else two fractions' runs read alike).
    assert "- transformer / scratch-equal-compute / data fraction 0.5 / seed 1: missing" in md


def test_nothing_to_show_adds_nothing(tmp_path):
    recs = [_run(tmp_path, "s4d", "scratch", 0, 1.0, 0.9)]
    assert learning_curves.markdown(recs) == ""
    assert learning_curves.write_plots(recs, str(tmp_path), None) == {}
