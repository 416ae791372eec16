"""Reproducibility and robustness contracts (issue 62): nothing read or written through a
planted link, the best checkpoint or a clear line, bounded and correct stops, user files that
end in one line, results that verify against their checkpoint, and determinism on CPU.

Rows join the fault table of docs/bad_inputs.md (`test_faults.record`).
"""

import json
import os
import pathlib
import shutil
import sys

import pytest

from sptlib import console, errors
from sptlib.protocol import stages
from sptlib.train import results as results_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]
from test_bad_inputs import _config  # noqa: E402
from test_faults import expect_error, record  # noqa: E402
from test_hostile_workdirs import tree_state  # noqa: E402


@pytest.fixture(scope="module")
def finished(lra, tmp_path_factory):
    """A finished tiny run (scratch, 4 steps, checkpoints at 2 and 4): copied by each test."""
    wd = tmp_path_factory.mktemp("finished") / "run"
    stages.run(_config(lra), str(wd))
    return wd


@pytest.fixture
def decoy(tmp_path):
    """Files outside the workdir that a planted link points at: byte-identical afterwards."""
    d = tmp_path / "decoy"
    d.mkdir()
    (d / "victim_log").write_text("precious log\n")
    # Valid JSON: read through, it would be taken for this run's own file.
    (d / "victim_results.json").write_text(json.dumps(
        {"stage": "scratch", "status": "finished", "final_step": 4, "best_step": 4,
         "best_metric": "accuracy", "validation": {"best": {"accuracy": 0.987}}}))
    (d / "victim_config.json").write_text('{"model": {"d_model": 16}}')
    before = tree_state(d)
    yield d
    assert tree_state(d) == before, "a run read or wrote through a planted link"


def _copy(finished, tmp_path):
    wd = tmp_path / "wd"
    shutil.copytree(finished, wd, symlinks=True)
    return wd


# -- item 3: nothing read or written through a planted link ------------------------------------

def test_planted_log_link_is_replaced_not_written_through(lra, finished, tmp_path, decoy,
                                                         caplog):
    wd = _copy(finished, tmp_path)
    (wd / "log.txt").unlink(missing_ok=True)
    os.symlink(decoy / "victim_log", wd / "log.txt")
    console.setup("test", verbose=False)
    try:
        with caplog.at_level("WARNING"):
            stages.run(_config(lra), str(wd))
    finally:
        console.reset()
    assert (wd / "log.txt").is_file() and not (wd / "log.txt").is_symlink()
    assert "==== " in (wd / "log.txt").read_text()  # this run's log went into its own file
    assert "is a symbolic link (to " in caplog.text and "not written through" in caplog.text
    record("hostile", "a finished workdir's log.txt planted as a symlink to a file outside",
           "HELD: the link is replaced by a regular log file (one warning naming the link); "
           "the file it pointed at is byte-identical")


@pytest.mark.parametrize("name", ["scratch/results.json", "scratch/config.json"])
def test_planted_stage_json_link_is_named_a_link(lra, finished, tmp_path, decoy, name):
    wd = _copy(finished, tmp_path)
    (wd / name).unlink()
    target = decoy / ("victim_results.json" if "results" in name else "victim_config.json")
    os.symlink(target, wd / name)
    e = expect_error("hostile", f"a finished workdir's {name} planted as a symlink to a "
                     "(valid JSON) file outside", lambda: stages.run(_config(lra), str(wd)),
                     errors.ResultsError, "is a symbolic link (to ")
    line = errors.one_line(e)
    assert "truncated" not in line and str(wd / name) in line, line
    assert (wd / name).is_symlink()  # left as found


def test_read_json_refuses_a_link_and_reads_a_file(tmp_path):
    (tmp_path / "real.json").write_text('{"a": 1}')
    os.symlink(tmp_path / "real.json", tmp_path / "link.json")
    assert results_lib.read_json(tmp_path / "real.json") == {"a": 1}
    with pytest.raises(errors.ResultsError, match="is a symbolic link"):
        results_lib.read_json(tmp_path / "link.json")
