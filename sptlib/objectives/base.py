"""The `Objective` interface, and what every objective shares: model inputs, the model call and
the weighted cross-entropy."""

import jax
import jax.numpy as jnp

from sptlib import vocab


def weighted_ce(logits, labels, weights):
    """Sum of cross-entropy and of correct argmax predictions, weighted.

    Args:
      logits: `[..., classes]`.
      labels: int `[...]`.
      weights: float `[...]` (0/1).

    Returns:
      `(loss_sum, correct_sum)` scalars.
    """
    logits = logits.astype(jnp.float32)
    # A one-hot product rather than a gather of the label's log-probability: the gather's
    # gradient is a scatter-add that XLA on TPU runs as a serial update of the whole
    # [..., classes] buffer (PathX causal pretraining, pixel256: 1.25 ms of a 26.7 ms step by
    # libtpu's cost model).
    logp = jax.nn.log_softmax(logits, axis=-1)
    ce = -jnp.sum(logp * jax.nn.one_hot(labels, logits.shape[-1], dtype=logp.dtype), axis=-1)
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return jnp.sum(ce * weights), jnp.sum(correct * weights)


def apply_model(apply_fn, variables, kwargs, rng, train):
    """Calls the model; returns `(outputs, new_model_state)`.

    In training, dropout draws from `rng` and every non-`params` collection (BatchNorm
    statistics) is mutable and returned updated; in evaluation the model state comes back as is.
    """
    model_state = {k: v for k, v in variables.items() if k != "params"}
    if train:
        mutable = list(model_state.keys())
        if not mutable:
            return apply_fn(variables, deterministic=False, rngs={"dropout": rng},
                            **kwargs), model_state
        out, new_state = apply_fn(variables, deterministic=False, rngs={"dropout": rng},
                                  mutable=mutable, **kwargs)
        return out, dict(new_state)
    return apply_fn(variables, deterministic=True, **kwargs), model_state


class Objective:
    """A training objective, built for one task and model by `sptlib.objectives.make_objective`.

    Attributes:
      kind: masked | causal | classify | retrieval | tagging.
      cfg: its config (`config.stages.<name>.objective`).
      head_cfg: the head it trains: the `head_cfg` of `sptlib.models.build_model`.
      mask_channel: continuous inputs get a mask-indicator channel appended (resolved from
        `config.model.mask_channel` when the objective config leaves it as None).
    """

    kind = ""

    def __init__(self, cfg, head_cfg, mask_channel: bool):
        self.cfg = cfg
        self.head_cfg = dict(head_cfg)
        self.mask_channel = bool(mask_channel)

    def model_inputs(self, inputs, masked=None):
        """Model inputs for `inputs` with positions `masked` (bool `[batch, length]`) masked.

        Token ids: masked ids → `<mask>`. Continuous `[batch, length, channels]`: masked values
        are zeroed, and with `mask_channel` the indicator channel is appended (1 = masked; all
        zeros when nothing is masked). With `masked=None` nothing is masked (the form used for
        classification and for model initialisation).
        """
        if jnp.issubdtype(inputs.dtype, jnp.integer):
            if masked is None:
                return inputs
            return jnp.where(masked, jnp.asarray(vocab.MASK_ID, inputs.dtype), inputs)
        if masked is None:
            masked = jnp.zeros(inputs.shape[:2], bool)
        x = jnp.where(masked[..., None], jnp.zeros_like(inputs), inputs)
        if self.mask_channel:
            x = jnp.concatenate([x, masked[..., None].astype(x.dtype)], axis=-1)
        return x

    def init_inputs(self, batch):
        """Keyword arguments of `model.init`/`model.apply` for a batch, without masking."""
        kw = {"inputs": self.model_inputs(jnp.asarray(batch["inputs"])),
              "mask": jnp.asarray(batch["mask"])}
        if "inputs2" in batch:
            kw["inputs2"] = self.model_inputs(jnp.asarray(batch["inputs2"]))
            kw["mask2"] = jnp.asarray(batch["mask2"])
        return kw

    def loss(self, apply_fn, variables, batch, rng, *, train):
        """Loss, metrics and updated model state for one batch.

        Args:
          apply_fn: `model.apply`.
          variables: `{"params": ..., **model_state}`.
          batch: dict of arrays (docs/architecture.md, "Batches").
          rng: PRNG key for masking and dropout.
          train: dropout on and model state (BatchNorm statistics) updated.

        Returns:
          `(loss, metrics, new_model_state)`: scalar loss (mean over counted positions or
          examples), `{"loss": (sum, count), ...}` (see each objective), and the model state
          after the step.
        """
        example = batch.get("example_mask")
        example = (jnp.ones(batch["mask"].shape[0], bool) if example is None
                   else jnp.asarray(example, bool))
        mask_rng, dropout_rng = jax.random.split(rng)
        return self._loss(apply_fn, variables, batch, example, mask_rng, dropout_rng, train)

    def _loss(self, apply_fn, variables, batch, example, mask_rng, dropout_rng, train):
        """`loss` given the example mask (bool `[batch]`) and the split keys."""
        raise NotImplementedError
