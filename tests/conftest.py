"""Test set-up: the repository root on `sys.path`, so `launch.*` and `benchmarks.*` import as
modules in every test (a missing root must not turn those tests into skips)."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
