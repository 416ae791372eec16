"""Equal compute when SPT trains to convergence: the control gets the steps the SPT run spent.

With a fixed budget, `scratch-equal-compute` trains for pretrain + finetune steps, known from the
config (`sptlib.configs.presets.apply_regime`). When the stages train to convergence
(`stages.<s>.patience > 0`, `sptlib.train.convergence`), the SPT run's budget is known only after
it ran: `config.compare.equal_compute = "spent"` makes each equal-compute run train for exactly the
total steps its SPT run spent (pretrain stop + finetune stop, read from that run's stage
results), at a fixed budget (patience 0; the best checkpoint on validation is reported, as for
every run). Its SPT run is the grid's first SPT regime's run of the same model, seed and data
fraction, at the same lr on the lr axis (a seed whose lr is chosen on validation: the SPT run of
that seed, at the lr chosen for it).

Order and sharding: `order` puts each (seed, data fraction) block's equal-compute runs after its
SPT runs, and `group` keeps an equal-compute run in the same `--shard` unit as its SPT run, so a
shard never waits on another. An equal-compute run whose SPT run has not finished (another shard
still trains it, or it failed) is left `missing` and run by a later pass (`--jobs`'s final
sequential pass, or a rerun of the same command).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Sequence

from sptlib.protocol import sweeps

EQUAL = "scratch-equal-compute"
SPT_REGIMES = ("spt-masked", "spt-causal")
SPENT = "spent"  # config.compare.equal_compute: the SPT run's spent steps
BUDGET = "budget"  # the config's pretrain + finetune steps (default)


def matched(spec) -> bool:
    """True when `spec`'s grid sets equal compute from the SPT runs' spent steps."""
    comp = spec.config.get("compare")
    mode = comp.get("equal_compute", BUDGET) if comp is not None else BUDGET
    if mode not in (SPENT, BUDGET):
        raise ValueError(f"config.compare.equal_compute={mode!r}: expected {SPENT!r} or "
                         f"{BUDGET!r}")
    return mode == SPENT


def order(specs: Sequence) -> list:
    """`specs` with, in each (seed, data fraction) block, the equal-compute runs moved after the
    others (stable; unchanged when the grid does not match spent steps)."""
    if not any(matched(s) for s in specs):
        return list(specs)
    first = {}
    for i, s in enumerate(specs):
        first.setdefault((s.seed, s.data_fraction), i)
    return sorted(specs, key=lambda s: (first[(s.seed, s.data_fraction)],
                                        s.regime == EQUAL and matched(s)))


def group(spec):
    """The `--shard` unit of `spec`: an equal-compute run and the SPT runs of its model, seed and
    data fraction together (`sweeps.pretrain_key` otherwise: SPT runs sharing a pretraining)."""
    if matched(spec) and (spec.regime == EQUAL or spec.regime in SPT_REGIMES):
        return ("equal-compute", spec.model, spec.seed, spec.data_fraction)
    return sweeps.pretrain_key(spec)


def counterpart(spec, specs: Sequence):
    """The SPT spec whose spent steps `spec` (an equal-compute run) matches, or None."""
    regimes = [r for r in SPT_REGIMES if any(s.regime == r for s in specs)]
    if not regimes:
        return None
    for s in specs:
        if (s.regime == regimes[0] and (s.model, s.seed, s.data_fraction) ==
                (spec.model, spec.seed, spec.data_fraction)
                and bool(s.lr_from) == bool(spec.lr_from)  # both sweep, or both deferred
                and (s.lr_from or s.lr == spec.lr)):
            return s
    return None


def spent_steps(workdir: str, stage_order: Sequence[str], read_stage) -> int | None:
    """Total steps a finished run spent (its stages' `final_step`), None if any stage has not
    finished. `read_stage(directory) -> StageResults | None`."""
    total = 0
    for name in stage_order:
        st = read_stage(f"{workdir}/{name}")
        if st is None or not st.finished or st.final_step is None:
            return None
        total += int(st.final_step)
    return total


def waiting(spec) -> bool:
    """An equal-compute spec whose budget is still to be read from its SPT run."""
    return spec.regime == EQUAL and matched(spec) and not getattr(spec, "spent_from", "")


def resolve(spec, specs: Sequence, val_accuracy, read_stage):
    """`spec` with its budget set to its SPT run's spent steps when it is an equal-compute run
    of a grid that matches them and that run has finished; `spec` unchanged otherwise (then
    `waiting(spec)`). `val_accuracy` resolves a deferred SPT run's lr (`sweeps.resolve`)."""
    if not waiting(spec):
        return spec
    spt = counterpart(spec, specs)
    if spt is None:
        raise ValueError(f"{spec.model}/{EQUAL}/seed{spec.seed}: config.compare.equal_compute="
                         f"{SPENT!r} needs an SPT regime ({', '.join(SPT_REGIMES)}) in the grid")
    spt = sweeps.resolve(spt, specs, val_accuracy)
    if sweeps.deferred(spt):
        return spec
    steps = spent_steps(spt.workdir, spt.config.stage_order, read_stage)
    if steps is None:
        return spec
    cfg = copy.deepcopy(spec.config)
    with cfg.unlocked():
        for name in cfg.stage_order:
            cfg.stages[name].num_steps = steps
            cfg.stages[name].patience = 0  # a fixed budget: the SPT run's
    return dataclasses.replace(spec, config=cfg, spent_from=spt.workdir)
