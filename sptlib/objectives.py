"""Training objectives: masked denoising and causal SPT, classification and retrieval.

An `Objective` turns a batch (docs/architecture.md, "Batches") into model inputs, calls the
model and returns the loss with summed metrics. Everything here is shape-static and jit-able.

Counting rules (the whole point of getting SPT right):
- masked denoising counts only the masked positions (masks are drawn among real positions);
- causal LM counts position t when both t and t + 1 are real (the last position is ignored);
- classification / retrieval count one per example;
- padding never counts and examples with `example_mask == False` never count.
Metrics are `(sum, count)` pairs over the (global) batch, so the loop can aggregate them across
steps exactly; the loss used for the gradient is `sum / max(count, 1)`.

Continuous inputs (`inputs` float `[batch, length, channels]`): masked values are zeroed and, when
the model was built with `mask_channel`, a mask-indicator channel is appended (1 = masked). The
channel is appended in every objective (all zeros when nothing is masked, e.g. in finetuning), so
an encoder trained with it transfers unchanged.
"""

import jax
import jax.numpy as jnp
import ml_collections
import optax

from sptlib import vocab

KINDS = ("masked", "causal", "classify", "retrieval")
TARGETS = ("auto", "tokens", "pixel256", "l1")


def objective_config(kind="classify"):
    """Returns the default `config.stages.<name>.objective` for `kind`.

    Args:
      kind: masked | causal | classify | retrieval.
    """
    if kind not in KINDS:
        raise ValueError(f"Unknown objective kind {kind!r}; expected one of {KINDS}")
    c = ml_collections.ConfigDict()
    # masked | causal | classify | retrieval.
    c.kind = kind
    # Masked SPT: fraction of real positions masked. The paper's per-task rates are set by the
    # experiment presets (sptlib/paper_presets.py, TaskSpec.mask_rate).
    c.mask_rate = 0.15
    # Mean length of masked spans; 1 = each position masked independently.
    c.span_length = 1
    # Reconstruction target: auto (tokens for token inputs, pixel256 for continuous) | tokens |
    # pixel256 (256-way CE over `raw` pixel values) | l1 (L1 on the normalised inputs).
    c.target = "auto"
    # Append a mask-indicator channel to continuous inputs. None = follow `model.mask_channel`
    # (taken from the model config given to `Objective.head`).
    c.mask_channel = ml_collections.FieldReference(None, field_type=bool)
    # Label smoothing of the classification / retrieval cross-entropy.
    c.label_smoothing = 0.0
    # Seed of the evaluation masks: evaluation of masked SPT uses masks that depend only on this
    # seed and the batch contents, so every checkpoint is scored on the same masked positions.
    c.eval_seed = 0
    return c


def _weighted_ce(logits, labels, weights):
    """Sum of cross-entropy and of correct argmax predictions, weighted.

    Args:
      logits: `[..., classes]`.
      labels: int `[...]`.
      weights: float `[...]` (0/1).

    Returns:
      `(loss_sum, correct_sum)` scalars.
    """
    logits = logits.astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return jnp.sum(ce * weights), jnp.sum(correct * weights)


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


class Objective:
    """A training objective (made by `get_objective`).

    Attributes:
      kind: masked | causal | classify | retrieval.
      cfg: its config.
    """

    def __init__(self, cfg):
        if cfg.kind not in KINDS:
            raise ValueError(f"Unknown objective kind {cfg.kind!r}; expected one of {KINDS}")
        if cfg.target not in TARGETS:
            raise ValueError(f"Unknown objective target {cfg.target!r}; expected one of {TARGETS}")
        self.kind = cfg.kind
        self.cfg = cfg
        self.mask_channel = cfg.mask_channel

    # ---------------------------------------------------------------- heads
    def target(self, input_type):
        """The reconstruction target for `input_type` (tokens | continuous)."""
        t = self.cfg.target
        if input_type == "tokens":
            if t not in ("auto", "tokens"):
                raise ValueError(f"target {t!r} needs continuous inputs; token inputs use 'tokens'")
            return "tokens"
        if t == "tokens":
            raise ValueError("target 'tokens' needs token inputs; continuous inputs use "
                             "pixel256 or l1")
        return "pixel256" if t == "auto" else t

    def head(self, task_info, model_cfg):
        """The `head_cfg` for `sptlib.models.build_model` for this objective and task.

        Also fixes `self.mask_channel` from `model_cfg.mask_channel` when the objective config
        leaves it as None.
        """
        if self.mask_channel is None:
            self.mask_channel = bool(model_cfg.get("mask_channel", False))
        if self.kind in ("classify", "retrieval"):
            if self.kind == "retrieval" and not task_info.get("pair", False):
                raise ValueError("retrieval objective needs a paired task (task_info['pair'])")
            return {"kind": self.kind, "num_classes": int(task_info["num_classes"])}
        target = self.target(task_info.get("input_type", "tokens"))
        if target == "tokens":
            vocab_size = int(model_cfg.get("vocab_size", 0) or task_info["vocab_size"])
            return {"kind": "token_logits", "num_outputs": vocab_size}
        if target == "pixel256":
            return {"kind": "pixel_logits"}
        return {"kind": "regress"}

    # ---------------------------------------------------------------- inputs
    def _continuous(self, x, masked):
        """Zeroes masked values and appends the indicator channel if configured.

        Args:
          x: float `[batch, length, channels]`.
          masked: bool `[batch, length]` or None (nothing masked).
        """
        if self.mask_channel is None:
            raise ValueError("Objective.mask_channel is unknown for continuous inputs: call "
                             "objective.head(task_info, model_cfg) first or set "
                             "objective.mask_channel")
        if masked is None:
            masked = jnp.zeros(x.shape[:2], bool)
        x = jnp.where(masked[..., None], jnp.zeros_like(x), x)
        if self.mask_channel:
            x = jnp.concatenate([x, masked[..., None].astype(x.dtype)], axis=-1)
        return x

    def model_inputs(self, inputs, masked=None):
        """Model inputs for `inputs` with positions `masked` (bool `[batch, length]`) masked.

        Token ids: masked ids → `<mask>`. Continuous: see `_continuous`. With `masked=None`
        nothing is masked (the form used for classification and for model initialisation).
        """
        if jnp.issubdtype(inputs.dtype, jnp.integer):
            if masked is None:
                return inputs
            return jnp.where(masked, jnp.asarray(vocab.MASK_ID, inputs.dtype), inputs)
        return self._continuous(inputs, masked)

    def init_inputs(self, batch):
        """Keyword arguments of `model.init`/`model.apply` for a batch, without masking."""
        kw = {"inputs": self.model_inputs(jnp.asarray(batch["inputs"])),
              "mask": jnp.asarray(batch["mask"])}
        if "inputs2" in batch:
            kw["inputs2"] = self.model_inputs(jnp.asarray(batch["inputs2"]))
            kw["mask2"] = jnp.asarray(batch["mask2"])
        return kw

    # ---------------------------------------------------------------- loss
    def _eval_key(self, batch):
        """A key that depends only on the eval seed and the batch contents."""
        x = batch["inputs"]
        x = x.astype(jnp.int32) if jnp.issubdtype(x.dtype, jnp.integer) else (
            jnp.round(x * 255.0).astype(jnp.int32))
        flat = x.reshape(x.shape[0], -1)
        weights = jnp.arange(1, flat.shape[1] + 1, dtype=jnp.uint32)
        digest = jnp.sum(flat.astype(jnp.uint32) * weights, dtype=jnp.uint32)
        return jax.random.fold_in(jax.random.PRNGKey(self.cfg.eval_seed), digest)

    def _apply(self, apply_fn, variables, kwargs, rng, train):
        """Calls the model; returns (outputs, new_model_state)."""
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

    def loss(self, apply_fn, variables, batch, rng, *, train):
        """Loss, metrics and updated model state for one batch.

        Args:
          apply_fn: `model.apply`.
          variables: `{"params": ..., **model_state}`.
          batch: dict of arrays (docs/architecture.md). For masked / causal SPT on a paired
            (retrieval) batch, `inputs2` are treated as further sequences.
          rng: PRNG key for masking and dropout (masked SPT evaluation, `train=False`, ignores it
            and uses masks fixed by `eval_seed` and the batch).
          train: dropout on and model state (BatchNorm statistics) updated.

        Returns:
          `(loss, metrics, new_model_state)`: scalar loss (mean over counted positions),
          `{"loss": (sum, count), "accuracy": (sum, count)}` (no accuracy for the L1 target; a
          masked objective also reports `"masked_fraction": (masked, real)`), and the model
          state after the step.
        """
        example = batch.get("example_mask")
        example = (jnp.ones(batch["mask"].shape[0], bool) if example is None
                   else jnp.asarray(example, bool))
        mask_rng, dropout_rng = jax.random.split(rng)
        if self.kind in ("classify", "retrieval"):
            return self._classify(apply_fn, variables, batch, example, dropout_rng, train)
        if "inputs2" in batch:
            # SPT on a paired task: both documents are training sequences.
            batch = {"inputs": jnp.concatenate([batch["inputs"], batch["inputs2"]]),
                     "mask": jnp.concatenate([batch["mask"], batch["mask2"]])}
            example = jnp.concatenate([example, example])
        real = jnp.asarray(batch["mask"], bool) & example[:, None]
        inputs = jnp.asarray(batch["inputs"])
        continuous = not jnp.issubdtype(inputs.dtype, jnp.integer)
        target_kind = self.target("continuous" if continuous else "tokens")
        metrics = {}
        if self.kind == "masked":
            if not train:
                mask_rng = self._eval_key(batch)
            masked = span_mask(mask_rng, real, self.cfg.mask_rate, self.cfg.span_length)
            kwargs = {"inputs": self.model_inputs(inputs, masked), "mask": batch["mask"]}
            out, new_state = self._apply(apply_fn, variables, kwargs, dropout_rng, train)
            weights = masked
            targets = self._targets(batch, target_kind, shift=False)
            metrics["masked_fraction"] = (jnp.sum(masked.astype(jnp.float32)),
                                          jnp.sum(real.astype(jnp.float32)))
        else:  # causal: position t predicts t + 1; the last position has no target.
            kwargs = {"inputs": self.model_inputs(inputs), "mask": batch["mask"]}
            out, new_state = self._apply(apply_fn, variables, kwargs, dropout_rng, train)
            out = out[:, :-1]
            weights = real[:, :-1] & real[:, 1:]
            targets = self._targets(batch, target_kind, shift=True)
        loss_sum, count, correct = self._reconstruction(out, targets, weights, target_kind)
        metrics["loss"] = (loss_sum, count)
        if self.kind == "causal" and target_kind == "tokens":
            # Language modelling: the same sum in bits (bits per byte for byte tokens;
            # perplexity = 2 ** bits_per_token for subwords).
            metrics["bits_per_token"] = (loss_sum / jnp.log(2.0), count)
        if correct is not None:
            metrics["accuracy"] = (correct, count)
        loss = loss_sum / jnp.maximum(count, 1.0)
        return loss, metrics, new_state

    def _targets(self, batch, target_kind, shift):
        if target_kind == "tokens":
            t = jnp.asarray(batch["inputs"])
        elif target_kind == "pixel256":
            if "raw" not in batch:
                raise ValueError("target 'pixel256' needs batch['raw'] (pixel values 0-255)")
            t = jnp.asarray(batch["raw"]).astype(jnp.int32)
        else:
            t = jnp.asarray(batch["inputs"]).astype(jnp.float32)
        return t[:, 1:] if shift else t

    @staticmethod
    def _reconstruction(out, targets, weights, target_kind):
        """Summed loss, count and correct predictions over the weighted positions.

        Args:
          out: model output at the predicting positions: `[batch, length, vocab]` (tokens),
            `[batch, length, channels, 256]` (pixel256) or `[batch, length, channels]` (l1).
          targets: `[batch, length]` ids, or `[batch, length, channels]` pixels / values.
          weights: bool `[batch, length]`.
        """
        w = weights.astype(jnp.float32)
        if target_kind == "tokens":
            loss_sum, correct = _weighted_ce(out, targets, w)
            return loss_sum, jnp.sum(w), correct
        # Continuous targets count every (position, channel) pair.
        channels = targets.shape[-1]
        wc = jnp.broadcast_to(w[..., None], targets.shape)
        count = jnp.sum(w) * channels
        if target_kind == "pixel256":
            loss_sum, correct = _weighted_ce(out, targets, wc)
            return loss_sum, count, correct
        err = jnp.abs(out.astype(jnp.float32) - targets)
        return jnp.sum(err * wc), count, None

    def _classify(self, apply_fn, variables, batch, example, rng, train):
        kwargs = self.init_inputs(batch)
        if self.kind == "retrieval" and "inputs2" not in kwargs:
            raise ValueError("retrieval objective needs batch['inputs2'] and batch['mask2']")
        logits, new_state = self._apply(apply_fn, variables, kwargs, rng, train)
        labels = jnp.asarray(batch["label"]).astype(jnp.int32)
        w = example.astype(jnp.float32)
        logits = logits.astype(jnp.float32)
        ls = float(self.cfg.label_smoothing)
        if ls > 0:
            n = logits.shape[-1]
            soft = optax.smooth_labels(jax.nn.one_hot(labels, n), ls)
            ce = optax.softmax_cross_entropy(logits, soft)
            loss_sum = jnp.sum(ce * w)
            correct = jnp.sum((jnp.argmax(logits, -1) == labels).astype(jnp.float32) * w)
        else:
            loss_sum, correct = _weighted_ce(logits, labels, w)
        count = jnp.sum(w)
        metrics = {"loss": (loss_sum, count), "accuracy": (correct, count)}
        return loss_sum / jnp.maximum(count, 1.0), metrics, new_state


def get_objective(cfg):
    """Makes the `Objective` of an objective config."""
    return Objective(cfg)
