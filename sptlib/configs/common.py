"""Argument strings and module loading shared by every experiment file and the tools.

Argument strings (`--config=experiments/lra.py:<arg>`) are comma-separated tokens: bare tokens
fill the file's positional slots in order (e.g. `listops,s4d,spt-masked` → task, model, regime),
`key=value` tokens set named slots. `sptlib.protocol.compare` re-calls `get_config` with `model=` and
`regime=` added, so every file must accept those two keys.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any


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


def load_module(path: str):
    """Imports an experiment file by path (as ml_collections' config_flags does)."""
    name = "spt_experiment_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"No experiment config at {path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
