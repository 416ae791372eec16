"""The user's own Python objects named by import path, `"package.module:attribute[.attribute]"`
(`config.model.mixer = "my_pkg.mixers:MyMixer"`, `config.data.task = "my_pkg.tasks:build"`).
JAX-free: the mixer registry (layers) and the task registry (data) both load through it."""

import importlib


def is_import_path(name) -> bool:
    """Whether `name` is `module:attribute` rather than a registered name."""
    return isinstance(name, str) and ":" in name


def load(path: str, key: str, error=ValueError, kind: str = "name"):
    """The object at `path`; `error(one line naming `key`)` when it does not resolve (`kind`:
    what the attribute is, for the message)."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise error(f"{key}={path!r}: expected 'package.module:{kind}'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise error(f"{key}={path!r}: cannot import module {module_name!r} ({e}); is its "
                    f"folder on PYTHONPATH (or the current folder)?") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise error(f"{key}={path!r}: module {module_name!r} "
                        f"({getattr(module, '__file__', '?')}) has no {attr!r}")
        obj = getattr(obj, part)
    return obj
