"""`python -m sptlib.aot`: compile every stage of a config for its TPU slice, on this host.

    python -m sptlib.aot --config=experiments/lra.py:pathx,transformer,spt-masked --topology=v4-32
    python -m sptlib.aot --all --markdown          # every paper config, each at its config's slice

Reports memory per chip against the chip's HBM, FLOPs per step and chip-hours per stage
(`sptlib.protocol.aot`'s docstring says how). Exit status: 0 when every stage fits, 1 otherwise,
2 on bad input or without libtpu (sptlib's `tpu` extra). The flags parse first, so `--help` and
a bad flag answer without importing JAX.
"""

import functools

from absl import app

from sptlib import errors
from sptlib.protocol import aot_flags


def _main(argv):
    from sptlib.protocol import aot  # pylint: disable=import-outside-toplevel
    aot.main(argv)


def cli():
    """Command-line entry point (`python -m sptlib.aot`)."""
    aot_flags.define_flags()
    app.run(_main, flags_parser=functools.partial(errors.parse_absl_flags, prog="sptlib.aot",
                                                  doc=__doc__))


if __name__ == "__main__":
    cli()
