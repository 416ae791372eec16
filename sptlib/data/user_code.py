"""Loads the user's own Python objects named by import path, `"package.module:attribute"`
(`config.data.task = "my_pkg.tasks:build"`), with one-line errors naming the config key."""

from sptlib import import_path
from sptlib.errors import ConfigError, DataError
from sptlib.import_path import is_import_path  # noqa: F401 (re-exported for the data registry)


def load(path: str, key: str):
    """The object at `path` ("pkg.module:attr[.attr]"); ConfigError naming `key` otherwise."""
    return import_path.load(path, key, ConfigError)


def build_task(cfg):
    """`config.data.task = "pkg.module:build"`: the user's `build(config.data) -> Task`."""
    # Deferred: the Task class needs grain (JAX); `defaults.task_info` imports this module.
    from sptlib.data.registry import Task
    build = load(cfg.task, "config.data.task")
    if not callable(build):
        raise DataError(f"config.data.task={cfg.task!r}: {type(build).__name__} is not callable; "
                        f"expected build(config.data) -> sptlib.data.registry.Task")
    task = build(cfg)
    if not isinstance(task, Task):
        raise DataError(f"config.data.task={cfg.task!r}: returned {type(task).__name__}, "
                        f"expected a sptlib.data.registry.Task (docs/data.md, 'Adding a task')")
    missing = [k for k in ("vocab_size", "num_classes", "max_length", "input_type", "d_input")
               if k not in task.info]
    if missing:
        raise DataError(f"config.data.task={cfg.task!r}: its Task.info lacks {missing} "
                        f"(sptlib.data.defaults.info builds a complete one)")
    return task
