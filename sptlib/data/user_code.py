"""Loads the user's own Python objects named by import path, `"package.module:attribute"`
(`config.data.task = "my_pkg.tasks:build"`), with one-line errors naming the config key."""

import importlib

from sptlib.errors import ConfigError, DataError


def is_import_path(name) -> bool:
    """Whether `name` is `module:attribute` rather than a registered name."""
    return isinstance(name, str) and ":" in name


def load(path: str, key: str):
    """The object at `path` ("pkg.module:attr[.attr]"); `key` names the config field in errors."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{key}={path!r}: expected 'package.module:name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"{key}={path!r}: cannot import module {module_name!r} ({e}); is its "
                          f"folder on PYTHONPATH (or the current folder)?") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{key}={path!r}: module {module_name!r} "
                              f"({getattr(module, '__file__', '?')}) has no {attr!r}")
        obj = getattr(obj, part)
    return obj


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
