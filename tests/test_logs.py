"""A CPU user's log carries no start-up chatter from jax, TensorFlow or orbax (real subprocess)."""

import importlib.util
import subprocess
import sys

from sptlib import logs

_PROGRAM = """
from absl import logging
logging.use_absl_handler()
logging.set_verbosity(logging.INFO)
from sptlib import logs
{quiet}
import jax
jax.devices()
from jax._src.lib import _jax
print("tpu plugin loaded:", _jax.pjrt_plugin_loaded("tpu"))
import tensorflow  # what clu's writers and TFDS import
logging.info("our own line")
"""

_CHATTER = ("Unable to initialize backend", "oneDNN custom operations",
            "absl::InitializeLog")


def _run(quiet: bool) -> subprocess.CompletedProcess:
    code = _PROGRAM.format(quiet="logs.quiet_library_logs()" if quiet else "")
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS", "JAX_PLATFORMS")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=240, env=env, check=True)
    return proc


def test_quiet_library_logs_drops_startup_chatter_but_keeps_ours():
    loud_run, quiet_run = _run(False), _run(True)
    loud, quiet = loud_run.stderr, quiet_run.stderr
    if importlib.util.find_spec("libtpu") is not None and not logs._tpu_chip_present():
        # libtpu installed on a machine without TPUs: JAX would start it on every run.
        assert "tpu plugin loaded: True" in loud_run.stdout
        assert "tpu plugin loaded: False" in quiet_run.stdout
    # The chatter is really there without the filter (so the test can fail) ... Which lines
    # appear varies: once libtpu has started absl logging, TensorFlow skips its InitializeLog
    # warning, so at least one, not every one.
    assert any(c in loud for c in _CHATTER), loud
    # ... and gone with it, while our own INFO line still shows.
    assert not [c for c in _CHATTER if c in quiet], quiet
    assert "our own line" in quiet


def test_cpu_only_without_tpu_leaves_an_explicit_platform_choice(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert logs.cpu_only_without_tpu() is False
