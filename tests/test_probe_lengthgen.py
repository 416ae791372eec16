"""Length extrapolation of a probe (lengthgen on a `tagging` stage) on a real tiny MQAR run."""

import json
import os

import pytest

from sptlib.configs import common
from sptlib.protocol import lengthgen, stages

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow  # a real training run and seven evaluations: minutes on a busy CPU


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    c = common.load_module(os.path.join(ROOT, "experiments", "mad.py")).get_config(
        "mqar,s4d,scratch,steps=4,eval_every=2,num_eval=16,num_train=64")
    with c.unlocked():
        c.model.d_model = 16
        c.model.s4d.d_state = 8
        c.stages.scratch.checkpoint_every = 2
    workdir = tmp_path_factory.mktemp("mqar") / "run"
    stages.run(c, str(workdir))
    return c, workdir


def test_probe_at_factor_one_is_its_own_test_set_and_runs_longer(finished_run):
    config, workdir = finished_run
    results = json.loads((workdir / "scratch" / "results.json").read_text())
    assert lengthgen.evaluate(config, workdir, 1.0) == pytest.approx(
        results["test"]["best"]["accuracy"], abs=1e-6)
    long_cfg = lengthgen.longer_config(config, 4.0, 32, {"num_pairs": 8})
    assert long_cfg.data.max_length == 128 and long_cfg.data.probes.num_pairs == 8
    got = lengthgen.slice_results(config, workdir, ["num_pairs=8"], [2.0])
    assert set(got) == {"num_pairs=8 @1x", "num_pairs=8 @2x"}
    assert all(0.0 <= v <= 1.0 for v in got.values())
    # Cached: a second call reads the file (an evaluate that would fail is never called).
    assert lengthgen.slice_results(config, workdir, ["num_pairs=8"], [2.0],
                                   evaluate_fn=None, cached_only=True) == got


def test_refused_settings(finished_run):
    config, workdir = finished_run
    logs = []
    # 9 pairs need 36 tokens: at 1x (32) the generator refuses, in one line, logged and skipped.
    got = lengthgen.slice_results(config, workdir, ["num_pairs=9"], [2.0], log=logs.append)
    assert "num_pairs=9 @1x" not in got and "num_pairs=9 @2x" in got
    assert any("num_pairs 9 does not fit length 32" in line for line in logs)
    with pytest.raises(ValueError, match="not config.data.probes fields"):
        lengthgen.longer_config(config, 2.0, 32, {"pairs": 3})
    mem = common.load_module(os.path.join(ROOT, "experiments", "mad.py")).get_config(
        "mad_memorization,s4d,scratch")
    with pytest.raises(lengthgen.LengthGeneralizationUnsupported, match="different task"):
        lengthgen.check_supported(mem, 2.0)
    with pytest.raises(ValueError, match="expected field=value"):
        lengthgen.parse_slice("num_pairs")
