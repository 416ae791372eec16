"""Where `--config=experiments/<name>.py[:arg]` points: the packaged experiment files
(`sptlib/experiments/`) whenever no such file exists relative to the current directory, so the
same command works from a clone and, after `pip install`, from any folder. JAX-free and
import-free (the foundation), so flag parsing and its error messages resolve paths as loading does.
"""

import os

# sptlib/experiments/, beside this package (the installed package, or the clone's).
EXPERIMENTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "experiments")
_PACKAGED_PREFIXES = ("experiments/", "sptlib/experiments/")


def resolve_config_path(path: str) -> str:
    """`experiments/lra.py` -> `<site-packages>/sptlib/experiments/lra.py` when no
    `experiments/lra.py` exists relative to the current directory; every other path unchanged.

    A file of the user's own with the same relative path wins (it exists), and a name that is no
    packaged file stays as given, so the loader's error names what the user typed.
    """
    if not path or os.path.exists(path) or "://" in path:
        return path
    rel = path.replace(os.sep, "/")
    while rel.startswith("./"):
        rel = rel[2:]
    for prefix in _PACKAGED_PREFIXES:
        if rel.startswith(prefix):
            packaged = os.path.join(EXPERIMENTS_DIR, *rel[len(prefix):].split("/"))
            if os.path.isfile(packaged):
                return packaged
    return path


def resolve_config(config: str) -> str:
    """`file.py[:arg]` with its file resolved by `resolve_config_path` (the arg unchanged)."""
    path, sep, arg = config.partition(":")
    return resolve_config_path(path) + sep + arg
