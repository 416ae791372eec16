"""Training objectives: masked denoising and causal SPT, classification, retrieval and tagging.

`make_objective(config.stages.<name>.objective, task_info, model_cfg)` builds the objective of
one stage: a `MaskedDenoising`, `CausalLM`, `Classification`, `Retrieval` or `Tagging`, with
its reconstruction target (`targets`), its model head (`objective.head_cfg`) and the
mask-indicator channel fixed when it is built. `objective.loss(...)` turns a batch
(docs/architecture.md, "Batches") into model inputs, calls the model and returns the loss with
summed metrics. Everything is shape-static and jit-able.

Counting rules (the whole point of getting SPT right):
- masked denoising counts only the masked positions (masks are drawn among real positions);
- causal LM counts position t when both t and t + 1 are real (the last position is ignored);
- classification / retrieval count one per example; tagging counts the scored positions
  (`targets >= 0`, per-position tasks such as the synthetic probes);
- padding never counts and examples with `example_mask == False` never count.
Metrics are `(sum, count)` pairs over the (global) batch, so the loop can aggregate them across
steps exactly; the loss used for the gradient is `sum / max(count, 1)`.

Continuous inputs (`inputs` float `[batch, length, channels]`): masked values are zeroed and, when
the model was built with `mask_channel`, a mask-indicator channel is appended (1 = masked). The
channel is appended in every objective (all zeros when nothing is masked, e.g. in finetuning), so
an encoder trained with it transfers unchanged.
"""

import ml_collections

from sptlib.objectives.base import Objective
from sptlib.objectives.classify import Classification, Retrieval, Tagging
from sptlib.objectives.spt import CausalLM, MaskedDenoising, span_mask
from sptlib.objectives.targets import TARGETS

OBJECTIVES = {"masked": MaskedDenoising, "causal": CausalLM, "classify": Classification,
              "retrieval": Retrieval, "tagging": Tagging}
KINDS = tuple(OBJECTIVES)

__all__ = ["KINDS", "OBJECTIVES", "TARGETS", "CausalLM", "Classification", "MaskedDenoising",
           "Objective", "Retrieval", "Tagging", "make_objective", "objective_config", "span_mask"]


def objective_config(kind="classify"):
    """Returns the default `config.stages.<name>.objective` for `kind`.

    Args:
      kind: masked | causal | classify | retrieval | tagging.
    """
    if kind not in KINDS:
        raise ValueError(f"Unknown objective kind {kind!r}; expected one of {KINDS}")
    c = ml_collections.ConfigDict()
    # masked | causal | classify | retrieval | tagging (a class per scored position).
    c.kind = kind
    # Masked SPT: fraction of real positions masked. The paper's per-task rates are set by the
    # experiment presets (sptlib/configs/paper.py, TaskSpec.mask_rate).
    c.mask_rate = 0.15
    # Mean length of masked spans; 1 = each position masked independently.
    c.span_length = 1
    # Reconstruction target: auto (tokens for token inputs, pixel256 for continuous) | tokens |
    # pixel256 (256-way CE over `raw` pixel values) | l1 (L1 on the normalised inputs).
    c.target = "auto"
    # Append a mask-indicator channel to continuous inputs. None = follow `model.mask_channel`
    # (resolved by `make_objective` from the model config).
    c.mask_channel = ml_collections.FieldReference(None, field_type=bool)
    # Label smoothing of the classification / retrieval / tagging cross-entropy.
    c.label_smoothing = 0.0
    # Seed of the evaluation masks: evaluation of masked SPT uses masks that depend only on this
    # seed and the batch contents, so every checkpoint is scored on the same masked positions.
    c.eval_seed = 0
    return c


def make_objective(cfg, info, model_cfg=None) -> Objective:
    """The objective of `cfg` for a task and model.

    Args:
      cfg: `config.stages.<name>.objective` (`objective_config`).
      info: the task's `info` (input_type, vocab_size, num_classes, pair).
      model_cfg: `config.model` with the data-dependent fields filled in
        (`sptlib.models.resolve_model_config`), or None (= defaults): its `mask_channel` applies
        when `cfg.mask_channel` is None, and its `vocab_size` (when set) sizes a token head.
    """
    if cfg.kind not in KINDS:
        raise ValueError(f"Unknown objective kind {cfg.kind!r}; expected one of {KINDS}")
    if cfg.target not in TARGETS:
        raise ValueError(f"Unknown objective target {cfg.target!r}; expected one of {TARGETS}")
    model_cfg = {} if model_cfg is None else model_cfg
    mask_channel = cfg.mask_channel
    if mask_channel is None:
        mask_channel = bool(model_cfg.get("mask_channel", False))
    return OBJECTIVES[cfg.kind](cfg, info, model_cfg, mask_channel)
