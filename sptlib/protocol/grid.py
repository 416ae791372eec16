"""The grid of a comparison: one `RunSpec` (a complete single-run config and its directory) per
model × regime × data fraction × seed (× lr), expanded from an experiment file's `compare` section.

`sptlib.protocol.compare` runs them; see its docstring for the regimes and the directory layout.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any, Sequence

import ml_collections

from sptlib import errors
from sptlib.configs import common, presets, variants
from sptlib.protocol import equal_compute, sweeps

REGIMES = presets.REGIMES


@dataclasses.dataclass
class RunSpec:
    """One cell of the grid: a complete config and the directory it runs in."""

    model: str
    regime: str
    seed: int
    data_fraction: float
    config: ml_collections.ConfigDict
    workdir: str
    lr: float | None = None  # the lr axis (sptlib.protocol.sweeps); None: the config's own lr
    lr_from: tuple = ()  # lrs to choose from on the sweep seeds' validation (sweeps.resolve)
    lr_seeds: tuple = ()
    spent_from: str = ""  # equal compute: the SPT run whose spent steps it trains (equal_compute)

    @property
    def name(self) -> str:
        frac = "" if self.data_fraction == 1.0 else f" frac={self.data_fraction:g}"
        lr = (" lr=(from validation)" if sweeps.deferred(self) else
              "" if self.lr is None else f" lr={self.lr:g}")
        return f"{self.model}/{self.regime}/seed{self.seed}{frac}{lr}"


def run_dir(root: str, model: str, regime: str, seed: int, data_fraction: float = 1.0) -> str:
    cell = regime if data_fraction == 1.0 else f"{regime}-frac{data_fraction:g}"
    return os.path.join(root, model, cell, f"seed{seed}")


def _set_path(cfg, path: str, value):
    """Sets `cfg.a.b.c = value` for `path='a.b.c'` (the key must exist: configs are locked)."""
    *parents, leaf = path.split(".")
    node = cfg
    for p in parents:
        node = node[p]
    node[leaf] = value


def expand(config_file: str, overrides: dict[str, Any] | None = None, *,
           workdir: str, models: Sequence[str] | None = None,
           regimes: Sequence[str] | None = None, seeds: Sequence[int] | None = None,
           data_fractions: Sequence[float] | None = None,
           rand_init: bool = False, lrs: Sequence[float] | None = None,
           lr_seeds: Sequence[int] | None = None
           ) -> tuple[ml_collections.ConfigDict, list[RunSpec]]:
    """Expands `path.py[:arg]` into one RunSpec per model × regime × data fraction × seed.

    Args:
      config_file: the experiment file and its optional `get_config` argument.
      overrides: flat {'a.b.c': value} applied to every run (`--config.a.b.c=value`); keys under
        `compare.` only change the grid.
      workdir: root of the comparison.
      models, regimes, seeds, data_fractions: override the config's `compare` section.
      rand_init: add `<model>-randinit` for every model that has a random-init variant.
      lrs: learning rates of the lr axis (default config.compare.lrs; none: no axis).
      lr_seeds: the seeds that sweep them (default config.compare.lr_seeds; none: every seed).

    Returns:
      (the base config, the run specs in execution order: seed-major, so that an interrupted
      comparison already has every cell at n = 1 before any reaches n = 2).
    """
    overrides = dict(overrides or {})
    path, _, arg = config_file.partition(":")
    module = common.load_module(path)
    base = copy.deepcopy(module.get_config(arg) if arg else module.get_config())
    for k, v in overrides.items():
        if k.startswith("compare."):
            _set_path(base, k, v)
    comp = base.compare
    models = list(models or comp.models)
    if rand_init:
        models += [m + "-randinit" for m in models if presets.has_randinit(m)]
    regimes = list(regimes or comp.regimes)
    seeds = [int(s) for s in (seeds if seeds is not None else comp.seeds)]
    fractions = [float(f) for f in (data_fractions or comp.data_fractions)]
    for g in regimes:
        if g not in REGIMES:
            raise errors.ConfigError(f"--regimes / config.compare.regimes: unknown regime {g!r}; "
                                     f"known: {', '.join(REGIMES)}")
    parsed = common.parse_arg(arg, getattr(module, "POSITIONAL", ()))
    cells = {}
    for m in models:
        for g in (g for g in regimes if variants.runs_regime(m, g)):
            try:
                cfg = module.get_config(common.format_arg({**parsed, "model": m,
                                                            "regime": g}))
            except (ValueError, KeyError) as e:  # e.g. a model the experiment does not know
                raise errors.ConfigError(f"--models / --regimes (config.compare): model {m!r}, "
                                         f"regime {g!r}: {e}") from e
            with cfg.unlocked():
                for k, v in overrides.items():
                    if not k.startswith("compare."):
                        _set_path(cfg, k, v)
            cells[(m, g)] = cfg
    specs = []
    for seed in seeds:
        for frac in fractions:
            for (m, g), cell in cells.items():
                cfg = copy.deepcopy(cell)
                cfg.seed = seed
                cfg.data.data_fraction = frac
                specs.append(RunSpec(m, g, seed, frac, cfg, run_dir(workdir, m, g, seed, frac)))
    lrs = lrs if lrs is not None else tuple(comp.get("lrs", ()) or ())
    lr_seeds = lr_seeds if lr_seeds is not None else tuple(comp.get("lr_seeds", ()) or ())
    return base, equal_compute.order(sweeps.expand_lrs(specs, [float(x) for x in lrs],
                                                       [int(s) for s in lr_seeds]))
