"""The results.json schema (`sptlib.train.results`): the keys on disk, atomic writes, one reader.

The truth for the keys is a hand-written results file in the format the trainer and the stage
runner have written since `wall_time_total_s` and `flops_per_step` were added (the format of every
finished run on disk): reading it and writing it back must give the same JSON.
"""

import json
import os
import subprocess
import sys

import pytest

from sptlib.protocol import records
from sptlib.errors import ResultsError
from sptlib.train import results as results_lib

FINISHED = {
    "best_metric": "accuracy", "best_mode": "max", "best_step": 600, "final_step": 600,
    "flops_per_step": 1.5e9, "history": [{"accuracy": 0.5, "loss": 1.2, "step": 300},
                                         {"accuracy": 0.85, "loss": 0.4, "step": 600}],
    "init": {"checkpoint": "/r/pretrain/checkpoints/1900", "kind": "init_from", "loaded": 20,
             "not_loaded": ["head/logits/bias"], "quarantined": [],
             "skipped_from_checkpoint": ["head/logits/bias"]},
    "num_params": 12345, "params_fingerprint": "6c76", "resumed_at_step": 0,
    "stage": "finetune", "status": "finished",
    "test": {"best": {"accuracy": 0.887, "loss": 0.3}, "last": {"accuracy": 0.886, "loss": 0.31}},
    "train_steps_per_s": 1.6,
    "validation": {"best": {"accuracy": 0.85, "loss": 0.4}, "last": {"accuracy": 0.85,
                                                                     "loss": 0.4}},
    "wall_time_s": 382.2, "wall_time_total_s": 400.0}
DIVERGED = {"stage": "pretrain", "status": "diverged", "final_step": 7, "last_good_step": 5,
            "message": "non-finite training loss"}


@pytest.mark.parametrize("on_disk", [FINISHED, DIVERGED], ids=["finished", "diverged"])
def test_stage_results_round_trip_keeps_the_keys_on_disk(tmp_path, on_disk):
    (tmp_path / "results.json").write_text(json.dumps(on_disk))
    res = results_lib.read_stage(tmp_path)
    assert res.to_json() == on_disk
    results_lib.write_json(tmp_path / "again" / "results.json", res.to_json())
    assert json.loads((tmp_path / "again" / "results.json").read_text()) == on_disk


def test_accessors_and_the_runner_summary():
    res = results_lib.StageResults.from_json(FINISHED)
    assert res.finished and res.metric("test", "best", "accuracy") == 0.887
    assert res.metric("test", "best", "nope") is None and res.wall_time() == 400.0
    # The entry the runner writes for this stage (the keys of every run summary on disk).
    assert res.summary("classify") == {
        "status": "finished", "final_step": 600, "best_step": 600, "best_metric": "accuracy",
        "params_fingerprint": "6c76", "wall_time_s": 382.2, "init": FINISHED["init"],
        "objective": "classify", "validation_accuracy_best": 0.85,
        "test_accuracy_best": 0.887, "test_accuracy_last": 0.886}
    run = results_lib.RunResults(stage_order=["finetune"], stages={"finetune":
                                                                   res.summary("classify")},
                                 complete=True, wall_time_s=1.0, data=None)
    assert set(run.to_json()) == {"stage_order", "stages", "complete", "wall_time_s", "data"}
    # Read back as a stage, the summary entry has what it holds and nothing invented.
    st = results_lib.RunResults.from_json(run.to_json()).stage("finetune")
    assert st.stage == "finetune" and st.final_step == 600 and st.validation == {}
    assert st.wall_time() == 382.2


def test_unreadable_files_are_named(tmp_path):
    path = tmp_path / "results.json"
    path.write_text('{"status": "fini')
    with pytest.raises(ResultsError, match=r"results\.json is unreadable.*move it"):
        results_lib.read_stage(tmp_path)
    path.write_text('[1, 2]')
    with pytest.raises(ResultsError, match=r"results\.json: expected a JSON object"):
        results_lib.read_run(tmp_path)
    path.write_text('{"stage_order": ["a"]}')  # no `stages`
    with pytest.raises(ResultsError, match=r"results\.json: not a RunResults"):
        results_lib.read_run(tmp_path)
    # The comparison's reader logs it and counts the run as unfinished.
    assert records.load_results(str(tmp_path)) is None
    assert not records.is_finished(str(tmp_path), ["a"])
    assert results_lib.read_stage(tmp_path / "nothing") is None


def test_write_is_atomic_and_replaces(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    results_lib.write_json(path, {"a": 1})
    # A writer killed between the temporary file and the rename leaves the old file whole.
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        results_lib.write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 1}
    monkeypatch.undo()
    results_lib.write_json(path, {"b": {1, 2}, "c": (3,)}, indent=1, sort_keys=False)
    assert json.loads(path.read_text()) == {"b": [1, 2], "c": [3]}
    assert path.read_text().startswith('{\n "b"')


def test_reading_results_imports_no_jax():
    """The comparison's readers (records, lmreport) and the schema load without JAX."""
    code = ("import sys, sptlib.train.results, sptlib.protocol.records, sptlib.protocol.lmreport; "
            "sys.exit('jax' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0
