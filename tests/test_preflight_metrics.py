"""The metric names preflight checks `best_metric` against are the ones each objective's eval step
really reports (traced from the step itself, nothing run)."""

import jax
import pytest

from sptlib.experiments import smoke
from sptlib import data as data_lib
from sptlib import objectives
from sptlib.train import preflight, setup

CASES = [  # (objective kind, target, task, input_type)
    ("masked", "auto", "listops", "tokens"),
    ("causal", "auto", "listops", "tokens"),
    ("classify", "auto", "listops", "tokens"),
    ("masked", "pixel256", "pathfinder", "continuous"),
    ("masked", "l1", "pathfinder", "continuous"),
    ("retrieval", "auto", "retrieval", "tokens"),
]


@pytest.mark.parametrize("kind,target,task,input_type", CASES)
def test_metric_names_match_the_eval_step(kind, target, task, input_type):
    c = smoke.get_config()
    c.data.task, c.data.input_type = task, input_type
    c.data.max_length = 64
    c.data.resolution = 8
    c.model.causal = kind == "causal"
    c.model.mask_channel = input_type == "continuous"
    c.model.encoder = "linear" if input_type == "continuous" else "token"
    stage = c.stages.scratch
    stage.objective = objectives.objective_config(kind)
    stage.objective.target = target
    built = setup.build_stage(c, "scratch", info=data_lib.task_info(c.data), abstract=True)
    reported = jax.eval_shape(built.eval_step, built.state, built.example_batch)
    assert set(reported) == preflight.metric_names(stage.objective)
