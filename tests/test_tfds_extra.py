"""TFDS and TensorFlow are the `tfds` extra: without them a TFDS-only path stops with one line
that names the extra (exit 2 from the command line); every other path never imports them."""

import importlib
import os
import subprocess
import sys

import pytest

from sptlib import errors
from sptlib.data import sources

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXTRA = "install sptlib's tfds extra: pip install -e '.[tfds]'"


@pytest.fixture
def no_tfds(monkeypatch):
    """TFDS not installed, as far as Python's import system can tell (None in sys.modules)."""
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    for name in ("sptlib.data.lra_tfds", "sptlib.data.speech_commands_tfds"):
        monkeypatch.delitem(sys.modules, name, raising=False)


@pytest.mark.parametrize("module", ["sptlib.data.lra_tfds", "sptlib.data.speech_commands_tfds"])
def test_tfds_builders_name_the_extra(no_tfds, module):
    with pytest.raises(errors.ConfigError, match="source='tfds'") as e:
        importlib.import_module(module)
    assert EXTRA in str(e.value)


def test_tfds_sources_name_the_task_and_the_extra(no_tfds):
    class Cfg:
        task, tfds_data_dir = "text", ""
    with pytest.raises(errors.ConfigError) as e:
        sources.tfds_source("imdb_reviews", "train", Cfg())
    assert "config.data.task='text'" in str(e.value) and EXTRA in str(e.value)
    assert "\n" not in str(e.value)


def test_command_line_says_which_extra_in_one_line(tmp_path):
    """`sptlib.main` on sCIFAR (TFDS cifar10) without TFDS: one line, exit status 2."""
    code = ("import sys, runpy; sys.modules['tensorflow_datasets'] = None; "
            "sys.argv = ['sptlib.main', '--config=experiments/scifar.py:s4,scratch', "
            f"'--workdir={tmp_path / 'w'}']; runpy.run_module('sptlib.main', run_name='__main__')")
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=env,
                         capture_output=True, text=True, timeout=300)
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("sptlib.main: error")]
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert EXTRA in lines[0] and "cifar10" in lines[0]
