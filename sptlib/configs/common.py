"""Argument strings and module loading shared by every experiment file and the tools.

Argument strings (`--config=experiments/lra.py:<arg>`) are comma-separated tokens: bare tokens
fill the file's positional slots in order (e.g. `listops,s4d,spt-masked` → task, model, regime),
`key=value` tokens set named slots. `sptlib.protocol.compare` re-calls `get_config` with `model=` and
`regime=` added, so every file must accept those two keys.

Config files are addressed as `experiments/<name>.py[:arg]`: the experiment files ship inside
the package (a clone's top-level `experiments/`, installed as `sptlib/experiments/`), and
`resolve_config_path` maps `experiments/<name>.py` to that file whenever no such file exists relative to the current directory, so the same
command works from a clone and, after `pip install`, from any folder. Any other path is the
user's own file, loaded as given.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

# The addressing of packaged experiment files lives in the foundation (flag parsing uses it).
from sptlib.config_paths import (  # noqa: F401
    EXPERIMENTS_DIR, resolve_config, resolve_config_path)


def parse_arg(arg: str | None, positional=()) -> dict[str, str]:
    """'listops,s4d,seeds=3' with positional ('task', 'model') -> {task, model, seeds}."""
    out: dict[str, str] = {}
    slots = list(positional)
    for tok in (arg or "").split(","):
        tok = tok.strip()
        if not tok:
            continue
        if "=" in tok:
            k, v = tok.split("=", 1)
            out[k.strip()] = v.strip()
            if k.strip() in slots:
                slots.remove(k.strip())
        else:
            while slots and slots[0] in out:
                slots.pop(0)
            if not slots:
                raise ValueError(f"Too many positional values in config argument {arg!r} "
                                 f"(positional slots: {tuple(positional)})")
            out[slots.pop(0)] = tok
    return out


def format_arg(values: dict[str, Any]) -> str:
    """Inverse of `parse_arg` (keyword form, so any file's positional order is irrelevant)."""
    return ",".join(f"{k}={v}" for k, v in values.items() if v is not None)


def packaged_experiments() -> list[str]:
    """`experiments/<name>.py` of every packaged experiment file (for help and error texts)."""
    return sorted(f"experiments/{f}" for f in os.listdir(EXPERIMENTS_DIR)
                  if f.endswith(".py") and not f.startswith("_"))


def load_module(path: str):
    """Imports an experiment file by path (as ml_collections' config_flags does); `path` goes
    through `resolve_config_path` first."""
    path = resolve_config_path(path)
    name = "spt_experiment_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"No experiment config at {path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def define_config_flag(name: str = "config", help_string: str = "", **kwargs):
    """ml_collections' `DEFINE_config_file` whose file goes through `resolve_config_path`, so
    `--config=experiments/X.py[:arg]` loads the packaged file from any folder. The flag's
    `config_filename` stays what the user typed (it is what results and logs record)."""
    from absl import flags  # deferred: only the command lines define flags
    from ml_collections import config_flags

    holder = config_flags.DEFINE_config_file(name, None, help_string, **kwargs)
    flag = flags.FLAGS[name]
    flag.parser = _ResolvingParser(flag.parser)
    return holder


class _ResolvingParser:
    """Wraps ml_collections' config-file parser: resolves the file, then parses as it does."""

    def __init__(self, parser):
        self._parser = parser

    def parse(self, argument):
        return self._parser.parse(resolve_config(argument))

    def __getattr__(self, attr):  # flag_type, ... as the wrapped parser's
        return getattr(self._parser, attr)
