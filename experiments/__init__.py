"""The experiment configs: one file per study, each a `get_config(arg)` over `sptlib.configs`.

A clone keeps them here, at its top level; the wheel installs this folder as `sptlib.experiments`
(setup.py), so an installed sptlib runs them from any folder:
`--config=experiments/lra.py:listops,s4d,spt-masked` names this folder's `lra.py` whenever no
`experiments/lra.py` exists relative to the current directory (`sptlib.config_paths.
resolve_config_path`); any other path (`--config=path/to/my_config.py`) is the user's own file.
Nothing here is imported by the library; the files are loaded by path.
"""
