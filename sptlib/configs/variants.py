"""Model names that carry an architecture variant, the bag-of-words control, and the `mlpinit`
regime: the pieces that let one `compare` grid hold them next to the paper's models.

Model names (`config.compare.models`, the `model=` slot of every experiment file):

  transformer-deep     the recipe's Transformer, L layers × H heads (same as `transformer`);
  transformer-wide<k>  L/k layers × k·H heads of the same head width d/H, FFN width k·ffn_mult;
  transformer-wide     1 layer × L·H heads (k = L);
  bow                  the bag-of-words control: embedding -> mean pooling -> MLP head
                       (`sptlib.models.bow`); it runs under `scratch` only (see `runs_regime`).

Wide variants are at **equal parameters**: merging k deep layers into one keeps every projection
(k·H heads of width d/H have the k layers' q, k, v, o matrices) and one FFN k times as wide holds
the k FFNs' matrices. What is not kept is per-layer vectors: a merged layer has one attention
output bias, one FFN output bias and two norms instead of k of each, so with layer norm

    params(deep) − params(wide<k>) = (L/k) · (k − 1) · 6 · d     (exactly; tests check it).

Per token the dense matrix products are then the same FLOPs, and the attention scores too (L·H
heads of width d/H either way): the variants differ in arrangement (sequential vs parallel), not
in size or compute.

`mlpinit` (MLPInit, Han et al. 2023, carried over from GNNs to sequence models): stage `mlpinit`
trains the same model with every sequence mixer bypassed (`stages.mlpinit.bypass_mixers`: each
residual block's mixer outputs zeros, so only the per-token parts — encoder, norms, FFNs, head —
exist and learn), then `finetune` starts from it: the mixers at their usual init
(`dont_load = MIXER_PATTERN`), every other tensor loaded from the best stage-1 checkpoint and
checked one by one (`sptlib.train.transfer.load_pretrained`: a missing or mis-shaped non-mixer
tensor is an error; the loaded paths are listed in the stage's results, `init.loaded_tensors`).
A pre-norm block's `mixer_norm` only feeds the mixer: in stage 1 it is computed, unused, and
leaves at its init up to weight decay; it is loaded like every other non-mixer tensor.
"""

from __future__ import annotations

import copy
import re

from sptlib import objectives

# Paths of the residual blocks' sequence-mixer parameters (`backbone/.../block/mixer/...`).
MIXER_PATTERN = r"/mixer/"
# Stage-1 objectives of mlpinit. classify (default): the task's labels. A per-token network under
# the masked objective sees only `<mask>` at the positions it is scored on, so it can learn the
# masked tokens' marginal and nothing about the other tokens' embeddings: `masked` is offered
# for comparison, not as a useful prior.
MLPINIT_OBJECTIVES = ("classify", "masked")
CONTROLS = ("bow",)
_WIDE = re.compile(r"^transformer-wide(\d*)$")


def family(name: str) -> str:
    """The base model of a name: transformer-deep / transformer-wide<k> -> transformer;
    `<ssm>-randinit` -> `<ssm>`; others unchanged."""
    name = name.removesuffix("-randinit")
    if name == "transformer-deep" or _WIDE.match(name):
        return "transformer"
    return name


def uses_ssm_lr(name: str) -> bool:
    """Whether the model has SSM parameters with their own learning rate (the paper's groups)."""
    return family(name) not in ("transformer", "transformer-causal", "bow")


def wide_factor(name: str, n_layers: int) -> int:
    """k of `transformer-wide<k>` (`transformer-wide`: k = n_layers); 1 for any other name."""
    m = _WIDE.match(name)
    if not m:
        return 1
    return int(m.group(1)) if m.group(1) else int(n_layers)


def apply_variant(model_cfg, name: str) -> None:
    """Turns the deep Transformer in `model_cfg` into `name`'s variant (in place; see the module
    docstring). Raises ValueError when L is not a multiple of k."""
    k = wide_factor(name, model_cfg.n_layers)
    if k == 1:
        return
    m, a = model_cfg, model_cfg.attention
    if k < 1 or m.n_layers % k:
        raise ValueError(f"model {name!r}: n_layers={m.n_layers} is not a multiple of k={k}")
    a.head_dim = a.head_dim or m.d_model // a.n_heads
    a.n_heads *= k
    m.n_layers //= k
    m.ffn_mult *= k


def set_bow(model_cfg) -> None:
    """The bag-of-words control (in place): no mixer, no positions, MLP head of width d_model."""
    m = model_cfg
    m.mixer, m.pattern, m.n_layers, m.ffn_mult = "none", "bow", 0, 0
    m.positions, m.attention.positions = "none", "none"


def runs_regime(model: str, regime: str) -> bool:
    """Whether a grid cell runs: the controls run from scratch only (pretraining a model without
    mixing is not the question they answer)."""
    return model not in CONTROLS or regime == "scratch"


def add_mlpinit(config, *, task, steps: int, objective: str = "classify") -> None:
    """Sets `config` (unlocked) to the mlpinit regime: stages ("mlpinit", "finetune").

    Stage 1 copies the scratch stage (objective classify: batch, optimiser) or the pretrain stage
    (objective masked: the task's mask rate), runs `steps` steps with `bypass_mixers=True`;
    finetune keeps its budget and optimiser and loads all but the mixers (and the head, when the
    stage-1 head is not the task's).
    """
    if objective not in MLPINIT_OBJECTIVES:
        raise ValueError(f"mlpinit objective {objective!r} not in {MLPINIT_OBJECTIVES}")
    st = config.stages
    classify = objective == "classify"
    s = copy.deepcopy(st.scratch if classify else st.pretrain)
    s.num_steps = steps
    s.init_from = None
    s.dont_load = ()
    if classify:
        s.objective = objectives.objective_config(task.objective)
        s.best_metric, s.best_mode = "accuracy", "max"
    else:
        s.objective.kind, s.objective.mask_rate = "masked", task.mask_rate
        if task.target:
            s.objective.target = task.target
    # Stage 1's model is the full model with every sequence mixer replaced by a zero output.
    s.bypass_mixers = True
    st.mlpinit = s
    config.stage_order = ("mlpinit", "finetune")
    st.finetune.init_from = "mlpinit"
    st.finetune.dont_load = (MIXER_PATTERN,) + (() if classify else ("^head/",))
