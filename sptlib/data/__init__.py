"""Data: LRA readers and TFDS builders, generators, offline data, tokenisers, grain pipelines.

Public API: `data_config()` (the `config.data` schema), `task_info(config.data)` and
`sequence_length(config.data)` (a task's `info` and length from its config alone, JAX-free) and `get_task(config.data) -> Task` with `task.info` and
`task.make_iterator(split, *, batch_size, seed, ...)`; see docs/data.md. A new task is a builder
`@sptlib.data.registry.register(name)` beside its reader, imported by `sptlib/data/catalog.py`.
"""

from sptlib.data.config import TASKS, data_config
from sptlib.data.defaults import sequence_length, task_info


def get_task(data_cfg):
    """Builds the `Task` named by `data_cfg.task` (see `sptlib.data.catalog.get_task`)."""
    # Deferred: the builders need grain, which imports JAX; configs and the JAX-free compare
    # CLI import `sptlib.data` for `data_config` only.
    from sptlib.data import catalog
    return catalog.get_task(data_cfg)


def record_spec(data_cfg, workdir, write=True):
    """`config.data.task = "files"`: writes the inferred data spec to `<workdir>/data_spec.json`,
    or checks it against the one there (`sptlib.data.user_files.record_spec`); other tasks:
    nothing (their facts are fixed by their config)."""
    if data_cfg.task == "files":
        from sptlib.data import user_files  # deferred: only the files task has a spec
        user_files.record_spec(data_cfg, workdir, write=write)


__all__ = ["TASKS", "data_config", "get_task", "record_spec", "sequence_length", "task_info"]
