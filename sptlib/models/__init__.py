"""Complete models: encoder -> backbone (stack of residual blocks) -> head.

`build_model(config.model, head_cfg)` returns a Linen module whose top-level parameter collections
are `encoder`, `backbone` and `head` (finetuning loads all but `head`).
"""

from sptlib.models.build import SequenceModel, build_model, layer_specs

__all__ = ["SequenceModel", "build_model", "layer_specs"]
