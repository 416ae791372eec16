"""Loads the user's own Python objects named by import path, `"package.module:attribute"`
(`config.data.task`, `config.model.mixer`), with one-line errors naming the config key."""

import importlib

from sptlib.errors import ConfigError


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
