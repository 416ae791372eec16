"""Where `--config=experiments/<name>.py[:arg]` points, and where the packages `sptlib.experiments`
and `sptlib.launch` live.

A clone keeps the experiment configs and the launchers at its top level (`experiments/`,
`launch/`: the folders a user edits and submits with, as flax's examples, big_vision and MaxText
keep theirs); the wheel installs the same folders as `sptlib/experiments/` and `sptlib/launch/`
(setup.py's `package_dir`). `package_folder` finds whichever exists, so one command works from a
clone, from an editable install in any folder, and from the wheel.

`--config=experiments/X.py` names `X.py` in that experiments folder whenever no such file exists
relative to the current directory. JAX-free and import-free (the foundation), so flag parsing and
its error messages resolve paths as loading does.
"""

import os

_PACKAGE = os.path.dirname(os.path.abspath(__file__))
# The folders that are subpackages of sptlib in the wheel and top-level folders in a clone.
CLONE_TOP_LEVEL = ("experiments", "launch")


def package_folder(name: str) -> str:
    """The folder of `sptlib.<name>` (`name` in CLONE_TOP_LEVEL): `<site-packages>/sptlib/<name>`
    in an installed wheel, `<clone>/<name>` in a clone (its `sptlib/<name>` does not exist)."""
    inside = os.path.join(_PACKAGE, name)
    if os.path.isdir(inside):
        return inside
    return os.path.join(os.path.dirname(_PACKAGE), name)


# The experiment files: the installed package's, or the clone's top-level experiments/.
EXPERIMENTS_DIR = package_folder("experiments")
_PACKAGED_PREFIXES = ("experiments/", "sptlib/experiments/")


def resolve_config_path(path: str) -> str:
    """`experiments/lra.py` -> `<EXPERIMENTS_DIR>/lra.py` when no `experiments/lra.py` exists
    relative to the current directory; every other path unchanged.

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
