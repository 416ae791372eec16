"""Self-pretraining objectives: masked denoising and causal (next-position) prediction.

Both reconstruct a `sptlib.objectives.targets.Target` at the counted positions: masked
denoising counts only the masked positions (masks are drawn among real positions); causal
prediction counts position t when both t and t + 1 are real (the last position is ignored). On a
paired (retrieval) batch both documents are training sequences.
"""

import jax
import jax.numpy as jnp

from sptlib.objectives.base import Objective, apply_model
from sptlib.objectives.targets import make_target


def span_mask(rng, real, rate, span_length):
    """Draws the positions to mask.

    Spans start independently with probability `rate / span_length` at real positions and cover
    `span_length` positions, so the masked fraction is ≈ `rate` (exactly Bernoulli(`rate`) for
    `span_length == 1`). Spans are cut at padding.

    Args:
      rng: PRNG key.
      real: bool `[batch, length]`, True at real positions.
      rate: masking rate in [0, 1].
      span_length: int >= 1.

    Returns:
      bool `[batch, length]`, True at masked positions (always a subset of `real`).
    """
    span_length = int(span_length)
    if span_length <= 1:
        return jax.random.bernoulli(rng, rate, real.shape) & real
    starts = jax.random.bernoulli(rng, rate / span_length, real.shape) & real
    # Position i is masked when a span starts at one of i - span_length + 1 .. i.
    counts = jnp.cumsum(starts.astype(jnp.int32), axis=1)
    shifted = jnp.pad(counts, ((0, 0), (span_length, 0)))[:, :real.shape[1]]
    return (counts - shifted > 0) & real


class _Reconstruction(Objective):
    """SPT: predicts `self.target` at the positions `_predict` weights.

    Metrics: `"loss": (sum, count)` and, except for the L1 target, `"accuracy": (correct, count)`.
    """

    def __init__(self, cfg, info, model_cfg, mask_channel):
        target = make_target(cfg.target, info, model_cfg)
        super().__init__(cfg, target.head_cfg, mask_channel)
        self.target = target

    def _loss(self, apply_fn, variables, batch, example, mask_rng, dropout_rng, train):
        if "inputs2" in batch:
            # SPT on a paired task: both documents are training sequences.
            batch = {"inputs": jnp.concatenate([batch["inputs"], batch["inputs2"]]),
                     "mask": jnp.concatenate([batch["mask"], batch["mask2"]])}
            example = jnp.concatenate([example, example])
        real = jnp.asarray(batch["mask"], bool) & example[:, None]
        inputs = jnp.asarray(batch["inputs"])
        if jnp.issubdtype(inputs.dtype, jnp.integer) == self.target.continuous:
            raise ValueError(f"{self.kind} objective with target {self.target.name!r} got "
                             f"inputs of dtype {inputs.dtype}")
        out, new_state, weights, targets, metrics = self._predict(
            apply_fn, variables, batch, inputs, real, mask_rng, dropout_rng, train)
        loss_sum, count, correct = self.target.score(out, targets, weights)
        metrics["loss"] = (loss_sum, count)
        if correct is not None:
            metrics["accuracy"] = (correct, count)
        return loss_sum / jnp.maximum(count, 1.0), metrics, new_state

    def _predict(self, apply_fn, variables, batch, inputs, real, mask_rng, dropout_rng, train):
        """`(outputs, new_model_state, weights [batch, length'], targets, metrics)` with the
        outputs and targets at the `length'` predicting positions."""
        raise NotImplementedError


class MaskedDenoising(_Reconstruction):
    """Masked SPT: `mask_rate` of the real positions (spans of mean `span_length`) are masked
    and reconstructed. Also reports `"masked_fraction": (masked, real)`.

    Evaluation (`train=False`) ignores the key: its masks depend only on `cfg.eval_seed` and the
    batch contents, so every checkpoint is scored on the same masked positions.
    """
    kind = "masked"

    def eval_key(self, batch):
        """The evaluation masks' key: depends only on `cfg.eval_seed` and the batch contents
        (`span_mask(eval_key(batch), real, mask_rate, span_length)` are the masks scored)."""
        x = batch["inputs"]
        x = x.astype(jnp.int32) if jnp.issubdtype(x.dtype, jnp.integer) else (
            jnp.round(x * 255.0).astype(jnp.int32))
        flat = x.reshape(x.shape[0], -1)
        weights = jnp.arange(1, flat.shape[1] + 1, dtype=jnp.uint32)
        digest = jnp.sum(flat.astype(jnp.uint32) * weights, dtype=jnp.uint32)
        return jax.random.fold_in(jax.random.PRNGKey(self.cfg.eval_seed), digest)

    def _predict(self, apply_fn, variables, batch, inputs, real, mask_rng, dropout_rng, train):
        if not train:
            mask_rng = self.eval_key(batch)
        masked = span_mask(mask_rng, real, self.cfg.mask_rate, self.cfg.span_length)
        kwargs = {"inputs": self.model_inputs(inputs, masked), "mask": batch["mask"]}
        out, new_state = apply_model(apply_fn, variables, kwargs, dropout_rng, train)
        metrics = {"masked_fraction": (jnp.sum(masked.astype(jnp.float32)),
                                       jnp.sum(real.astype(jnp.float32)))}
        return out, new_state, masked, self.target.values(batch), metrics


class CausalLM(_Reconstruction):
    """Causal SPT / language modelling: position t predicts t + 1 (nothing is masked). With token
    targets it also reports `"bits_per_token"` (bits per byte for byte tokens; perplexity =
    2 ** bits_per_token for subwords)."""
    kind = "causal"

    def _predict(self, apply_fn, variables, batch, inputs, real, mask_rng, dropout_rng, train):
        kwargs = {"inputs": self.model_inputs(inputs), "mask": batch["mask"]}
        out, new_state = apply_model(apply_fn, variables, kwargs, dropout_rng, train)
        weights = real[:, :-1] & real[:, 1:]  # the last position has no target
        return out[:, :-1], new_state, weights, self.target.values(batch)[:, 1:], {}

    def _loss(self, *args):
        loss, metrics, new_state = super()._loss(*args)
        if not self.target.continuous:
            loss_sum, count = metrics["loss"]
            metrics["bits_per_token"] = (loss_sum / jnp.log(2.0), count)
        return loss, metrics, new_state
