"""What the comparison plots say (`sptlib.protocol.report`, `learning_curves`, `plotting`): the
figures are captured before saving and read back: titles with the data and budget, the chance
line, whiskers inside [0, 100], the t-interval (the table's statistic) as band, regimes in
separate panels, seeds told apart."""

import json
import math

import numpy as np
import pytest

from sptlib.protocol import learning_curves, plotting, report, stats


def test_clipped_yerr_hand_computed():
    # 95 ± 16 → whisker up to 100 (5 above), 16 below; 3 ± 10 → down to 0 (3 below).
    got = plotting.clipped_yerr([95.0, 3.0, 50.0], [16.0, 10.0, float("nan")])
    assert got.tolist() == [[16.0, 3.0, 0.0], [5.0, 10.0, 0.0]]


def test_mean_band_is_the_t_interval():
    ys = [[10.0, 2.0], [14.0, 30.0], [12.0, 58.0]]
    mean, lo, hi = plotting.mean_band(ys, 0.95, 0.0, 100.0)
    # column 0: mean 12, s = 2, t_{0.975, 2} = 4.303: half-width 4.303 * 2 / sqrt(3)
    half = 4.302652729911275 * 2.0 / math.sqrt(3)
    assert mean[0] == pytest.approx(12.0) and hi[0] == pytest.approx(12.0 + half, rel=1e-6)
    assert lo[0] == pytest.approx(12.0 - half, rel=1e-6)
    # column 1: 30 ± 4.303 * 28 / sqrt(3) = 30 ± 69.6: clipped at 0, not at the top
    assert lo[1] == 0.0 and hi[1] == pytest.approx(30 + 4.302652729911275 * 28 / math.sqrt(3))
    assert hi[1] == pytest.approx(30 + stats.mean_ci([2.0, 30.0, 58.0]).half_width)


def _records(tmp_path):
    """4-class task (chance 25%): two models x scratch / spt-masked x 2 seeds; one cell's
    seeds are 0.97 and 0.60, whose t-interval (±235 points) passes 100%."""
    recs = []
    acc = {("transformer", "scratch"): (0.97, 0.60), ("transformer", "spt-masked"): (0.9, 0.92),
           ("s4d", "scratch"): (0.5, 0.55), ("s4d", "spt-masked"): (0.8, 0.82)}
    for (m, g), seeds in acc.items():
        for seed, a in enumerate(seeds):
            wd = tmp_path / m / g / f"seed{seed}"
            stages = ({"pretrain": {"steps": 600}, "finetune": {"steps": 200}}
                      if g == "spt-masked" else {"scratch": {"steps": 200}})
            last = list(stages)[-1]
            (wd / last).mkdir(parents=True)
            (wd / last / "config.json").write_text(json.dumps(
                {"data": {"task": "lines", "resolution": 8, "max_length": 0,
                          "input_type": "continuous"}}))
            if g == "spt-masked":
                (wd / "pretrain").mkdir()
                (wd / "pretrain" / "results.json").write_text(json.dumps(
                    {"stage": "pretrain", "status": "finished", "final_step": 600,
                     "history": [{"step": s, "loss": 1.0 / s + seed * 0.01}
                                 for s in (100, 300, 600)]}))
            recs.append({"model": m, "regime": g, "seed": seed, "data_fraction": 1.0,
                         "status": "finished", "test_accuracy": a, "val_accuracy": a,
                         "workdir": str(wd), "stages": stages,
                         "pretrain_steps": 600 if g == "spt-masked" else 0,
                         "curve": {"step": [100, 200], "accuracy": [a - 0.1, a]}})
    return recs


@pytest.fixture
def figures(monkeypatch):
    saved = {}

    def keep(fig, path):
        saved[path.rsplit("/", 1)[-1]] = fig
    monkeypatch.setattr(report, "_save", keep)
    return saved


def test_the_plots_say_what_they_show(tmp_path, figures):
    recs = _records(tmp_path)
    assert plotting.chance_accuracy(recs) == 25.0
    report.write_report(recs, str(tmp_path))
    assert set(figures) == {"accuracy.png", "curves.png", "denoising.png"}

    (ax,) = figures["accuracy.png"].axes
    title = ax.get_title()
    assert "all training data" in title and "2 seeds" in title and "t-interval" in title
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "scratch (200 steps)" in labels and "chance (25%)" in labels
    assert "spt-masked (600 pretraining + 200 finetuning steps)" in labels
    assert [ln.get_ydata()[0] for ln in ax.get_lines() if ln.get_label().startswith("chance")] \
        == [25.0]
    # Whiskers (the error-bar line collections) never pass 0% or 100%.
    whiskers = np.concatenate([seg for c in ax.collections if hasattr(c, "get_segments")
                               for seg in c.get_segments()])
    assert whiskers[:, 1].max() == pytest.approx(100.0) and whiskers[:, 1].min() >= 0.0

    panels = figures["curves.png"].axes
    assert [a.get_title() for a in panels] == [
        "scratch\n200 steps", "spt-masked\n600 pretraining + 200 finetuning steps"]
    assert "t-interval" in figures["curves.png"]._suptitle.get_text()
    means = [ln for ln in panels[0].get_lines() if ln.get_label().startswith("transformer")]
    assert means[0].get_ydata().tolist() == pytest.approx([68.5, 78.5])  # mean of the seeds

    (ax,) = figures["denoising.png"].axes
    assert "data fraction" not in ax.get_title() and "all training data" in ax.get_title()
    assert "600 steps" in ax.get_title()
    # per model: one bold mean (labelled) and a thin line per seed, so seeds are told apart
    labelled = [ln.get_label() for ln in ax.get_lines() if not ln.get_label().startswith("_")]
    assert labelled == ["transformer: mean of 2 seeds (thin: each seed)",
                        "s4d: mean of 2 seeds (thin: each seed)"]
    assert len(ax.get_lines()) == 6

    # A model in the first regime only (a control without SPT) is still in the legend.
    figures.clear()
    control = [dict(r, model="bow") for r in recs if r["model"] == "s4d"
               and r["regime"] == "scratch"]
    report.plot_curves(recs + control, str(tmp_path / "curves.png"))
    panels = figures["curves.png"].axes
    labels = [t.get_text() for t in panels[-1].get_legend().get_texts()]
    assert labels == ["transformer (2 seeds)", "s4d (2 seeds)", "bow (2 seeds)", "chance (25%)"]


def test_scaling_plot_labels_only_the_fractions(tmp_path, figures):
    recs = _records(tmp_path)
    recs += [dict(r, data_fraction=0.1) for r in recs]
    report.plot_scaling(recs, str(tmp_path / "scaling.png"))
    (ax,) = figures["scaling.png"].axes
    assert ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0.1", "1"]
    assert ax.get_xticks(minor=True).size == 0  # no 2x10^-1 ... overprinting them


def test_no_chance_level_without_a_saved_config(tmp_path):
    recs = _records(tmp_path)
    for r in recs:
        r["workdir"] = str(tmp_path / "gone")
    assert plotting.chance_accuracy(recs) is None
    assert learning_curves.write_plots([], str(tmp_path), None) == {}
