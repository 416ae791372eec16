"""A CPU user's log carries no start-up chatter from jax, TensorFlow or orbax (real subprocess)."""

import subprocess
import sys

_PROGRAM = """
from absl import logging
logging.use_absl_handler()
logging.set_verbosity(logging.INFO)
from sptlib import logs
{quiet}
import jax
jax.devices()
import tensorflow  # what clu's writers and TFDS import
logging.info("our own line")
"""

_CHATTER = ("Unable to initialize backend", "oneDNN custom operations",
            "absl::InitializeLog")


def _stderr(quiet: bool) -> str:
    code = _PROGRAM.format(quiet="logs.quiet_library_logs()" if quiet else "")
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS", "JAX_PLATFORMS")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=240, env=env, check=True)
    return proc.stderr


def test_quiet_library_logs_drops_startup_chatter_but_keeps_ours():
    loud, quiet = _stderr(False), _stderr(True)
    # The chatter is really there without the filter (so the test can fail) ...
    assert sum(c in loud for c in _CHATTER) >= 2, loud
    # ... and gone with it, while our own INFO line still shows.
    assert not [c for c in _CHATTER if c in quiet], quiet
    assert "our own line" in quiet
