"""The training state carried through `jax.jit` train steps and saved in checkpoints."""

from typing import Any

import flax


@flax.struct.dataclass
class TrainState:
    """Everything a train step reads and writes.

    Attributes:
      step: int32 scalar, number of optimizer updates applied so far.
      params: the model's `params` collection (plain arrays, already unboxed from their
        logical-partitioning metadata), top-level keys `encoder`, `backbone`, `head`.
      opt_state: the optax state of `sptlib.train.optim.make_optimizer`.
      model_state: non-trainable collections updated in training (e.g. BatchNorm's
        `{"batch_stats": ...}`); `{}` for models without any.
      rng: uint32 `[2]` raw PRNG key; per-step keys are `fold_in(rng, step)`, so the stream is
        reproducible across restarts without saving anything else.
    """
    step: Any
    params: Any
    opt_state: Any
    model_state: Any
    rng: Any
