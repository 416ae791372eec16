"""Published numbers that cannot drift from the code: the README's quickstart command is run as
documented and what it prints is compared with what the README and docs/quickstart.md show (the
per-run lines of the stdout block in docs/quickstart.md, and the test-accuracy table in both),
cell by cell.

Slow (the whole quickstart: 18 runs, about 6 minutes on 2 idle cores). CI runs it (.ci/run):

    python -m pytest -q -m slow tests/test_published_tables.py

The pages are parsed, not copied: a rewrite that keeps the command (README), the `[compare] i/n
name: test accuracy X%` lines (docs/quickstart.md) and the `| model | ... |` tables keeps the test. Runs are bitwise
reproducible on CPU for a given config, seed, device count and thread setting
(docs/training.md), so an equal print is the expectation, not a tolerance.
"""

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
QUICKSTART = ROOT / "docs" / "quickstart.md"  # the whole stdout, moved out of the README
RUN_LINE = re.compile(r"^\[compare\] \d+/\d+ (\S+): test accuracy ([\d.]+)%")
TABLE_HEAD = "| model | scratch | scratch-equal-compute | spt-masked |"


def quickstart_args(text):
    """The README's quickstart command: the arguments after `python -m sptlib.compare`."""
    for line in text.splitlines():
        if "-m sptlib.compare" in line and "experiments/quickstart.py" in line:
            tail = line.split("-m sptlib.compare", 1)[1].split("&&")[0]
            return shlex.split(tail)
    raise AssertionError("README.md has no `python -m sptlib.compare "
                         "--config=experiments/quickstart.py ...` command")


def run_lines(text):
    """{run name: test accuracy (%) as printed} of `[compare] i/n name: ...` lines."""
    return {m.group(1): m.group(2) for m in map(RUN_LINE.match, text.splitlines()) if m}


def tables(text):
    """[rows] of every test-accuracy table (`TABLE_HEAD`) in `text`: [(model, cells...)]."""
    out, lines = [], text.splitlines()
    for i, ln in enumerate(lines):
        if ln.strip() == TABLE_HEAD:
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                rows.append(tuple(c.strip() for c in row.strip().strip("|").split("|")))
            out.append(rows)
    return out


def test_the_readme_parses():
    """Fast: the README still has what the slow test compares (a rewrite must keep them)."""
    args = quickstart_args(README.read_text())
    assert any(a.startswith("--config=experiments/quickstart.py") for a in args), args
    lines = run_lines(QUICKSTART.read_text())
    assert len(lines) == 18 and {n.split("/")[1] for n in lines} == {
        "scratch", "scratch-equal-compute", "spt-masked"}, lines
    for page in (README, QUICKSTART):
        found = tables(page.read_text())
        assert found and all(len(rows) == 2 for rows in found), (page.name, found)


@pytest.mark.slow
def test_the_readme_quickstart_prints_what_the_readme_shows(tmp_path):
    args = [a for a in quickstart_args(README.read_text()) if not a.startswith("--workdir")]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    env.pop("XLA_FLAGS", None)  # the suite's fake device count is not the user's machine
    p = subprocess.run([sys.executable, "-m", "sptlib.compare", *args,
                        f"--workdir={tmp_path / 'quickstart'}"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=3600)
    assert p.returncode == 0, p.stderr[-3000:]
    printed, shown = run_lines(p.stdout), run_lines(QUICKSTART.read_text())
    assert printed.keys() == shown.keys(), (sorted(printed), sorted(shown))
    drift = {n: (shown[n], printed[n]) for n in shown if shown[n] != printed[n]}
    assert not drift, f"docs/quickstart.md shows / the command prints (test accuracy %): {drift}"
    md = (tmp_path / "quickstart" / "comparison.md").read_text()
    for page in (README, QUICKSTART):
        for rows in tables(page.read_text()):
            assert rows == tables(md)[0], (page.name, rows, tables(md)[0])
