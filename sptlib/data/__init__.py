"""Data: LRA readers and TFDS builders, generators, offline data, tokenisers, grain pipelines.

Public API: `data_config()` (the `config.data` schema) and `get_task(config.data) -> Task` with
`task.info` and `task.make_iterator(split, *, batch_size, seed, ...)`; see docs/data.md.
"""

from sptlib.data.config import TASKS, data_config


def get_task(data_cfg):
    """Builds the `Task` named by `data_cfg.task` (see `sptlib.data.tasks.get_task`)."""
    from sptlib.data import tasks  # imported lazily: keeps `import sptlib.data` light
    return tasks.get_task(data_cfg)


__all__ = ["TASKS", "data_config", "get_task"]
