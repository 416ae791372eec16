"""The experiment configs: one file per study, each a `get_config(arg)` over `sptlib.configs`.

They ship inside the package, so an installed sptlib runs them from any folder:
`--config=experiments/lra.py:listops,s4d,spt-masked` names `sptlib/experiments/lra.py` whenever
no `experiments/lra.py` exists relative to the current directory (`sptlib.configs.common.
resolve_config_path`); any other path (`--config=path/to/my_config.py`) is the user's own file.
Nothing here is imported by the library; the files are loaded by path.
"""
