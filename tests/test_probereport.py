"""The probe sections of the report (sptlib.protocol.probereport) on hand-made records."""

import pytest

from sptlib.protocol import bimodal, probereport, report


def _rec(model, regime, seed, acc, *, curve=None, params=1000, flops=2e6, steps=100,
         state=None, slices=None):
    r = {"model": model, "regime": regime, "seed": seed, "data_fraction": 1.0,
         "task": "mqar", "status": "finished", "test_accuracy": acc, "val_accuracy": acc,
         "stages": {"scratch": {"steps": steps, "num_params": params, "flops_per_step": flops,
                                "wall_time_s": 1.0}},
         "curve": curve or {"step": [50, 100], "accuracy": [acc / 2, acc]}}
    if state is not None:
        r["state_bytes"] = state
    if slices:
        r["length_slices"] = slices
    return r


def _grid(state=False):
    recs = []
    # Attention learns under both regimes; the recurrent model only with SPT (2 of 3 seeds).
    for s in range(3):
        recs.append(_rec("transformer", "scratch", s, 1.0, params=4000, flops=8e6,
                         state=4096 if state else None))
        recs.append(_rec("transformer", "spt-causal", s, 1.0, params=4000, flops=8e6,
                         state=4096 if state else None))
        recs.append(_rec("s4d", "scratch", s, 0.08, params=1000, flops=2e6,
                         state=256 if state else None))
        recs.append(_rec("s4d", "spt-causal", s, [0.99, 0.07, 0.97][s], params=1000, flops=2e6,
                         state=256 if state else None,
                         slices={"num_pairs=8 @1x": 0.5, "num_pairs=8 @2x": 0.25}))
    return recs


def test_bimodal_cell_withholds_its_t_interval_and_reports_success_rates():
    recs = _grid()
    md = report.markdown(recs)
    assert "‡ 2/3 learned (mean 67.7)" in md  # s4d / spt-causal: 99, 7, 97
    assert "100.0 ± 0.0 (3)" in md            # transformer: not bimodal, t-interval kept
    text = probereport.markdown(recs, threshold=90.0, chance=100 / 12)
    assert "| s4d | spt-causal | 2/3 (67%, 21–94%) | 98.0 ± 12.7 |" in text
    assert "success rate (bimodal)" in text and "| s4d | scratch | 0/3 (0%, 0–56%)" in text
    # SPT - scratch for s4d: 2/3 - 0/3 with Newcombe's interval.
    d = bimodal.newcombe(2, 3, 0, 3)
    assert f"| s4d | spt-causal − scratch | {d.format()} |" in text
    assert "| transformer − s4d | scratch: +100 points" in text  # the gap, then with SPT
    assert "spt-causal: +33 points" in text
    assert "| s4d | spt-causal | num_pairs=8 @1x" not in text
    assert "| s4d | spt-causal | 50.0 ± 0.0 | 25.0 ± 0.0 |" in text


def test_frontier_pareto_and_missing_state_panel(tmp_path):
    recs = _grid()
    text = probereport.markdown(recs, threshold=90.0)
    assert "No record has `state_bytes`" in text
    # s4d / spt-causal: cheapest with the best accuracy among the cheap cells; transformer at
    # 100% is on the front; s4d / scratch is dominated by s4d / spt-causal at the same cost.
    assert "| s4d | scratch | 1,000 | 2.00e+08 | – | 8.0 ± 0.0 (3) | – |" in text
    assert "| s4d | spt-causal | 1,000 | 2.00e+08 | – |" in text and "params, FLOPs |" in text
    path = probereport.plot_frontier(recs, str(tmp_path / "frontier.png"))
    assert path and (tmp_path / "frontier.png").stat().st_size > 1000
    with_state = probereport.markdown(_grid(state=True), threshold=90.0)
    assert "No record has `state_bytes`" not in with_state
    assert "| transformer | scratch | 4,000 | 8.00e+08 | 4,096 |" in with_state
    out = report.write_report(_grid(state=True), str(tmp_path / "w"))
    assert {"frontier", "steps_to_learn"} <= set(out)
    assert "Fairness frontier" in (tmp_path / "w" / "comparison.md").read_text()


def test_pareto_by_hand():
    pts = [(1, 0.5), (2, 0.9), (2, 0.4), (3, 0.9), (0.5, 0.1)]
    assert probereport.pareto(pts) == {0, 1, 4}


def test_threshold_refused_and_single_run_values_printed():
    with pytest.raises(ValueError, match="success threshold"):
        probereport.markdown(_grid(), threshold=100)
    one = [_rec("s4d", "scratch", 0, 0.688)]
    assert "n=1: no interval can be formed (values: 68.8)" in probereport.markdown(one, 90.0)
