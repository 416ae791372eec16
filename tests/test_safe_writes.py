"""The comparison's own files (comparison.md, the plots, error.txt, the LM cache) are written
like results.json: a symlink planted at their name is replaced, never written through."""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from sptlib.protocol import report  # noqa: E402
from sptlib.train import results  # noqa: E402


def _planted(tmp_path, name):
    decoy = tmp_path / "outside" / "victim"
    decoy.parent.mkdir()
    decoy.write_bytes(b"precious")
    work = tmp_path / "work"
    work.mkdir()
    os.symlink(decoy, work / name)
    return decoy, work / name


def test_text_replaces_a_planted_symlink(tmp_path):
    decoy, target = _planted(tmp_path, "comparison.md")
    results.write_text(target, "| table |")
    assert decoy.read_bytes() == b"precious"
    assert not target.is_symlink() and target.read_text() == "| table |"
    assert [p.name for p in target.parent.iterdir()] == ["comparison.md"]  # no temporary left


def test_plot_replaces_a_planted_symlink(tmp_path):
    decoy, target = _planted(tmp_path, "accuracy.png")
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    report._save(fig, str(target))
    assert decoy.read_bytes() == b"precious"
    assert not target.is_symlink() and target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
