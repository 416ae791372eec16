"""`python -m sptlib.aot`: compile every stage of a config for its TPU slice, on this host.

The compiler runs live in `sptlib.slices` (`aot`, with the slice topologies and mesh presets
beside it); this module only keeps the documented command at the top level of the package.
"""

from sptlib.slices.aot import cli

if __name__ == "__main__":
    cli()
