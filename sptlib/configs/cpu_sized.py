"""CPU-sized comparisons on data the package generates: the quickstart and the local reproduction.

Built on the paper presets' machinery in `sptlib.configs.presets` (regimes, model and optimiser
setters, the compare section), with one recipe for every model so the comparison is at equal
width, depth, optimiser and budget.
"""

from __future__ import annotations

import dataclasses
import os

import ml_collections

from sptlib.configs import variants
from sptlib.data.config import data_root
from sptlib.configs.paper import TASKS, Recipe
from sptlib.configs.presets import add_compare, apply_regime, set_model, set_optim
from sptlib.train import config as train_config

def lines(model: str, regime: str, *, resolution: int, num_train: int, num_eval: int,
                data_seed: int = 0, noise: float = 0.25, input_type: str = "continuous",
                style: str = "segments", **kwargs) -> ml_collections.ConfigDict:
    """A CPU-sized comparison on generated Lines images (`sptlib.data.orientation`; the local
    reproduction). Validation and test images come from a stream no training image uses.
    input_type: continuous (linear encoder + mask channel) | tokens (256 pixel tokens)."""
    data = dict(task="lines", input_type=input_type, resolution=resolution)
    generate = dict(enabled=True, seed=data_seed, num_train=num_train, num_val=num_eval,
                    num_test=num_eval, noise=noise, style=style)
    return comparison(model, regime, data=data, generate=generate, **kwargs)


def listops(model: str, regime: str, *, num_train: int, num_eval: int, min_length: int,
                  max_length: int, data_seed: int = 0, **kwargs) -> ml_collections.ConfigDict:
    """A CPU-sized ListOps comparison on generated expressions (`sptlib.data.listops.generate`:
    the LRA generator with a short length window, exclusive bounds `min_length < len <
    max_length` source tokens). Masked SPT masks 10% of the tokens (the paper's ListOps rate)
    unless `mask_rate` is given. `kwargs`: see `comparison`."""
    data = dict(task="listops", input_type="tokens", max_length=max_length,
                lra_dir=os.path.join(data_root(), f"listops_gen_seed{data_seed}_n{num_train}"
                                     f"_len{min_length}-{max_length}"))
    generate = dict(enabled=True, seed=data_seed, num_train=num_train, num_val=num_eval,
                    num_test=num_eval, min_length=min_length, max_length=max_length)
    kwargs.setdefault("mask_rate", TASKS["listops"].mask_rate)
    return comparison(model, regime, data=data, generate=generate, **kwargs)


def probe(model: str, regime: str, *, task: str, length: int, options: dict, num_train: int,
          num_eval: int, data_seed: int = 0, mask_rate: float = 0.15,
          **kwargs) -> ml_collections.ConfigDict:
    """A CPU-sized comparison on a synthetic probe (`task`: associative_recall |
    selective_copying, `sptlib.data.probes`): per-position labelling (`tagging` objective) with
    every model causal, the probes being causal tasks; masked SPT masks `mask_rate` of the tokens
    of the training sequences and reconstructs them. `options`: `config.data.probes` fields.
    `kwargs`: see `comparison`."""
    data = dict(task=task, input_type="tokens", max_length=length)
    probes = dict(options, num_train=num_train, num_val=num_eval, num_test=num_eval,
                  seed=data_seed)
    c = comparison(model, regime, data=data, generate={}, mask_rate=mask_rate,
                   objective="tagging", **kwargs)
    with c.unlocked():
        c.data.probes.update(probes)
        c.model.causal = True
        # A stage's `causal` overrides the model's (spt-causal finetunes bidirectionally); here
        # every stage stays causal.
        for name in ("pretrain", "finetune", "scratch"):
            if "causal" in c.stages[name]:
                c.stages[name].causal = True
    c.lock()
    return c


def comparison(model: str, regime: str, *, data: dict, generate: dict, n_layers: int,
                     d_model: int, steps: int, pretrain_steps: int, batch_size: int, lr: float,
                     eval_every: int, compare: dict, n_heads: int = 4, ffn_mult: int = 2,
                     d_state: int = 64, mask_rate: float = 0.5, target: str = "pixel256",
                     init_scheme: str = "linen", mlpinit_objective: str = "classify",
                     objective: str = "classify",
                     positions: str = "sinusoidal") -> ml_collections.ConfigDict:
    """A CPU-sized comparison config on a generated task (locked).

    Every model gets the same width, depth, optimiser (AdamW, cosine, weight decay 0.01) and
    budget; SSM parameters take lr 1e-3 and no weight decay as in the paper. Masked SPT masks
    `mask_rate` of the pixels and reconstructs them (`target`: pixel256 | l1). `init_scheme`:
    linen | torch initialisation of the dense projections (`config.model.init_scheme`).
    `mlpinit_objective`: stage 1 of the mlpinit regime (classify | masked). `objective`: the
    finetune / scratch stages' (classify | tagging). `positions`: the Transformer's (sinusoidal |
    rotary).
    """

    task = dataclasses.replace(TASKS["pathfinder"], data=dict(data), mask_rate=mask_rate,
                               target=target if data["input_type"] == "continuous" else "",
                               objective=objective)
    recipe = Recipe(n_layers, d_model, batch_size, lr, 0.01, 1, warmup_steps=min(100, steps // 10),
                    schedule="cosine", n_heads=n_heads, ffn_mult=ffn_mult, norm="layer",
                    positions=positions)
    c = train_config.base_config()
    with c.unlocked():
        c.data.update(data)
        c.data.generate.update(generate)
        set_model(c.model, model, task, recipe)
        c.model.init_scheme = init_scheme
        # Unroll the layer loop (same parameters and random streams): on XLA:CPU the rolled
        # loop zero-fills its stacked residuals every step; ~1.1x on the 2-layer Transformer.
        c.model.scan_unroll = n_layers
        for sub in ("s4", "s4d", "dss", "s5"):
            c.model[sub].d_state = d_state
        for name in ("pretrain", "finetune", "scratch"):
            s = c.stages[name]
            s.batch_size = batch_size
            set_optim(s, recipe, ssm=variants.uses_ssm_lr(model))
            s.eval_every = s.checkpoint_every = eval_every
            s.log_every = max(1, eval_every // 2)
        apply_regime(c, regime, task=task, pretrain_steps=pretrain_steps, finetune_steps=steps,
                     mlpinit_objective=mlpinit_objective)
        add_compare(c, **compare)
    c.lock()
    return c

