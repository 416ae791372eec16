"""Test set-up: the repository root on `sys.path`, so `launch.*` and `benchmarks.*` import as
modules in every test (a missing root must not turn those tests into skips)."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def pytest_sessionfinish(session):  # pylint: disable=unused-argument
    """An xdist worker's heavy teardown, done before it reports finished.

    After the report, execnet gives the worker 5 s to end, then sends it SIGINT; pytest's last
    `gc.collect()` (its unraisable-exception check) over a full run's objects, each pass calling
    JAX's `_xla_gc_callback`, could outlast that on a loaded machine, so the SIGINT landed in that
    callback: the stray `PytestUnraisableExceptionWarning ... KeyboardInterrupt`. Here (still
    inside the session, with pytest's unraisable hook installed, so a real unraisable exception
    is still reported) JAX's caches are dropped and the garbage collected, then the survivors
    frozen, so that last pass has (almost) nothing to traverse."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    import gc
    jax = sys.modules.get("jax")
    if jax is not None:
        jax.clear_caches()
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="module")
def lra(tmp_path_factory):
    """A tiny generated ListOps release (64 / 16 / 16 examples of 10-64 tokens), per module."""
    from sptlib.data import listops  # deferred: conftest loads before every test module
    out = tmp_path_factory.mktemp("data")
    listops.generate_release(str(out), num_train=64, num_val=16, num_test=16, min_length=10,
                             max_length=64)
    return out
