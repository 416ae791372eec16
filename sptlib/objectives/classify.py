"""Supervised objectives: sequence classification, retrieval (a pair of documents -> class) and
tagging (a class per scored position: the synthetic probes, `sptlib.data.probes`).

Classification and retrieval count one per example (`example_mask`); tagging one per scored
position (`targets >= 0` at a real position of a counted example). Metrics `"loss"` and
`"accuracy"` as `(sum, count)` pairs (tagging adds `"exact"`: examples with every scored position
right). `cfg.label_smoothing` smooths the cross-entropy's labels.
"""

import jax
import jax.numpy as jnp
import optax

from sptlib.objectives.base import Objective, apply_model, weighted_ce


def _ce_sums(logits, labels, w, label_smoothing):
    """`(loss_sum, correct_sum, correct [...])` of logits `[..., classes]`, int labels `[...]`
    and float weights `[...]`, with the labels smoothed by `label_smoothing`."""
    logits = logits.astype(jnp.float32)
    correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
    if label_smoothing > 0:
        soft = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1]), label_smoothing)
        ce = optax.softmax_cross_entropy(logits, soft)
        return jnp.sum(ce * w), jnp.sum(correct * w), correct
    loss_sum, correct_sum = weighted_ce(logits, labels, w)
    return loss_sum, correct_sum, correct


class Classification(Objective):
    kind = "classify"

    def __init__(self, cfg, info, model_cfg, mask_channel):
        del model_cfg  # the head's size comes from the task
        super().__init__(cfg, {"kind": self.kind, "num_classes": int(info["num_classes"])},
                         mask_channel)

    def _loss(self, apply_fn, variables, batch, example, mask_rng, dropout_rng, train):
        kwargs = self.init_inputs(batch)
        logits, new_state = apply_model(apply_fn, variables, kwargs, dropout_rng, train)
        labels = jnp.asarray(batch["label"]).astype(jnp.int32)
        w = example.astype(jnp.float32)
        loss_sum, correct, _ = _ce_sums(logits, labels, w, float(self.cfg.label_smoothing))
        count = jnp.sum(w)
        metrics = {"loss": (loss_sum, count), "accuracy": (correct, count)}
        return loss_sum / jnp.maximum(count, 1.0), metrics, new_state


class Retrieval(Classification):
    """Classification of a document pair (`inputs`/`mask` and `inputs2`/`mask2`)."""
    kind = "retrieval"

    def __init__(self, cfg, info, model_cfg, mask_channel):
        if not info.get("pair", False):
            raise ValueError("retrieval objective needs a paired task (task_info['pair'])")
        super().__init__(cfg, info, model_cfg, mask_channel)

    def _loss(self, apply_fn, variables, batch, *args):
        if "inputs2" not in batch:
            raise ValueError("retrieval objective needs batch['inputs2'] and batch['mask2']")
        return super()._loss(apply_fn, variables, batch, *args)


class Tagging(Objective):
    """Per-position classification: logits `[batch, length, num_classes]` (a `token_logits`
    head) scored where `batch["targets"]` (int `[batch, length]`, -1 = not scored) is a class.

    Metrics: `"loss"` and `"accuracy"` over the scored positions; `"exact"`: `(examples with
    every scored position right, examples with a scored position)`.
    """
    kind = "tagging"

    def __init__(self, cfg, info, model_cfg, mask_channel):
        del model_cfg  # the head's size comes from the task
        if not info.get("per_position", False):
            raise ValueError("tagging objective needs a per-position task "
                             "(task_info['per_position']: associative_recall, selective_copying)")
        super().__init__(cfg, {"kind": "token_logits", "num_outputs": int(info["num_classes"])},
                         mask_channel)

    def _loss(self, apply_fn, variables, batch, example, mask_rng, dropout_rng, train):
        if "targets" not in batch:
            raise ValueError("tagging objective needs batch['targets'] (int [batch, length], -1 "
                             "= not scored): a per-position task such as associative_recall")
        logits, new_state = apply_model(apply_fn, variables, self.init_inputs(batch),
                                        dropout_rng, train)
        targets = jnp.asarray(batch["targets"]).astype(jnp.int32)
        scored = (targets >= 0) & jnp.asarray(batch["mask"], bool) & example[:, None]
        w = scored.astype(jnp.float32)
        loss_sum, correct_sum, correct = _ce_sums(logits, jnp.maximum(targets, 0), w,
                                                  float(self.cfg.label_smoothing))
        count = jnp.sum(w)
        has = jnp.any(scored, axis=1)
        # An example is exact when no scored position is wrong.
        exact = has & ~jnp.any(scored & (correct == 0), axis=1)
        metrics = {"loss": (loss_sum, count), "accuracy": (correct_sum, count),
                   "exact": (jnp.sum(exact.astype(jnp.float32)),
                             jnp.sum(has.astype(jnp.float32)))}
        return loss_sum / jnp.maximum(count, 1.0), metrics, new_state
