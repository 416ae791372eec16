"""`python -m sptlib.compare`: the fair-comparison protocol, models x regimes x seeds -> table and plots.

    python -m sptlib.compare --config=experiments/quickstart.py --workdir=/tmp/qs [--jobs=2]
    python -m sptlib.compare --config=experiments/lra.py:image,s4 --workdir=DIR [--config.x=y]

The grid is the config's `compare` section; re-running the same command finishes only the
missing runs. The protocol lives in `sptlib.protocol.compare` (its docstring: the regimes, the
folders, the outputs); this module parses the flags first, so `--help` and a bad flag answer
without importing JAX.
"""

import functools

from absl import app
from absl import flags

from sptlib import errors
from sptlib.protocol import compare_flags  # noqa: F401 (defines the flags)

PROG = "sptlib.protocol.compare"


def _prepared_main(argv):
    from sptlib.kernels import platform  # pylint: disable=import-outside-toplevel
    platform.prepare_process()  # CPU hosts: keep XLA:CPU's buffers (workers inherit it)
    from sptlib.protocol import compare  # pylint: disable=import-outside-toplevel
    return compare.main(argv)


def run():
    """Parses the flags (one line and exit 2 on a bad one), then runs the comparison."""
    flags.mark_flags_as_required(["config", "workdir"])
    app.run(_prepared_main, flags_parser=functools.partial(errors.parse_absl_flags, prog=PROG,
                                                           doc=__doc__))


if __name__ == "__main__":
    run()
