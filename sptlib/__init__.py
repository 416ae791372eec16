"""sptlib: fair comparison of long-sequence models through self-pretraining (SPT).

Layers, from the bottom up (lower layers never import upper ones):
kernels (pure jnp) -> layers (Flax Linen) -> models -> objectives -> train -> stages.
"""

import importlib.abc as _abc
import importlib.util as _util
import os as _os
import sys as _sys

from sptlib import config_paths as _paths

# The one place the version is written: pyproject.toml reads it from here
# ([tool.setuptools.dynamic]), the wheel's metadata and CHANGELOG.md's latest entry carry it.
__version__ = "0.1.0"


class _CloneFolders(_abc.MetaPathFinder):
    """`sptlib.experiments` / `sptlib.launch` from a clone's top-level `experiments/` and `launch/`
    when the clone itself is on the path (`python -m sptlib.main` at its root, PYTHONPATH=clone):
    no install maps them there. The wheel has them inside the package (this finder is then not
    installed); an editable install maps them as well (setuptools' editable finder)."""

    def find_spec(self, fullname, path=None, target=None):
        head, _, name = fullname.partition(".")
        if head != __name__ or name not in _paths.CLONE_TOP_LEVEL:
            return None
        folder = _paths.package_folder(name)
        return _util.spec_from_file_location(fullname, _os.path.join(folder, "__init__.py"),
                                             submodule_search_locations=[folder])


if not _os.path.isdir(_os.path.join(_os.path.dirname(__file__), "experiments")) and \
        not any(isinstance(f, _CloneFolders) for f in _sys.meta_path):
    # First, so that an editable install of another checkout cannot answer for this one.
    _sys.meta_path.insert(0, _CloneFolders())
