"""Complete models: encoder -> backbone (stack of residual blocks) -> head.

`build_model(config.model, head_cfg)` returns a Linen module whose top-level parameter collections
are `encoder`, `backbone` and `head` (finetuning loads all but `head`).
"""

from sptlib.models.build import SequenceModel, build_model, layer_specs
from sptlib.models.config import resolve_model_config

__all__ = ["SequenceModel", "build_model", "layer_specs", "resolve_model_config"]
