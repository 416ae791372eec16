"""Experiment config builders: what the files in `experiments/` are written with.

- `common.py`: argument strings (`parse_arg`, `format_arg`), resolving (`experiments/X.py` is
  the packaged `experiments/X.py`, sptlib.config_paths) and loading an experiment file, the `--config` flag;
- `paper.py`: the paper table (`TASKS`: one `TaskSpec` per task, a `Recipe` per model family);
- `presets.py`: the regimes and `build(task, model, regime)`, the paper-size config;
- `variants.py`: model names with an architecture variant, the bag-of-words control, mlpinit;
- `local.py`: the CPU-sized comparisons on generated data (quickstart, local reproduction);
- `testing.py`: `tiny(config)`, any config shrunk to a test's size.

Configs sit above `train` (they fill `sptlib.train.config.base_config()`); only the tools
(compare, aot, stages, the CLIs) and the experiment files import them.
"""
