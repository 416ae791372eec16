"""`python -m sptlib.compare`: the command line of the comparison protocol.

The protocol lives in `sptlib.protocol` (`compare`: the grid and its table); this module only
keeps the documented command at the top level of the package.
"""

from sptlib.protocol.compare import run

if __name__ == "__main__":
    run()
